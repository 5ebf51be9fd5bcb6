"""The deployed workers relabel their own pods on a planner move and fail readiness while
drained (docs/deploy.md, "Roles are labels"): they may get and patch the pods of their
namespace (a Role bound to their service account, nothing more), their token is mounted,
their pod name and namespace come from the downward API, and the readinessProbe is the
worker's ``/ready`` on the port ``--ready-port`` names, while liveness stays on the engine's
``/health``. The dev overlay's sim workers run the same options as the vLLM workers of the
base and production."""

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


def flags(args: list[str]) -> dict[str, str]:
    """``--name=value`` → ``{"--name": "value"}``; a bare ``--flag`` maps to ``""``."""
    out = {}
    for arg in args:
        if arg.startswith("--"):
            name, _, value = arg.partition("=")
            out[name] = value
    return out


@needs_kubectl
@pytest.mark.parametrize("target", TARGETS)
def test_workers_may_get_and_patch_pods_and_nothing_else(target: str) -> None:
    objects = render(target)
    namespace = workers(objects)[0]["metadata"].get("namespace")
    binding = by_kind(objects, "RoleBinding")["goodput-worker"]
    assert binding["metadata"].get("namespace") == namespace
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "goodput-worker"}  # fmt: skip
    (subject,) = binding["subjects"]
    assert (subject["kind"], subject["name"]) == ("ServiceAccount", "goodput-worker")
    assert subject.get("namespace") == namespace
    role = by_kind(objects, "Role")["goodput-worker"]
    assert role["metadata"].get("namespace") == namespace
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]
    account = by_kind(objects, "ServiceAccount")["goodput-worker"]
    assert account.get("automountServiceAccountToken") is False  # only where the pod asks
    for deployment in workers(objects):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "goodput-worker"
        assert pod["automountServiceAccountToken"] is True
    assert "ClusterRoleBinding" not in {o["kind"] for o in objects}


@needs_kubectl
@pytest.mark.parametrize("target", TARGETS)
def test_workers_relabel_their_pod_and_probe_readiness_on_ready(target: str) -> None:
    objects = render(target)
    for deployment in workers(objects):
        container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
        args = flags(container["args"])
        assert "--kubernetes-relabel" in args
        assert "--kubernetes-api" not in args  # in-cluster: the mounted token and CA
        assert (args["--pod-name"], args["--pod-namespace"]) == ("$(POD_NAME)", "$(POD_NAMESPACE)")
        env = {v["name"]: v["valueFrom"]["fieldRef"]["fieldPath"]
               for v in container["env"] if "fieldRef" in v.get("valueFrom", {})}  # fmt: skip
        assert (env["POD_NAME"], env["POD_NAMESPACE"]) == ("metadata.name", "metadata.namespace")
        expand(container, objects)  # every $(VAR) is defined
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports["ready"] == int(args["--ready-port"]) != ports["http"]
        ready = container["readinessProbe"]
        assert ready["httpGet"] == {"path": "/ready", "port": "ready"}
        assert ready["periodSeconds"] * ready["failureThreshold"] <= 4  # a drain shows quickly
        for kind in ("startupProbe", "livenessProbe"):  # a drained worker is not killed
            assert container[kind]["httpGet"] == {"path": "/health", "port": "http"}


@needs_kubectl
@pytest.mark.parametrize(("target", "engine"), [
    ("base", "vllm"), ("overlays/production", "vllm"), ("overlays/dev", "sim"),
])  # fmt: skip
def test_the_workers_engine(target: str, engine: str) -> None:
    """The dev overlay's workers, checked above like the others, are the sim ones."""
    for deployment in workers(render(target)):
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert flags(container["args"])["--engine"] == engine
