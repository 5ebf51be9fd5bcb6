"""Benchmark: the gateway's admission decision per request (goal ≤ 20 µs p99).

Drives :class:`serving.gateway.admission_policy.PolicyAdmission` as the gateway does: a
policy with three priority classes, two SLOs and eight weighted tenants; a load tracker
over a PD fleet (``--prefill``/``--decode`` instances) whose load moves between decisions
(each admitted request enters prefill on the least-loaded prefill instance, requests leave
prefill for decode and finish, so the least-loaded instance changes and rejections happen).
Prompt lengths come from the Azure conversation trace when the shared traces are there,
else from a lognormal around 1,000 tokens. Each ``decide`` call is timed alone
(``perf_counter_ns``); in the same run, the same requests through
:class:`~serving.gateway.admission.AllowAll` are the baseline (the cost of the seam and the
timer). It is run again on a fleet 16× larger to show the cost does not grow with it.

Run from the repo root: ``python benchmarks/admission_decision.py [--quick]``. The last line
is one JSON object: ``p99_us`` (policy decision), ``p50_us``, ``baseline_p99_us``,
``p99_ratio`` (policy ÷ baseline p99), ``large_fleet_p99_us``, ``rejected_ratio``.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from exporters.admission import (  # noqa: E402
    AdmissionModel,
    AdmissionPolicy,
    ClassPolicy,
    SLOAdmission,
)
from exporters.fleet import PoolRole  # noqa: E402
from serving.gateway.admission import AdmissionHook, AllowAll, RequestInfo  # noqa: E402
from serving.gateway.admission_load import LoadTracker  # noqa: E402
from serving.gateway.admission_policy import PolicyAdmission  # noqa: E402
from serving.gateway.routing import InstanceState  # noqa: E402
from serving.traces import TraceError, load_trace  # noqa: E402

TENANTS = [f"tenant-{k}" for k in range(8)]
PRIORITIES = ["critical", "standard", "sheddable"]
SLOS = ["chat", "code"]


def policy() -> AdmissionPolicy:
    return AdmissionPolicy(
        version=1,
        ttl_s=3600.0,
        fallback_max_concurrency=256,
        classes={
            "critical": ClassPolicy(shed_order=2, sheddable=False),
            "standard": ClassPolicy(shed_order=1),
            "sheddable": ClassPolicy(shed_order=0, headroom_ratio=0.7),
        },
        slos={
            "chat": SLOAdmission(ttft_s=0.5, itl_s=0.05, burn_rate=2.0, margin_ratio=0.9),
            "code": SLOAdmission(ttft_s=1.0, itl_s=0.1),
        },
        model=AdmissionModel(
            prefill_tokens_per_s=20_000.0,
            kv_handoff_s=0.01,
            itl_base_s=0.008,
            itl_per_stream_s=0.0002,
            itl_per_context_token_s=2e-8,
            max_decode_batch=128,
            mean_decode_s=3.0,
            mean_context_tokens=1500.0,
        ),
        tenant_weights={t: 1.0 + k % 3 for k, t in enumerate(TENANTS)},
    )


def prompts(n: int, seed: int) -> list[int]:
    """``n`` prompt lengths drawn from the Azure conversation trace (or a lognormal)."""
    rng = np.random.default_rng(seed)
    try:
        lengths = np.asarray(load_trace("azure_conv").input_tokens)
    except (OSError, TraceError):  # no shared traces here: a synthetic distribution
        lengths = rng.lognormal(np.log(1000), 0.8, 100_000).clip(1, 32_000)
    return [int(x) for x in rng.choice(lengths, n)]


def run(hook: AdmissionHook, tracker: LoadTracker, n: int, seed: int) -> tuple[np.ndarray, int]:
    """Time ``n`` decisions while the load moves; returns the times (ns) and rejections."""
    rng = np.random.default_rng(seed)
    lengths = prompts(n, seed)
    tenant_ix = rng.integers(0, len(TENANTS), n).tolist()
    prio_ix = rng.integers(0, len(PRIORITIES), n).tolist()
    slo_ix = rng.integers(0, len(SLOS), n).tolist()
    finish_after = rng.integers(1, 40, n).tolist()
    decode_ids = list(tracker._decode)  # the benchmark's own bookkeeping of where work went
    in_prefill: list[tuple[str, int, str]] = []
    decoding: list[tuple[str, str]] = []
    times = np.empty(n, dtype=np.int64)
    rejected = 0
    clock = time.perf_counter_ns
    finished = getattr(hook, "on_finished", None)
    for i in range(n):
        tenant = TENANTS[tenant_ix[i]]
        req = RequestInfo(
            f"r{i}", "m", tenant, SLOS[slo_ix[i]], PRIORITIES[prio_ix[i]], lengths[i],
            256, True, i * 1e-3,
        )  # fmt: skip
        t0 = clock()
        decision = hook.decide(req)
        times[i] = clock() - t0
        if not decision.admit:
            rejected += 1
        else:  # the relay's load calls, outside the timed region
            target = tracker.min_prefill_id or ""
            tracker.add(target, prefill_tokens=lengths[i])
            in_prefill.append((target, lengths[i], tenant))
        if in_prefill and (i % 2 == 0 or len(in_prefill) > 64):
            target, tokens, who = in_prefill.pop(0)
            tracker.add(target, prefill_tokens=-tokens)
            dst = decode_ids[i % len(decode_ids)]
            tracker.add(dst, decode_streams=1)
            decoding.append((dst, who))
        if decoding and (len(decoding) > 200 or finish_after[i] < 20):
            dst, who = decoding.pop(0)
            tracker.add(dst, decode_streams=-1)
            if finished is not None:
                finished(who)
    return times, rejected


def fleet(num_prefill: int, num_decode: int) -> LoadTracker:
    tracker = LoadTracker()
    tracker.sync(
        [InstanceState(f"p{k}", f"http://p{k}", PoolRole.PREFILL) for k in range(num_prefill)]
        + [InstanceState(f"d{k}", f"http://d{k}", PoolRole.DECODE) for k in range(num_decode)]
    )
    return tracker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20,000 decisions instead of 200,000")
    parser.add_argument("--prefill", type=int, default=4)
    parser.add_argument("--decode", type=int, default=8)
    args = parser.parse_args()
    n = 20_000 if args.quick else 200_000
    gc.collect()
    gc.freeze()  # as the gateway's process does after start-up

    def policy_run(num_prefill: int, num_decode: int) -> tuple[np.ndarray, int]:
        tracker = fleet(num_prefill, num_decode)
        rule = PolicyAdmission(tracker, clock_s=time.monotonic)
        rule.apply(policy())
        return run(rule, tracker, n, seed=1)

    base_times, _ = run(AllowAll(), fleet(args.prefill, args.decode), n, seed=1)
    times, rejected = policy_run(args.prefill, args.decode)
    large, _ = policy_run(args.prefill * 16, args.decode * 16)

    def us(values: np.ndarray, q: float) -> float:
        return round(float(np.percentile(values, q)) / 1e3, 3)

    result = {
        "decisions": n,
        "fleet": f"{args.prefill}P+{args.decode}D",
        "p50_us": us(times, 50),
        "p99_us": us(times, 99),
        "baseline_p50_us": us(base_times, 50),
        "baseline_p99_us": us(base_times, 99),
        "p99_ratio": round(us(times, 99) / max(us(base_times, 99), 1e-3), 2),
        "large_fleet": f"{args.prefill * 16}P+{args.decode * 16}D",
        "large_fleet_p99_us": us(large, 99),
        "rejected_ratio": round(rejected / n, 3),
    }
    print(
        f"policy decision: p50 {result['p50_us']} µs, p99 {result['p99_us']} µs "
        f"(AllowAll p99 {result['baseline_p99_us']} µs); {result['large_fleet']}: p99 "
        f"{result['large_fleet_p99_us']} µs; rejected {result['rejected_ratio']:.1%}"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
