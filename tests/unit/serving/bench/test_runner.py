"""The open-loop runner against an in-memory vLLM-like server."""

from __future__ import annotations

import threading

import numpy as np

from exporters.records import Status
from serving.bench.prompts import RequestPlan
from serving.bench.runner import run_plan
from tests.unit.serving.gateway.fake_upstream import FakeUpstreams

URL = "http://vllm:8000"


def plan(outputs: list[int], send_s: list[float]) -> RequestPlan:
    n = len(outputs)
    return RequestPlan(
        send_s=np.array(send_s),
        input_tokens=np.full(n, 10, dtype=np.int64),
        output_tokens=np.array(outputs, dtype=np.int64),
        blocks=None,
        max_model_len=2048,
        num_capped=0,
    )


async def test_every_request_is_sent_streamed_and_recorded() -> None:
    upstream = FakeUpstreams(URL)
    run = await run_plan(URL, "tiny", ["a", "b", "c"], plan([3, 1, 4], [0.0, 0.02, 0.04]),
                         request_id_prefix="r", transport=upstream.transport)  # fmt: skip
    assert [r.request_id for r in run.records] == ["r-0", "r-1", "r-2"]
    assert [r.output_tokens for r in run.records] == [3, 1, 4]
    assert all(r.status == Status.OK for r in run.records)
    assert run.records[0].prompt_tokens == 200 and run.records[0].cached_tokens == 128
    assert run.duration_s >= 0.04
    calls = upstream[URL].calls
    assert [c["request_id"] for c in calls] == ["r-0", "r-1", "r-2"]
    assert calls[2]["body"] == {
        "model": "tiny", "prompt": "c", "max_tokens": 4, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }  # fmt: skip


async def test_failures_are_error_records() -> None:
    upstream = FakeUpstreams(URL)
    upstream[URL].status = 400
    run = await run_plan(URL, "m", ["a"], plan([2], [0.0]), transport=upstream.transport)
    assert run.records[0].status == Status.ERROR
    assert run.records[0].reason.startswith("HTTP 400: ")
    upstream[URL].status = 200
    upstream[URL].break_after = 1
    run = await run_plan(URL, "m", ["a"], plan([3], [0.0]), transport=upstream.transport)
    assert (run.records[0].status, run.records[0].output_tokens) == (Status.ERROR, 1)
    assert run.records[0].reason.startswith("ReadError")


async def test_stop_ends_the_replay_and_aborts_what_is_in_flight() -> None:
    upstream = FakeUpstreams(URL)
    upstream[URL].delay_s = 0.02
    stop = threading.Event()

    def on_done(record: object) -> None:
        stop.set()  # after the first request; the second is in flight, the third unsent

    run = await run_plan(URL, "m", ["a", "b", "c"], plan([1, 500, 1], [0.0, 0.0, 30.0]),
                         transport=upstream.transport, stop=stop, on_done=on_done)  # fmt: skip
    assert [(r.request_id, r.status) for r in run.records] == [
        ("bench-0", Status.OK), ("bench-1", Status.ABORTED)]  # fmt: skip
    assert run.records[1].reason == "replay stopped" and run.duration_s < 5
    assert run.request_ids == ["bench-0", "bench-1", "bench-2"]
