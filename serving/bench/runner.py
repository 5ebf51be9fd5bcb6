"""The open-loop replay: each planned request is sent at its time, whatever came before.

Every request is a streaming ``POST /v1/completions`` with ``ignore_eos`` and
``max_tokens`` (so it yields exactly the planned output), ``stream_options`` asking for
usage on every chunk (so a chunk's token count is exact), and an ``x-request-id`` header
(``<prefix>-<index>``), so the gateway's and the engines' records of it can be joined to the
client's. The client measures what a user would: a :class:`~exporters.recorder.RequestRecorder`
(vantage ``GATEWAY``, the client-side vantage) starts when the request is sent and records
every chunk as it arrives (:class:`~serving.gateway.sse.StreamAccounting` counts its
tokens, the same code the gateway uses). Records go to an in-memory sink; the report
computes every metric from them with the exporters' metric core.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from exporters.recorder import RequestRecorder
from exporters.records import Labels, RequestRecord, Status, Vantage
from exporters.sinks import InMemorySink
from serving.bench.prompts import RequestPlan
from serving.gateway.sse import EventSplitter, StreamAccounting

__all__ = ["BenchRun", "run_plan", "stream_request"]


@dataclass(frozen=True, slots=True)
class BenchRun:
    """What a replay produced: one final record per request sent, in send order, and the
    run's duration (first send to last finish, as ``vllm bench serve`` measures it).
    ``request_ids[i]`` is planned request *i*'s id. A replay stopped early has fewer
    records than its plan (its in-flight requests are cancelled and recorded ``ABORTED``)."""

    records: list[RequestRecord]
    duration_s: float
    request_ids: list[str]


async def run_plan(
    url: str,
    model: str,
    prompts: Sequence[str] | Callable[[int], str],
    plan: RequestPlan,
    *,
    request_id_prefix: str = "bench",
    timeout_s: float = 600.0,
    headers: dict[str, str] | None = None,
    on_done: Callable[[RequestRecord], None] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    stop: threading.Event | None = None,
) -> BenchRun:
    """Replay ``plan`` (with ``prompts[i]``, or ``prompts(i)`` made when request *i* is due,
    as its prompt) against ``url`` and wait for
    every request to finish. ``on_done`` is called with each final record (a progress
    bar). ``timeout_s`` bounds each request's wait for a chunk and its connection.
    Setting ``stop`` (from any thread) ends the replay early: no more requests are sent
    and those in flight are cancelled (the client disconnects)."""
    if not callable(prompts) and len(prompts) != len(plan):
        raise ValueError(f"prompts: expected {len(plan)} (one per request), got {len(prompts)}")
    prompt_of = prompts if callable(prompts) else prompts.__getitem__
    sink = InMemorySink()
    recorder = RequestRecorder(Vantage.GATEWAY, sink)
    labels = Labels(model=model, route="bench")
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
    ids = [f"{request_id_prefix}-{i}" for i in range(len(plan))]
    async with httpx.AsyncClient(
        base_url=url.rstrip("/"),
        limits=limits,
        timeout=timeout,
        transport=transport,
        headers=headers or {},
    ) as client:

        async def one(i: int) -> RequestRecord:
            body: dict[str, Any] = {
                "model": model,
                "prompt": prompt_of(i),
                "max_tokens": int(plan.output_tokens[i]),
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            }
            record = await stream_request(client, recorder, ids[i], labels, body)
            if on_done is not None:
                on_done(record)
            return record

        loop = asyncio.get_running_loop()
        start = loop.time()
        first_send = time.perf_counter()
        tasks: list[asyncio.Task[RequestRecord]] = []
        for i, send_s in enumerate(plan.send_s.tolist()):
            if not await _wait_until(loop, start + send_s, stop):
                break
            tasks.append(asyncio.create_task(one(i)))
        pending = set(tasks)
        while pending and not (stop is not None and stop.is_set()):
            _, pending = await asyncio.wait(pending, timeout=0.1)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        duration_s = time.perf_counter() - first_send
    records = sink.records
    order = {request_id: i for i, request_id in enumerate(ids)}
    records.sort(key=lambda r: order[r.request_id])
    return BenchRun(records=records, duration_s=duration_s, request_ids=ids)


async def _wait_until(
    loop: asyncio.AbstractEventLoop, when: float, stop: threading.Event | None
) -> bool:
    """Sleep until ``when`` on ``loop``'s clock; ``False`` if ``stop`` was set first."""
    while True:
        if stop is not None and stop.is_set():
            return False
        delay = when - loop.time()
        if delay <= 0:
            return True
        await asyncio.sleep(delay if stop is None else min(delay, 0.1))


async def stream_request(
    client: httpx.AsyncClient,
    recorder: RequestRecorder,
    request_id: str,
    labels: Labels,
    body: dict[str, Any],
) -> RequestRecord:
    """Send one streaming completion (``body``) and return its final client-side record:
    ``OK`` when the stream ended with ``[DONE]``, else ``ERROR`` with the reason."""
    trace = recorder.start(request_id, labels, expected_tokens=int(body["max_tokens"]))
    acct = StreamAccounting(client_usage=True, client_continuous=True)
    try:
        async with client.stream(
            "POST", "/v1/completions", json=body, headers={"x-request-id": request_id}
        ) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", "replace")
                return trace.finish(Status.ERROR, f"HTTP {response.status_code}: {text[:300]}")
            splitter = EventSplitter()
            async for data in response.aiter_raw():
                for event in splitter.feed(data):
                    _, k = acct.process(event)
                    if k:
                        trace.tokens(k)
    except httpx.HTTPError as exc:
        trace.set_counts(prompt_tokens=acct.prompt_tokens)
        return trace.finish(Status.ERROR, f"{type(exc).__name__}: {exc}"[:300])
    except asyncio.CancelledError:
        trace.finish(Status.ABORTED, "replay stopped")
        raise
    trace.set_counts(prompt_tokens=acct.prompt_tokens, cached_tokens=acct.cached_tokens)
    if acct.error is not None:
        return trace.finish(Status.ERROR, acct.error[:300])
    if not acct.done:
        return trace.finish(Status.ERROR, "stream ended without [DONE]")
    return trace.finish(Status.OK)
