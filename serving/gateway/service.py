"""The gateway's shared state and its HTTP app: :class:`Gateway` and :func:`create_app`.

Routes (OpenAI-compatible where OpenAI defines them):

* ``POST /v1/completions``, ``POST /v1/chat/completions``: relayed through prefill and
  decode instances (PD) or one instance (colocated), streaming or not
  (:mod:`serving.gateway.relay`);
* ``GET /v1/models``: the first reachable instance's answer;
* ``GET /health``: the gateway's own liveness, its admission mode and policy version, and
  its pools (200 while it runs);
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
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from exporters.prometheus import PrometheusExporter
from exporters.recorder import RequestRecorder
from exporters.records import Labels, Vantage
from exporters.sinks import FanoutSink, RecordSink
from serving.gateway._request import ParsedRequest
from serving.gateway.admission import AdmissionHook, AllowAll
from serving.gateway.admission_load import LoadTracker, TrackedPool
from serving.gateway.admission_policy import AdmissionFeedback, PolicyAdmission
from serving.gateway.config import GatewayConfig
from serving.gateway.metrics import GatewayMetrics
from serving.gateway.pool import InstancePool
from serving.gateway.relay import RelayResponse
from serving.gateway.routing import NoInstanceError, RouteRequest, affinity_key, choose

__all__ = ["Gateway", "create_app"]

logger = logging.getLogger(__name__)

_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
_CHARS_PER_TOKEN = 4  # the prompt-size estimate for load balancing (text is not tokenized)
_LABEL_MAX = 200


class Gateway:
    """The state every request shares: pool, upstream clients, recorder, hooks, metrics.

    ``sink`` receives the gateway's request records (the app adds a Prometheus exporter in
    front of it). ``choose`` is the routing function (the pure
    :func:`serving.gateway.routing.choose` unless replaced); ``admission`` the admission
    hook; ``transport`` replaces httpx's network transport (tests); ``clock_s`` is the
    monotonic clock of cool-downs.
    """

    def __init__(
        self,
        config: GatewayConfig,
        *,
        sink: RecordSink,
        registry: CollectorRegistry,
        admission: AdmissionHook | None = None,
        choose: Callable[..., Any] = choose,
        transport: httpx.AsyncBaseTransport | None = None,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.colocated = config.colocated_mode
        self.load = LoadTracker()  # running sums of the pool's load, for admission
        self.pool: InstancePool = TrackedPool(
            config.static_instances(), tracker=self.load, cooldown_s=config.cooldown_s
        )
        self.registry = registry
        self.prometheus = PrometheusExporter(registry, slo_label=True)
        self.sink: RecordSink = FanoutSink(
            self.prometheus, sink, AdmissionFeedback(lambda: self.admission)
        )
        self.recorder = RequestRecorder(Vantage.GATEWAY, self.sink)
        self.in_flight = 0  # client requests being served now
        self.metrics = GatewayMetrics(registry, self.pool.states, lambda: self.in_flight, clock_s)
        self.admission: AdmissionHook = admission or AllowAll()
        self.choose = choose
        self.clock_s = clock_s
        self._transport = transport
        self._clients: dict[str, httpx.AsyncClient] = {}
        c = config
        self.prefill_timeout = httpx.Timeout(c.prefill_timeout_s, connect=c.connect_timeout_s)
        # The read timeout bounds the wait for the first byte and then each chunk.
        self.first_token_timeout = httpx.Timeout(
            c.connect_timeout_s,
            connect=c.connect_timeout_s,
            read=c.chunk_timeout_s,
            pool=c.connect_timeout_s,
        )
        self._logged: set[str] = set()

    def client(self, url: str) -> httpx.AsyncClient:
        """The pooled client of one upstream (made on first use, kept for the gateway's life)."""
        client = self._clients.get(url)
        if client is None:
            limits = httpx.Limits(
                max_connections=self.config.max_connections,
                max_keepalive_connections=self.config.max_connections,
            )
            client = httpx.AsyncClient(
                base_url=url, limits=limits, transport=self._transport, timeout=self.prefill_timeout
            )
            self._clients[url] = client
        return client

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()

    def log_failure(self, what: str, exc: BaseException) -> None:
        """Log a failure once per kind (de-duplicated: a broken path fails on every request)."""
        key = f"{what}:{type(exc).__name__}"
        if key not in self._logged:
            self._logged.add(key)
            logger.exception("%s (%s); further ones are counted only", what, exc)

    def parse(self, request: Request, body: bytes, arrival_ns: int) -> ParsedRequest | Response:
        """Validate a completion request; a :class:`ParsedRequest` or the error response."""
        tenant = self.config.default_tenant
        if self.config.api_keys:
            auth = request.headers.get("authorization", "")
            key = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
            if key not in self.config.api_keys:
                return _error(401, "invalid or missing API key: send 'Authorization: Bearer <key>'")
            tenant = self.config.api_keys[key]
        try:
            payload = json.loads(body)
        except ValueError as exc:
            return _error(400, f"body must be a JSON object: {exc}")
        if not isinstance(payload, dict):
            return _error(400, f"body must be a JSON object, got {type(payload).__name__}")
        path = request.url.path
        if path.endswith("/chat/completions"):
            messages = payload.get("messages")
            if not isinstance(messages, list) or not messages:
                return _error(400, "messages must be a non-empty list")
            prompt: Any = _messages_text(messages)
        else:
            prompt = payload.get("prompt")
            if not isinstance(prompt, str | list) or not prompt:
                return _error(400, "prompt must be a non-empty string or list of token ids")
        if isinstance(prompt, str):
            estimate = len(prompt) // _CHARS_PER_TOKEN + 1
        else:
            estimate = len(prompt) if all(type(t) is int for t in prompt) else 0
        headers = request.headers
        wanted_id = headers.get("x-request-id", "")
        request_id = wanted_id if _REQUEST_ID.fullmatch(wanted_id) else uuid.uuid4().hex
        labels = Labels(
            model=str(payload.get("model") or "")[:_LABEL_MAX],
            tenant=tenant,
            priority=headers.get("x-goodput-priority", "")[:_LABEL_MAX],
            slo=(headers.get("x-goodput-slo") or tenant)[:_LABEL_MAX],
            route="colocated" if self.colocated else "pd",
        )
        return ParsedRequest(
            request_id=request_id,
            path=path,
            body=payload,
            labels=labels,
            prompt_tokens=estimate,
            affinity_key=affinity_key(prompt),
            arrival_ns=arrival_ns,
        )

    def pools(self) -> dict[str, Any]:
        now = self.clock_s()
        return {
            "mode": "colocated" if self.colocated else "pd",
            "instances": [
                {
                    "id": s.id,
                    "role": s.role.value,
                    "healthy": s.healthy,
                    "cooling_down": s.down_until_s > now,
                    "prefill_tokens": s.prefill_tokens,
                    "decode_streams": s.decode_streams,
                }
                for s in self.pool.states()
            ],
        }


def _messages_text(messages: list[Any]) -> str:
    parts = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "\n".join(parts)


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status)


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
    policy arrives)."""
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

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runner = ControlPlaneLink(gateway) if link and config.control_plane else None
        if runner is not None:
            runner.start()
        try:
            yield
        finally:
            if runner is not None:
                await runner.stop()
            await gateway.aclose()
            gateway.sink.shutdown(timeout_s=5.0)

    app = FastAPI(title="Goodput gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.gateway = gateway

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
            return _error(503, str(exc), "no_instance")
        try:
            answer = await gateway.client(route.decode.url).get(
                "/v1/models", timeout=config.connect_timeout_s * 2
            )
        except httpx.HTTPError as exc:
            return _error(
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
                **gateway.pools()}  # fmt: skip

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return app
