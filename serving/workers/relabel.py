"""``set_role`` on Kubernetes: the worker relabels its own pod.

On Kubernetes the gateways take their pools from the worker pods' ``goodput.dev/role``
label (docs/deploy.md, "Roles are labels"), so a role change the control plane's planner
sends (``set_role``) must change that label. The worker does it itself, with its own
service account (``get`` and ``patch`` on pods), so the control plane needs no Kubernetes
rights:

* :class:`PodRelabeler` sends a JSON merge patch
  ``{"metadata":{"labels":{"goodput.dev/role":ROLE}}}`` (``application/merge-patch+json``)
  to ``/api/v1/namespaces/NS/pods/NAME``. A network error, a 429 or a 5xx is retried
  ``attempts`` times in all (backoff doubling from ``backoff_s``); any other refusal (403:
  no right, 404: no such pod, 422) is not. A failure raises
  :class:`~serving.kubernetes_api.KubernetesError` naming the API server's reason (its
  ``Status`` message, e.g. ``pods "w-1" is forbidden: ...``).
* :func:`relabelling` wraps a worker's ``apply``: ``set_role`` patches first and changes
  the reported role only once the patch succeeded, so the command's acknowledgement is
  ``ok`` only for a pod that is relabelled, and a refused patch acknowledges it failed
  with the reason (:class:`~serving.workers.commands.CommandExecutor`). Other commands pass
  through.
* :func:`pod_relabeler` builds the relabeler from the worker's options (``--kubernetes-relabel``
  with ``--pod-name``, ``--pod-namespace``, ``--kubernetes-api``), for both engines.

Example::

    relabeler = PodRelabeler(KubernetesAPI.in_cluster(), namespace="goodput", pod="w-1")
    agent = Agent(settings, report=worker.report, apply=relabelling(worker.apply_command,
                                                                    relabeler))
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from typing import Any

import httpx

from exporters.commands import CommandKind
from exporters.fleet import PoolRole
from serving.kubernetes_api import (
    ROLE_LABEL,
    KubernetesAPI,
    KubernetesError,
    in_cluster_namespace,
)
from serving.workers.commands import ApplyFn

__all__ = ["MERGE_PATCH", "PodRelabeler", "pod_relabeler", "relabelling"]

logger = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"


class PodRelabeler:
    """Sets the role label of one pod (see the module docstring). ``transport`` replaces
    httpx's network transport (tests)."""

    def __init__(
        self,
        api: KubernetesAPI,
        *,
        namespace: str,
        pod: str,
        timeout_s: float = 5.0,
        attempts: int = 3,
        backoff_s: float = 0.5,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not namespace or not pod:
            raise ValueError(
                f"namespace and pod must be non-empty, got {namespace!r} and {pod!r} "
                "(POD_NAMESPACE and POD_NAME from the downward API)"
            )
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self.api = api
        self.namespace = namespace
        self.pod = pod
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.path = f"/api/v1/namespaces/{namespace}/pods/{pod}"
        self._client = httpx.Client(
            base_url=api.url.rstrip("/"), timeout=timeout_s, transport=transport,
            verify=api.verify(),
        )  # fmt: skip
        self.num_patches = 0

    def close(self) -> None:
        self._client.close()

    def set_role(self, role: PoolRole) -> None:
        """Patch the pod's role label to ``role``; raises :class:`KubernetesError` with the
        API server's reason when it cannot."""
        body = json.dumps({"metadata": {"labels": {ROLE_LABEL: PoolRole(role).value}}})
        what = f"PATCH {self.path} ({ROLE_LABEL}={PoolRole(role).value})"
        delay_s = self.backoff_s
        for attempt in range(1, self.attempts + 1):
            try:
                headers = {"Content-Type": MERGE_PATCH, **self.api.headers()}
                response = self._client.patch(self.path, content=body, headers=headers)
            except httpx.HTTPError as exc:
                error = KubernetesError(f"{what} failed: {type(exc).__name__}: {exc}")
            else:
                if response.is_success:
                    self.num_patches += 1
                    return
                error = KubernetesError(
                    f"{what} answered HTTP {response.status_code}: {_reason(response)}"
                )
                if response.status_code != 429 and response.status_code < 500:
                    raise error  # a missing right or pod: retrying will not help
            if attempt == self.attempts:
                raise error
            logger.warning("%s; retrying in %.1fs", error, delay_s)
            time.sleep(delay_s)
            delay_s *= 2
        raise AssertionError("unreachable")


def _reason(response: httpx.Response) -> str:
    """The ``Status`` message (``pods "w-1" is forbidden: ...``), else the body's start."""
    try:
        status = response.json()
    except ValueError:
        status = None
    if isinstance(status, Mapping):
        message, reason = status.get("message"), status.get("reason")
        if isinstance(message, str) and message:
            return f"{message} ({reason})" if isinstance(reason, str) and reason else message
        if isinstance(reason, str) and reason:
            return reason
    return response.text[:300]


def relabelling(apply: ApplyFn, relabeler: PodRelabeler) -> ApplyFn:
    """``apply`` with ``set_role`` relabelling the pod first (see the module docstring)."""

    def apply_relabelled(kind: CommandKind, payload: Mapping[str, Any]) -> str:
        if kind is CommandKind.SET_ROLE:
            role = PoolRole(payload["role"])  # refused before the patch when invalid
            relabeler.set_role(role)
            detail = apply(kind, payload)
            return f"{detail}; pod {relabeler.pod} labelled {ROLE_LABEL}={role.value}"
        return apply(kind, payload)

    return apply_relabelled


def pod_relabeler(
    *, control_plane: str | None, pod_name: str, pod_namespace: str, api_url: str | None
) -> PodRelabeler:
    """The relabeler of ``--kubernetes-relabel``: the pod ``pod_name`` in ``pod_namespace``
    (default: the service account's), through ``api_url`` without a token or else the
    in-cluster API server. Raises :class:`ValueError` or :class:`KubernetesError` naming
    the option that is missing or wrong."""
    if not control_plane:
        raise ValueError("--kubernetes-relabel needs --control-plane (set_role comes from it)")
    if not pod_name:
        raise ValueError("--kubernetes-relabel needs --pod-name (or POD_NAME) to be set")
    if api_url and not api_url.startswith(("http://", "https://")):
        raise ValueError(f"--kubernetes-api must start with http:// or https://, got {api_url!r}")
    api = KubernetesAPI(api_url) if api_url else KubernetesAPI.in_cluster()
    return PodRelabeler(api, namespace=pod_namespace or in_cluster_namespace(), pod=pod_name)
