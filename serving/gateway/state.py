"""The state every gateway request shares: :class:`Gateway` (pool, upstream clients,
recorder, admission hook, metrics) and the parsing of a client request. The HTTP app that
serves it is :func:`serving.gateway.service.create_app`; the relay
(:mod:`serving.gateway.relay`) and the control-plane link (:mod:`serving.gateway.control`)
work on it.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry

from exporters.prometheus import PrometheusExporter
from exporters.recorder import RequestRecorder
from exporters.records import Labels, Vantage
from exporters.sinks import FanoutSink, RecordSink
from serving.gateway._request import ParsedRequest
from serving.gateway.admission import AdmissionHook, AllowAll
from serving.gateway.admission_load import LoadTracker, TrackedPool
from serving.gateway.admission_policy import AdmissionFeedback
from serving.gateway.config import GatewayConfig
from serving.gateway.engine_priority import EnginePriority
from serving.gateway.metrics import GatewayMetrics
from serving.gateway.pool import InstancePool
from serving.gateway.routing import affinity_key, choose

__all__ = ["Gateway", "error_response"]

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
        self.engine_priority = EnginePriority.parse(config.engine_priority)
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
                return error_response(
                    401, "invalid or missing API key: send 'Authorization: Bearer <key>'"
                )
            tenant = self.config.api_keys[key]
        try:
            payload = json.loads(body)
        except ValueError as exc:
            return error_response(400, f"body must be a JSON object: {exc}")
        if not isinstance(payload, dict):
            return error_response(400, f"body must be a JSON object, got {type(payload).__name__}")
        path = request.url.path
        if path.endswith("/chat/completions"):
            messages = payload.get("messages")
            if not isinstance(messages, list) or not messages:
                return error_response(400, "messages must be a non-empty list")
            prompt: Any = _messages_text(messages)
        else:
            prompt = payload.get("prompt")
            if not isinstance(prompt, str | list) or not prompt:
                return error_response(400, "prompt must be a non-empty string or list of token ids")
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

    def engine_priority_of(self, priority: str) -> int | None:
        """The engine ``priority`` a request of class ``priority`` is sent with (``None``:
        none; :mod:`serving.gateway.engine_priority`), under the admission hook's policy."""
        policy = getattr(self.admission, "policy", None)
        return self.engine_priority.of(priority, policy)

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


def error_response(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status)
