"""Pool membership from Kubernetes: the worker pods' ``goodput.dev/role`` label.

With ``pools_from=kubernetes`` the gateway learns its pools from the API server instead of
the fleet registry (docs/deploy.md, "Roles are labels"):

* :func:`pod_members` (pure): the worker pods → the :class:`~exporters.fleet.FleetMember`
  list that :meth:`InstancePool.apply_fleet <serving.gateway.pool.InstancePool.apply_fleet>`
  takes. A pod is a member of the pool its label ``goodput.dev/role`` names (``prefill``,
  ``decode`` or ``both``) while it is Ready (condition ``Ready=True``), has a
  ``status.podIP`` and no ``metadata.deletionTimestamp``; its URL is
  ``http://POD_IP:WORKER_PORT``. A pod with another role value is left out (and named in
  :attr:`PodMembers.unknown_roles`).
* :class:`PodWatcher`: one asyncio task. It lists the pods once
  (``GET /api/v1/namespaces/NS/pods?labelSelector=...``), then follows
  ``?watch=1&resourceVersion=RV`` (newline-delimited JSON events ``ADDED``, ``MODIFIED``,
  ``DELETED``, ``BOOKMARK``, ``ERROR``) and applies the pool after every event, so a
  relabel moves the member within one event. ``410 Gone`` (as the status of the watch or
  as an ``ERROR`` event with code 410) relists. Other failures back off exponentially
  (``backoff_s`` to ``max_backoff_s``) and relist; the pool keeps what it last knew. A
  watch line longer than ``max_line_bytes`` relists (the event is lost); a line that is
  not a watch event is logged and skipped. Nothing is allocated by a size the server
  sends: the list's body and each line are read in chunks against fixed bounds.

:class:`~serving.kubernetes_api.KubernetesAPI` (shared with the workers' relabelling;
re-exported here) is where the API server is and how to authenticate: ``in_cluster`` reads
the service account's token, CA and namespace (``/var/run/secrets/kubernetes.io/
serviceaccount``) and ``KUBERNETES_SERVICE_HOST`` / ``KUBERNETES_SERVICE_PORT``; the token
is read again at every (re)connection (kubelet rotates it).

Metrics (on the gateway's registry): ``goodput_gateway_pool_watch_connected`` (1 while a
watch stream is open on a fresh list), ``goodput_gateway_pool_watch_relists_total``,
``goodput_gateway_pool_watch_errors_total`` (failed lists and watches, malformed events).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge

from exporters.fleet import FleetKind, FleetMember, FleetState, PoolRole
from serving.kubernetes_api import (
    ROLE_LABEL,
    KubernetesAPI,
    KubernetesError,
    in_cluster_namespace,
)

__all__ = [
    "DEFAULT_SELECTOR",
    "ROLE_LABEL",
    "KubernetesAPI",
    "KubernetesError",
    "PodMembers",
    "PodWatcher",
    "in_cluster_namespace",
    "pod_members",
]

logger = logging.getLogger(__name__)

DEFAULT_SELECTOR = "app.kubernetes.io/component=worker"
MAX_LINE_BYTES = 1 << 20  # one watch event (a pod object is a few KiB)
MAX_LIST_BYTES = 64 << 20  # one pod list
_ROLES = {r.value: r for r in PoolRole}


class _GoneError(Exception):
    """The resourceVersion is too old (410): relist."""


# -- the pure part --


@dataclass(frozen=True, slots=True)
class PodMembers:
    """:func:`pod_members`' answer: the members, and the pods left out for their role
    label (pod name → the label's value, ``""`` when missing)."""

    members: tuple[FleetMember, ...]
    unknown_roles: Mapping[str, str] = field(default_factory=dict)


def pod_members(pods: Iterable[Any], *, port: int) -> PodMembers:
    """The pool members of ``pods`` (pod objects as the API serves them; see the module
    docstring). Pods that are not Ready, terminating, without an IP, or not shaped like a
    pod are left out; so are pods whose role label is not a pool role (reported)."""
    members: list[FleetMember] = []
    unknown: dict[str, str] = {}
    for pod in pods:
        if not isinstance(pod, Mapping):
            continue
        meta = pod.get("metadata")
        status = pod.get("status")
        if not isinstance(meta, Mapping) or not isinstance(status, Mapping):
            continue
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            continue
        labels = meta.get("labels")
        value = labels.get(ROLE_LABEL) if isinstance(labels, Mapping) else None
        role = _ROLES.get(value) if isinstance(value, str) else None
        if role is None:
            unknown[name] = value if isinstance(value, str) else ""
            continue
        ip = status.get("podIP")
        if meta.get("deletionTimestamp") or not isinstance(ip, str) or not ip:
            continue
        if not _ready(status):
            continue
        host = f"[{ip}]" if ":" in ip else ip
        members.append(
            FleetMember(
                id=name,
                kind=FleetKind.WORKER,
                endpoint=f"http://{host}:{port}",
                role=role,
                state=FleetState.READY,
            )
        )
    members.sort(key=lambda m: m.id)
    return PodMembers(tuple(members), unknown)


def _ready(status: Mapping[str, Any]) -> bool:
    conditions = status.get("conditions")
    if not isinstance(conditions, list):
        return False
    return any(
        isinstance(c, Mapping) and c.get("type") == "Ready" and c.get("status") == "True"
        for c in conditions
    )


def _pod_key(pod: Any) -> str | None:
    """The pod's identity across events: its namespace and name."""
    if not isinstance(pod, Mapping):
        return None
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str):
        return None
    return f"{meta.get('namespace', '')}/{meta['name']}"


def _resource_version(obj: Any) -> str | None:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    rv = meta.get("resourceVersion") if isinstance(meta, Mapping) else None
    return rv if isinstance(rv, str) and rv else None


# -- the API server --


async def _http_error(what: str, response: httpx.Response) -> KubernetesError:
    """The error of a refused call, with the start of the server's answer (a ``Status``
    names the reason: a missing RBAC right reads ``pods is forbidden: ...``)."""
    head = bytearray()
    async for chunk in response.aiter_bytes():
        head += chunk
        if len(head) >= 1000:
            break
    text = head[:1000].decode("utf-8", "replace")
    return KubernetesError(f"{what} answered HTTP {response.status_code}: {text}")


# -- the watch loop --


class _WatchMetrics:
    def __init__(self, registry: CollectorRegistry | None, connected: Callable[[], bool]):
        self.relists = Counter(
            "goodput_gateway_pool_watch_relists",
            "Lists of the worker pods (the first, and each after a 410 or a failure).",
            registry=registry,
        )
        self.errors = Counter(
            "goodput_gateway_pool_watch_errors",
            "Failed lists or watches of the worker pods, and malformed watch events.",
            registry=registry,
        )
        Gauge(
            "goodput_gateway_pool_watch_connected",
            "1 while the gateway follows a watch of the worker pods, else 0.",
            registry=registry,
        ).set_function(lambda: float(connected()))


class PodWatcher:
    """Keeps a pool's membership equal to the worker pods (see the module docstring).

    ``apply`` receives the members after each change (``InstancePool.apply_fleet``).
    ``transport`` replaces httpx's network transport (tests).
    """

    def __init__(
        self,
        apply: Callable[[list[FleetMember]], None],
        *,
        api: KubernetesAPI,
        namespace: str,
        selector: str = DEFAULT_SELECTOR,
        port: int = 8000,
        registry: CollectorRegistry | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        connect_timeout_s: float = 5.0,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        max_line_bytes: int = MAX_LINE_BYTES,
        max_list_bytes: int = MAX_LIST_BYTES,
        watch_timeout_s: int = 300,
    ) -> None:
        if not namespace:
            raise ValueError("namespace must be a non-empty string")
        if not 1 <= port <= 65535:
            raise ValueError(f"port must be in 1..65535, got {port}")
        if not 0 < backoff_s <= max_backoff_s:
            raise ValueError(
                f"backoff_s must be in (0, max_backoff_s], got {backoff_s} and {max_backoff_s}"
            )
        self._apply = apply
        self.api = api
        self.namespace = namespace
        self.selector = selector
        self.port = port
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.max_line_bytes = max_line_bytes
        self.max_list_bytes = max_list_bytes
        self.watch_timeout_s = watch_timeout_s
        # The read timeout outlives the server's own end of a watch (timeoutSeconds);
        # bookmarks keep an idle watch talking.
        timeout = httpx.Timeout(watch_timeout_s + 30.0, connect=connect_timeout_s)
        self._client = httpx.AsyncClient(
            base_url=api.url.rstrip("/"), timeout=timeout, transport=transport, verify=api.verify()
        )
        self.path = f"/api/v1/namespaces/{namespace}/pods"
        self.pods: dict[str, Mapping[str, Any]] = {}
        self.resource_version: str | None = None
        self.connected = False
        self.num_events = 0
        self.num_relists = 0
        self.metrics = _WatchMetrics(registry, lambda: self.connected)
        self._unknown: dict[str, str] = {}  # pod → role value already logged
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def start(self) -> None:
        self._task = asyncio.create_task(self.run(), name="goodput-gateway-pod-watch")

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._client.aclose()

    async def run(self) -> None:
        """List, then watch, until stopped; relist after a 410, back off after a failure."""
        delay_s = self.backoff_s
        gone = 0  # 410s in a row: a server that answers nothing else is backed off too
        while not self._stop.is_set():
            try:
                await self.relist()
                while True:
                    loop = asyncio.get_running_loop()
                    started = loop.time()
                    if await self.watch():
                        gone, delay_s = 0, self.backoff_s
                    elif loop.time() - started < 1.0:
                        raise KubernetesError("the watch ended at once with no event")
            except _GoneError:
                logger.info("pod watch: resourceVersion %s expired (410); relisting",
                            self.resource_version)  # fmt: skip
                gone += 1
                if gone == 1:
                    continue
            except (httpx.HTTPError, KubernetesError, ValueError) as exc:
                self.metrics.errors.inc()
                if not self._failing:  # de-duplicated until it works again
                    self._failing = True
                    logger.warning(
                        "pod watch failed (%r); keeping the %d pods last known, retrying",
                        exc,
                        len(self.pods),
                    )
            finally:
                self.connected = False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=delay_s)
            delay_s = min(self.max_backoff_s, delay_s * 2)

    def _headers(self) -> dict[str, str]:
        return self.api.headers()

    async def relist(self) -> None:
        """One list of the worker pods: the membership is replaced by what it says."""
        self.metrics.relists.inc()
        self.num_relists += 1
        params = {"labelSelector": self.selector}
        async with self._client.stream(
            "GET", self.path, params=params, headers=self._headers()
        ) as response:
            if response.status_code != 200:
                raise await _http_error("listing pods", response)
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > self.max_list_bytes:
                    raise KubernetesError(f"the pod list exceeds {self.max_list_bytes} bytes")
        listing = json.loads(body)
        items = listing.get("items") if isinstance(listing, dict) else None
        rv = _resource_version(listing)
        if not isinstance(items, list) or rv is None:
            raise KubernetesError("the pod list has no items or no metadata.resourceVersion")
        self.pods = {}
        for pod in items:
            key = _pod_key(pod)
            if key is not None:
                self.pods[key] = pod
        self.resource_version = rv
        self._publish()

    async def watch(self) -> int:
        """Follow one watch from :attr:`resource_version` until the server ends it; the
        number of lines it sent."""
        params = {
            "labelSelector": self.selector,
            "watch": "1",
            "resourceVersion": self.resource_version or "",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(self.watch_timeout_s),
        }
        async with self._client.stream(
            "GET", self.path, params=params, headers=self._headers()
        ) as response:
            if response.status_code == 410:
                raise _GoneError
            if response.status_code != 200:
                raise await _http_error("watching pods", response)
            self.connected = True
            if self._failing:
                self._failing = False
                logger.warning("pod watch works again")
            num_lines = 0
            async for line in self._lines(response):
                num_lines += 1
                self._event(line)
            return num_lines

    async def _lines(self, response: httpx.Response) -> AsyncIterator[bytes]:
        buffer = bytearray()
        async for chunk in response.aiter_bytes():
            buffer += chunk
            while (end := buffer.find(b"\n")) >= 0:
                line = bytes(buffer[:end])
                del buffer[: end + 1]
                if line.strip():
                    yield line
            if len(buffer) > self.max_line_bytes:
                raise KubernetesError(
                    f"a watch event exceeds {self.max_line_bytes} bytes; relisting"
                )
        if buffer.strip():
            yield bytes(buffer)

    def _event(self, line: bytes) -> None:
        try:
            event = json.loads(line)
        except ValueError as exc:
            self._malformed(f"not JSON ({exc})")
            return
        if not isinstance(event, dict):
            self._malformed(f"not an object: {type(event).__name__}")
            return
        kind, obj = event.get("type"), event.get("object")
        if kind == "ERROR":
            code = obj.get("code") if isinstance(obj, dict) else None
            if code == 410:
                raise _GoneError
            raise KubernetesError(f"the watch sent an error: {str(obj)[:500]}")
        if kind not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
            self._malformed(f"unknown type {str(kind)[:50]!r}")
            return
        rv = _resource_version(obj)
        if rv is None:
            self._malformed(f"{kind} without metadata.resourceVersion")
            return
        self.resource_version = rv
        self.num_events += 1
        if kind == "BOOKMARK":
            return
        key = _pod_key(obj)
        if key is None or not isinstance(obj, Mapping):
            self._malformed(f"{kind} of an object without metadata.name")
            return
        if kind == "DELETED":
            self.pods.pop(key, None)
        else:
            self.pods[key] = obj
        self._publish()

    def _malformed(self, why: str) -> None:
        self.metrics.errors.inc()
        logger.warning("skipping a malformed pod watch event: %s", why)

    def _publish(self) -> None:
        found = pod_members(self.pods.values(), port=self.port)
        for name, role in found.unknown_roles.items():
            if self._unknown.get(name) != role:
                logger.warning(
                    "pod %s has %s=%r, not one of %s: it is in no pool",
                    name,
                    ROLE_LABEL,
                    role,
                    sorted(_ROLES),
                )
        self._unknown = dict(found.unknown_roles)
        self._apply(list(found.members))
