"""The gateway's HTTP app: :func:`create_app` serving a :class:`~serving.gateway.state.Gateway`.

Routes (OpenAI-compatible where OpenAI defines them):

* ``POST /v1/completions``, ``POST /v1/chat/completions``: relayed through prefill and
  decode instances (PD) or one instance (colocated), streaming or not
  (:mod:`serving.gateway.relay`);
* ``GET /v1/models``: the first reachable instance's answer;
* ``GET /health``: the gateway's own liveness, its admission mode and policy version, its
  KV hand-off protocol, its engine priorities (``engine_priority``: ``off``, ``policy`` or
  the class map), where its pools come from (``pools_from``: ``fleet`` or
  ``kubernetes``, with the watch's state) and its pools (200 while it runs);
* ``GET /metrics``: Prometheus text from the gateway's registry — request histograms and
  counters of :class:`~exporters.prometheus.PrometheusExporter` and the gateway's own
  (:mod:`serving.gateway.metrics`).

Request headers the gateway reads: ``Authorization: Bearer <key>`` (the key's tenant, when
``api_keys`` is configured), ``x-goodput-slo`` (the SLO class; default: the tenant),
``x-goodput-priority`` and ``x-request-id`` (kept as the request's id when it is a plain
token of at most 128 characters, else a fresh one). Every response carries
``x-request-id``; upstream calls carry it too (the prefill call as ``<id>-prefill``), so
gateway and engine records join on it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from exporters.sinks import RecordSink
from serving.gateway.admission import AdmissionHook
from serving.gateway.admission_policy import PolicyAdmission
from serving.gateway.config import GatewayConfig, PoolSource
from serving.gateway.kubernetes import KubernetesAPI, PodWatcher, in_cluster_namespace
from serving.gateway.relay import RelayResponse
from serving.gateway.routing import NoInstanceError, RouteRequest
from serving.gateway.state import Gateway, error_response

__all__ = ["create_app"]


def create_app(
    config: GatewayConfig,
    *,
    sink: RecordSink | None = None,
    registry: CollectorRegistry | None = None,
    admission: AdmissionHook | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    link: bool = True,
) -> FastAPI:
    """The gateway app. Without ``sink`` the records go to the control plane named in
    ``config`` (when there is one) and always to the Prometheus exporter. With ``link`` and a
    control plane, the lifespan registers the gateway, syncs the pools from the fleet
    registry and applies the admission policies it is sent
    (:class:`~serving.gateway.control.ControlPlaneLink`). Without ``admission`` the hook is
    :class:`~serving.gateway.admission_policy.PolicyAdmission` (admits everything until a
    policy arrives). With ``pools_from=kubernetes`` the lifespan runs a
    :class:`~serving.gateway.kubernetes.PodWatcher` instead of the fleet sync (the link then
    only registers the gateway and takes its commands); building it raises
    :class:`~serving.gateway.kubernetes.KubernetesError` when the API server cannot be
    configured (no in-cluster service account, no namespace)."""
    from serving.gateway.control import ControlPlaneLink, records_sink

    registry = registry if registry is not None else CollectorRegistry()
    gateway = Gateway(
        config,
        sink=sink if sink is not None else records_sink(config, registry),
        registry=registry,
        admission=admission,
        transport=transport,
    )
    if admission is None:
        gateway.admission = PolicyAdmission(
            gateway.load, clock_s=gateway.clock_s, registry=registry
        )

    watcher = _pod_watcher(gateway) if config.pools_from is PoolSource.KUBERNETES else None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runner = None
        if link and config.control_plane and (config.fleet_sync or config.agent_key):
            runner = ControlPlaneLink(gateway)
            runner.start()
        if watcher is not None:
            watcher.start()
        try:
            yield
        finally:
            if watcher is not None:
                await watcher.stop()
            if runner is not None:
                await runner.stop()
            await gateway.aclose()
            gateway.sink.shutdown(timeout_s=5.0)

    app = FastAPI(title="Goodput gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.gateway = gateway
    app.state.pod_watcher = watcher

    async def relay(request: Request) -> Response:
        arrival_ns = time.perf_counter_ns()
        parsed = gateway.parse(request, await request.body(), arrival_ns)
        if isinstance(parsed, Response):
            return parsed
        return RelayResponse(gateway, parsed)

    app.add_api_route("/v1/completions", relay, methods=["POST"])
    app.add_api_route("/v1/chat/completions", relay, methods=["POST"])

    @app.get("/v1/models")
    async def models() -> Response:
        try:
            route = gateway.choose(
                gateway.pool.states(),
                RouteRequest(colocated=True),
                gateway.clock_s(),
            )
        except NoInstanceError as exc:
            return error_response(503, str(exc), "no_instance")
        try:
            answer = await gateway.client(route.decode.url).get(
                "/v1/models", timeout=config.connect_timeout_s * 2
            )
        except httpx.HTTPError as exc:
            return error_response(
                502, f"/v1/models from {route.decode.id} failed: {exc!r}", "upstream_error"
            )
        return Response(answer.content, answer.status_code, media_type="application/json")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        hook = gateway.admission
        mode = hook.mode() if isinstance(hook, PolicyAdmission) else type(hook).__name__
        version = hook.policy.version if isinstance(hook, PolicyAdmission) and hook.policy else None
        admission = {"mode": mode, "policy_version": version}
        return {"status": "ok", "gateway_id": config.gateway_id, "admission": admission,
                "kv_handoff": config.kv_handoff.value, "pools_from": pools_from(),
                "engine_priority": gateway.engine_priority.describe(),
                **gateway.pools()}  # fmt: skip

    def pools_from() -> dict[str, Any]:
        source: dict[str, Any] = {"source": config.pools_from.value}
        if watcher is not None:
            source.update(connected=watcher.connected, namespace=watcher.namespace,
                          resource_version=watcher.resource_version,
                          pods=len(watcher.pods))  # fmt: skip
        return source

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _pod_watcher(gateway: Gateway) -> PodWatcher:
    """The pool's watcher: an explicit ``kubernetes_api`` is used as is (no token: for
    ``kubectl proxy`` or a test), else the in-cluster API server and service account."""
    config = gateway.config
    api = (
        KubernetesAPI(config.kubernetes_api)
        if config.kubernetes_api
        else KubernetesAPI.in_cluster()
    )
    return PodWatcher(
        gateway.pool.apply_fleet,
        api=api,
        namespace=config.kubernetes_namespace or in_cluster_namespace(),
        selector=config.kubernetes_selector,
        port=config.worker_port,
        registry=gateway.registry,
        connect_timeout_s=config.connect_timeout_s,
    )
