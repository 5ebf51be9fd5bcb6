"""The deployed gateways learn their pools from the worker pods' labels
(``--pools-from=kubernetes``): they may get, list and watch the pods of their namespace
(a Role bound to their service account, nothing more), their token is mounted, their
namespace comes from the downward API, and their selector and worker port name the worker
pods as the worker Deployments make them. docs/deploy.md, "Roles are labels"."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.deploy.test_manifests import (
    TARGETS,
    by_kind,
    expand,
    needs_kubectl,
    render,
    workers,
)


def gateway_pod(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    spec: dict[str, Any] = by_kind(objects, "Deployment")["goodput-gateway"]["spec"]["template"]
    return spec


def option(args: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(f"--{name}=")]
    return value


@needs_kubectl
@pytest.mark.parametrize("target", TARGETS)
def test_gateways_watch_the_worker_pods_of_their_namespace(target: str) -> None:
    objects = render(target)
    pod = gateway_pod(objects)["spec"]
    container = pod["containers"][0]
    args = list(expand(container, objects))
    assert option(args, "pools-from") == "kubernetes"
    assert option(container["args"], "kubernetes-namespace") == "$(POD_NAMESPACE)"
    env = {v["name"]: v for v in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert pod["serviceAccountName"] == "goodput-gateway"
    assert pod["automountServiceAccountToken"] is True
    # The selector picks every worker pod, and the port is the one they serve on.
    selector = dict(term.split("=", 1) for term in option(args, "kubernetes-selector").split(","))
    port = int(option(args, "worker-port"))
    deployments = workers(objects)
    assert deployments
    for deployment in deployments:
        template = deployment["spec"]["template"]
        assert selector.items() <= template["metadata"]["labels"].items()
        ports = {p["name"]: p["containerPort"] for p in template["spec"]["containers"][0]["ports"]}
        assert ports["http"] == port


@needs_kubectl
@pytest.mark.parametrize("target", TARGETS)
def test_the_gateway_may_get_list_and_watch_pods_and_nothing_else(target: str) -> None:
    objects = render(target)
    namespace = by_kind(objects, "Deployment")["goodput-gateway"]["metadata"].get("namespace")
    binding = by_kind(objects, "RoleBinding")["goodput-gateway"]
    assert binding["metadata"].get("namespace") == namespace
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "goodput-gateway"}  # fmt: skip
    (subject,) = binding["subjects"]
    assert (subject["kind"], subject["name"]) == ("ServiceAccount", "goodput-gateway")
    assert subject.get("namespace") == namespace
    role = by_kind(objects, "Role")["goodput-gateway"]
    assert role["metadata"].get("namespace") == namespace
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    ]
    assert "ClusterRoleBinding" not in {o["kind"] for o in objects}
