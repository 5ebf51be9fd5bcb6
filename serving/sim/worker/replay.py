"""Replay a trace against sim workers without a tokenizer (the sim demo, the e2e test).

``goodput bench`` builds prompts with a real model's tokenizer; a sim worker counts one
token per word plus ``<s>`` (:mod:`serving.sim.worker.prompts`), so here request *i*'s
prompt is :func:`~serving.sim.worker.prompts.word_prompt` of the trace's input length:
the sim worker sees exactly the trace's lengths, and no two requests share a prefix.
Everything else is ``goodput bench``'s: the plan (:func:`serving.bench.prompts.plan_requests`,
open loop), the runner (streaming completions with ``ignore_eos``, usage on every chunk,
``x-request-id: <prefix>-<i>``), the client-side records and the summary.

Example::

    result = run_word_bench(BenchOptions(url=gateway_url, trace="azure_conv",
                                         rate_scale=1.0, duration_s=30, model="llama-3.1-8b",
                                         max_model_len=131072, progress=False))
    result["summary"]["goodput_rps"]
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

from serving.sim.worker.prompts import word_prompt

if TYPE_CHECKING:
    from exporters.records import RequestRecord
    from serving.bench.cli import BenchOptions

__all__ = ["run_word_bench"]

DEFAULT_MAX_MODEL_LEN = 131_072


def run_word_bench(
    options: BenchOptions,
    out: IO[str] | None = None,
    *,
    stop: threading.Event | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> dict[str, Any]:
    """As :func:`serving.bench.cli.run_bench` (same options, same result shape), with word
    prompts instead of a tokenizer's. ``options.tokenizer`` is not used; ``max_model_len``
    defaults to 131 072 (Llama 3.1's context)."""
    from serving.bench.cli import bench_result, trace_plan
    from serving.bench.report import parse_slo
    from serving.bench.runner import run_plan

    stream = out or sys.stdout
    objectives = parse_slo(options.slo)
    plan = trace_plan(options, options.max_model_len or DEFAULT_MAX_MODEL_LEN)
    lengths = plan.input_tokens.tolist()
    model = options.model or "llama-3.1-8b"
    print(
        f"goodput bench (word prompts): {len(plan)} requests of {options.trace} over "
        f"{options.duration_s:g} s at {options.rate_scale:g}x "
        f"({len(plan) / options.duration_s:.2f} req/s) to {options.url}, model {model}",
        file=stream,
        flush=True,
    )
    run = asyncio.run(
        run_plan(
            options.url,
            model,
            lambda i: word_prompt(lengths[i], i),
            plan,
            request_id_prefix=options.request_id_prefix,
            timeout_s=options.timeout_s,
            headers=options.headers,
            on_done=on_record,
            stop=stop,
        )
    )
    return {**bench_result(options, plan, run, objectives, stream), "records": run.records}
