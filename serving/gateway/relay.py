"""One client request through the gateway: admission, routing, prefill, decode, relay.

:class:`RelayResponse` is the ASGI response the completion routes return. It runs the whole
request — the admission hook, the routing decision, the prefill call, the decode call and
the relay of its stream — inside its own task, while a second task waits for the client to
disconnect; a disconnect at any moment (even during prefill) cancels the first, which
closes the upstream connections (vLLM aborts a request whose client went away) and records
the request as ``ABORTED``.

The PD sequence (docs/gateway.md):

1. ``PREFILL_START``: the request, with ``max_tokens=1`` and ``stream=false``, to the
   prefill instance; wait for the whole response (the KV cache is written when it
   completes: a decode instance must never read a half-written one). With the ``params``
   hand-off (NixlConnector) it also carries ``kv_transfer_params`` with
   ``do_remote_decode: true``, and the response must carry the ``kv_transfer_params`` that
   say where the prompt's blocks are: one without them is a ``502`` naming the instance
   (the decode instance would silently recompute the prompt).
2. ``PREFILL_END`` = ``KV_HANDOFF_START``: the same request to the decode instance, which
   finds the prompt's KV cache (``folder``: in the shared folder, by its tokens; ``params``:
   the request carries the prefill's ``kv_transfer_params``) and loads it instead of
   recomputing.
3. ``KV_HANDOFF_END`` at the decode instance's first token; then every chunk is relayed
   the moment it is complete and its tokens recorded (``tokens(k)``) once it has been
   written to the client's connection: the emission times are when tokens left the
   gateway, the same instants a client's TTFT and ITL are made of.

With ``--engine-priority`` both legs carry the request's class as the engine's
``priority`` (:mod:`serving.gateway.engine_priority`; it replaces the client's), and the
prefill load is counted under that number for admission.

Failures: a prefill instance that cannot be reached, times out or answers 5xx is marked
down and the prefill is retried once on another; the same holds for opening the decode
stream. Once the stream has started, a failure becomes an SSE error event followed by
``[DONE]`` and the request is recorded as ``ERROR``; an upstream's own error event is
relayed and recorded the same way. A 4xx from an upstream is relayed as is (the request
itself is wrong; another instance would refuse it too) and recorded as ``ERROR``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import httpx
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from exporters.recorder import RequestTrace
from exporters.records import Phase, Status
from serving.gateway._request import (
    ParsedRequest,
    describe,
    max_tokens_of,
    prefill_body,
    prefill_kv_params,
    response_json,
)
from serving.gateway.admission import RequestInfo
from serving.gateway.config import KVHandoff
from serving.gateway.engine_priority import with_priority
from serving.gateway.routing import InstanceState, NoInstanceError, RouteDecision, RouteRequest
from serving.gateway.sse import DONE_EVENT, EventSplitter, StreamAccounting, error_event

if TYPE_CHECKING:
    from serving.gateway.state import Gateway

__all__ = ["RelayResponse"]

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class _UpstreamFailedError(Exception):
    """An upstream could not serve the call (unreachable, timeout, 5xx): try another."""


class RelayResponse(Response):
    """Serves one :class:`ParsedRequest` (see the module docstring)."""

    def __init__(self, gateway: Gateway, request: ParsedRequest) -> None:
        super().__init__()
        self.gateway = gateway
        self.request = request

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        job = _Job(self.gateway, self.request, send)
        work = asyncio.ensure_future(job.run())
        watch = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not work.done():
                work.cancel()
            try:
                await work
            except asyncio.CancelledError:
                if not watch.done() or watch.cancelled():
                    raise  # cancelled from outside (server shutdown), not by the client


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class _Job:
    """The state of one relayed request (one task; no locking needed)."""

    def __init__(self, gateway: Gateway, request: ParsedRequest, send: Send) -> None:
        self.gw = gateway
        self.req = request
        self.send = send
        self.trace: RequestTrace = gateway.recorder.start(
            request.request_id, request.labels, arrival_ts_ns=request.arrival_ns
        )
        self.status = Status.ERROR
        self.reason = ""
        self.started = False  # response headers sent
        self.acct = StreamAccounting()
        self.pd = False  # a prefill instance served this request
        self.kv_params: dict[str, Any] | None = None  # the prefill's answer (params hand-off)
        self.body = request.body  # what the engines get: with the engine priority, if any
        self.engine_priority: int | None = None  # the engines' order (None: arrival order)

    async def run(self) -> None:
        gw, req = self.gw, self.req
        gw.in_flight += 1
        try:
            await self._serve()
        except asyncio.CancelledError:
            self.status, self.reason = Status.ABORTED, "client disconnected"
            raise
        except Exception as exc:  # a bug must not leave the client hanging or lose the record
            gw.log_failure("relay failed", exc)
            self.status, self.reason = Status.ERROR, f"gateway error: {type(exc).__name__}"
            if not self.started:
                await self._reply_error(500, f"gateway error: {exc}", "internal_error")
        finally:
            gw.in_flight -= 1
            acct = self.acct
            self.trace.set_counts(
                prompt_tokens=acct.prompt_tokens or req.prompt_tokens,
                cached_tokens=acct.cached_tokens,
            )
            self.trace.finish(self.status, self.reason)

    async def _serve(self) -> None:
        gw, req = self.gw, self.req
        if gw.engine_priority.enabled:  # the engines' order: a number, vLLM's 0 by default
            engine_priority = gw.engine_priority_of(req.labels.priority)
            self.body = with_priority(req.body, engine_priority)
            self.engine_priority = 0 if engine_priority is None else engine_priority
        decision = gw.admission.decide(
            RequestInfo(
                request_id=req.request_id,
                model=req.labels.model,
                tenant=req.labels.tenant,
                slo=req.labels.slo,
                priority=req.labels.priority,
                prompt_tokens=req.prompt_tokens,
                max_tokens=max_tokens_of(req.body),
                stream=req.stream,
                arrival_s=req.arrival_ns / 1e9,
                engine_priority=self.engine_priority,
            )
        )
        if not decision.admit:
            self.status, self.reason = Status.REJECTED, decision.reason or "rejected"
            headers = []
            if decision.retry_after_s is not None:
                headers.append(
                    (b"retry-after", str(max(1, round(decision.retry_after_s))).encode())
                )
            await self._reply_error(
                decision.status_code, self.reason, decision.error_type, headers, decision.detail()
            )
            return
        try:
            route = self._route(frozenset())
        except NoInstanceError as exc:
            self.reason = str(exc)
            await self._reply_error(503, self.reason, "no_instance")
            return
        if route.prefill is not None:
            self.pd = True
            route = await self._prefill(route)
            if route.prefill is None:  # failed twice; the client has its answer
                return
        await self._decode(route)

    def _route(
        self, exclude: frozenset[str], *, prefill: InstanceState | None = None
    ) -> RouteDecision:
        gw, req = self.gw, self.req
        pool = gw.pool
        decision: RouteDecision = gw.choose(
            pool.states(),
            RouteRequest(
                prompt_tokens=req.prompt_tokens,
                affinity_key=req.affinity_key,
                affinity=pool.affinity,
                exclude=exclude,
                colocated=gw.colocated,
            ),
            gw.clock_s(),
        )
        if prefill is not None:  # re-routing the decode only: keep the prefill that worked
            decision = RouteDecision(prefill, decision.decode, decision.affinity_hit)
        return decision

    @property
    def _order(self) -> dict[str, int]:
        """The engine priority the pool's load is counted under (none: arrival order)."""
        p = self.engine_priority
        return {} if p is None else {"engine_priority": p}

    # -- prefill --

    async def _prefill(self, route: RouteDecision) -> RouteDecision:
        """Run the prefill (retried once elsewhere); the route to decode with, or one with
        ``prefill=None`` when the client was answered with an error."""
        gw, req = self.gw, self.req
        remote_decode = gw.config.kv_handoff is KVHandoff.PARAMS
        body = prefill_body(self.body, remote_decode=remote_decode)
        headers = {"x-request-id": f"{req.request_id}-prefill"}
        self.trace.mark(Phase.PREFILL_START)
        tried: set[str] = set()
        for attempt in range(2):
            assert route.prefill is not None
            target = route.prefill
            tried.add(target.id)
            gw.pool.add_load(target.id, prefill_tokens=req.prompt_tokens, **self._order)
            try:
                response = await self._call(
                    target,
                    "prefill",
                    lambda c: c.post(
                        req.path, json=body, headers=headers, timeout=gw.prefill_timeout
                    ),
                )
            except _UpstreamFailedError as exc:
                self.reason = f"prefill on {target.id} failed: {exc}"
                if attempt == 0:
                    try:
                        route = self._route(frozenset(tried))
                    except NoInstanceError:
                        break
                    gw.metrics.retries["prefill"].inc()
                    continue
                break
            finally:
                gw.pool.add_load(target.id, prefill_tokens=-req.prompt_tokens, **self._order)
            if response.status_code != 200:
                gw.metrics.upstream[("prefill", "error")].inc()
                self.reason = f"prefill on {target.id}: HTTP {response.status_code}"
                await self._relay_body(response)
                return RouteDecision(None, route.decode)
            payload = response_json(response)
            if remote_decode:
                self.kv_params = prefill_kv_params(payload)
                if self.kv_params is None:  # the decode leg would recompute the prompt
                    gw.metrics.upstream[("prefill", "error")].inc()
                    self.reason = (
                        f"prefill on {target.id} answered without kv_transfer_params: the "
                        "gateway hands the KV over with kv_handoff=params, which needs "
                        "NixlConnector on the prefill instance"
                    )
                    await self._reply_error(502, self.reason, "upstream_error")
                    return RouteDecision(None, route.decode)
            gw.metrics.upstream[("prefill", "ok")].inc()
            usage = payload.get("usage") or {}
            self.acct.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            now = time.perf_counter_ns()
            self.trace.mark(Phase.PREFILL_END, now)
            self.trace.mark(Phase.KV_HANDOFF_START, now)
            return route
        await self._reply_error(502, self.reason, "upstream_error")
        return RouteDecision(None, route.decode)

    # -- decode --

    async def _decode(self, route: RouteDecision) -> None:
        gw, req = self.gw, self.req
        pool_name = "colocated" if route.prefill is None else "decode"
        body = dict(self.body)
        if self.kv_params is not None:  # the params hand-off: where the prompt's KV is
            body["kv_transfer_params"] = self.kv_params
        if req.stream:
            options = body.get("stream_options") or {}
            self.acct.client_usage = bool(options.get("include_usage"))
            self.acct.client_continuous = bool(options.get("continuous_usage_stats"))
            body["stream_options"] = {
                **options,
                "include_usage": True,
                "continuous_usage_stats": True,
            }
        headers = {"x-request-id": req.request_id}
        tried: set[str] = set()
        for attempt in range(2):
            target = route.decode
            tried.add(target.id)
            gw.pool.add_load(target.id, decode_streams=1)
            try:
                response = await self._call(
                    target,
                    pool_name,
                    lambda c: c.send(
                        c.build_request(
                            "POST",
                            req.path,
                            json=body,
                            headers=headers,
                            timeout=gw.first_token_timeout,
                        ),
                        stream=True,
                    ),
                )
            except _UpstreamFailedError as exc:
                gw.pool.add_load(target.id, decode_streams=-1)
                self.reason = f"{pool_name} on {target.id} failed: {exc}"
                if attempt == 0:
                    try:
                        route = self._route(frozenset(tried), prefill=route.prefill)
                    except NoInstanceError:
                        break
                    gw.metrics.retries[pool_name].inc()
                    continue
                break
            gw.pool.pin(req.affinity_key, route.prefill.id if route.prefill else "", target.id)
            try:
                await self._relay(response, target, pool_name)
            finally:
                gw.pool.add_load(target.id, decode_streams=-1)
                await response.aclose()
            return
        await self._reply_error(502, self.reason, "upstream_error")

    async def _relay(self, response: httpx.Response, target: InstanceState, pool: str) -> None:
        gw, trace, acct = self.gw, self.trace, self.acct
        if response.status_code != 200 or not self.req.stream:
            try:
                await response.aread()
            except httpx.HTTPError as exc:
                gw.pool.mark_down(target.id, gw.clock_s())
                gw.metrics.upstream[(pool, "error")].inc()
                self.reason = f"{pool} answer from {target.id} broke: {describe(exc)}"
                await self._reply_error(502, self.reason, "upstream_error")
                return
        if response.status_code != 200:
            gw.metrics.upstream[(pool, "error")].inc()
            self.reason = f"{pool} on {target.id}: HTTP {response.status_code}"
            await self._relay_body(response)
            return
        if not self.req.stream:
            gw.metrics.upstream[(pool, "ok")].inc()
            payload = response_json(response)
            usage = payload.get("usage") or {}
            self._kv_landed()
            trace.tokens(int(usage.get("completion_tokens") or 0))
            acct.prompt_tokens = int(usage.get("prompt_tokens") or acct.prompt_tokens)
            self.status = Status.OK
            await self._relay_body(response)
            return
        await self._start(200, _SSE_HEADERS)
        splitter = EventSplitter()
        landed = False
        outcome = "ok"
        try:
            async for data in response.aiter_raw():
                for event in splitter.feed(data):
                    out, k = acct.process(event)
                    if k and not landed:
                        landed = True
                        self._kv_landed()  # the decode instance's first token is here
                    if out is not None:
                        await self.send(
                            {"type": "http.response.body", "body": out, "more_body": True}
                        )
                    if k:  # when they left for the client, as a client's TTFT counts them
                        trace.tokens(k)
        except httpx.HTTPError as exc:
            outcome = "error"
            gw.pool.mark_down(target.id, gw.clock_s())
            self.reason = f"{pool} stream from {target.id} broke: {describe(exc)}"
            await self._body(error_event(self.reason) + DONE_EVENT, more=False)
            return
        except asyncio.CancelledError:
            outcome = "aborted"
            raise
        finally:
            gw.metrics.upstream[(pool, outcome)].inc()
        if acct.error is not None:
            self.reason = f"{pool} on {target.id}: {acct.error}"[:500]
        elif not acct.done:
            self.reason = f"{pool} stream from {target.id} ended without [DONE]"
            await self._body(splitter.pending + error_event(self.reason) + DONE_EVENT, more=False)
            return
        else:
            self.status = Status.OK
        await self._body(splitter.pending, more=False)

    def _kv_landed(self) -> None:
        if self.pd:  # the decode instance produced a token: it holds the prompt's KV
            self.trace.mark(Phase.KV_HANDOFF_END)

    # -- upstream calls and replies --

    async def _call(
        self,
        target: InstanceState,
        pool: str,
        call: Callable[[httpx.AsyncClient], Awaitable[httpx.Response]],
    ) -> httpx.Response:
        gw = self.gw
        try:
            response = await call(gw.client(target.url))
        except httpx.HTTPError as exc:
            gw.pool.mark_down(target.id, gw.clock_s())
            gw.metrics.upstream[(pool, "error")].inc()
            raise _UpstreamFailedError(describe(exc)) from None
        if response.status_code >= 500:
            await response.aread()
            await response.aclose()
            gw.pool.mark_down(target.id, gw.clock_s())
            gw.metrics.upstream[(pool, "error")].inc()
            raise _UpstreamFailedError(f"HTTP {response.status_code}: {response.text[:200]}")
        gw.pool.mark_up(target.id)
        return response

    async def _start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = True
        await self.send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [*headers, (b"x-request-id", self.req.request_id.encode())],
            }
        )

    async def _body(self, data: bytes, *, more: bool) -> None:
        await self.send({"type": "http.response.body", "body": data, "more_body": more})

    async def _relay_body(self, response: httpx.Response) -> None:
        ctype = response.headers.get("content-type", "application/json").encode()
        await self._start(response.status_code, [(b"content-type", ctype)])
        await self._body(response.content, more=False)

    async def _reply_error(
        self,
        status: int,
        message: str,
        kind: str,
        headers: list[tuple[bytes, bytes]] | None = None,
        detail: Mapping[str, object] | None = None,
    ) -> None:
        error = {"message": message, "type": kind, "code": status, **(detail or {})}
        body = json.dumps({"error": error}).encode()
        await self._start(status, [(b"content-type", b"application/json"), *(headers or [])])
        await self._body(body, more=False)
