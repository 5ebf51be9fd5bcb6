"""Acceptance (issue 5): sim workers behind the real gateway feed the real control plane,
whose goodput for a replayed trace slice matches the cluster simulator's own report for
the same requests, the same 1P1D cluster and the same SLO.

Why the two can differ at all, and the tolerance: the simulator replays the requests in
virtual time; the stack replays them in wall time through four processes on a shared
2-core machine. Every request pays the stack's HTTP hops (client → gateway → prefill
worker → gateway → decode worker → gateway → client) and any scheduling stall of those
processes, and a decode leg reaches the decode worker one gateway round trip after its
prefill ended (the simulator hands the KV over at the prefill's end). A request can
therefore only change sides of an objective when it is close to the threshold: the test
allows every simulated request within ``BAND_S`` of the TTFT threshold to flip (plus one),
and separately requires the per-request TTFTs to agree (median and 90th percentile of the
differences), so a loose band cannot hide a stack that is slow across the board. A run in
which other work on the machine starved the stack is noise, not a verdict: up to
``ATTEMPTS`` fresh stacks are tried and one must agree (all figures are printed).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from exporters.latency import request_latencies
from exporters.records import RecordBatch, Status
from serving.bench.cli import BenchOptions
from serving.bench.prompts import RequestPlan, plan_requests
from serving.bench.report import parse_slo
from serving.sim.cluster import SimOptions, SimResult, Simulator, Workload, parse_cluster
from serving.sim.worker.replay import run_word_bench
from serving.traces import load_trace
from serving.workers.load import metric_sum

from .conftest import MODEL, SIM_CONFIG, SimStack, running_stack

pytestmark = pytest.mark.e2e

TRACE, START_S, RATE, DURATION_S = "azure_conv", 600.0, 1.0, 40.0
SLO = "ttft=0.5,tpot=0.02"
TARGET = 0.9
BAND_S = 0.05  # the stack's allowance around the TTFT threshold (module docstring)
MAX_MODEL_LEN = 131_072
MEDIAN_TTFT_DIFF_S, P90_TTFT_DIFF_S = 0.075, 0.3
# A run during which other work starved the stack's processes measures the machine, not
# the sim workers: up to this many fresh stacks, one of which must agree (as the vLLM
# cross-check does, docs/gateway.md). Every attempt's figures are printed.
ATTEMPTS = 3


def _simulate(plan: RequestPlan) -> tuple[SimResult, np.ndarray, np.ndarray]:
    work = Workload(
        arrival_s=plan.send_s,
        prompt_tokens=plan.input_tokens,
        output_tokens=plan.output_tokens,
        hash_ids=None,
        trace_rows=np.arange(len(plan), dtype=np.int64),
        name=TRACE,
    )
    spec = parse_cluster(f"prefill=1,decode=1,model=llama3.1-8b,{SIM_CONFIG}")
    options = SimOptions(
        objectives=tuple(parse_slo(SLO)), slo_target=TARGET, keep_records=True,
        request_id_prefix="e2e-",
    )  # fmt: skip
    result = Simulator(spec, work, options).run()
    batch = RecordBatch.concat(result.records or [])
    order = np.argsort([int(r.split("-")[1]) for r in batch.request_ids])
    lat = request_latencies(batch)
    return result, lat.ttft_s[order], lat.tpot_s[order]


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one replay through a fresh stack measured."""

    stats: dict[str, Any]  # the control plane's goodput for the gateway SLO
    client_ttft_s: np.ndarray
    client_tpot_s: np.ndarray
    step_lag: dict[str, str]
    engine_records_counted: int  # by the control plane's engine-vantage SLO


def _replay(stack: SimStack, n: int) -> Attempt:
    """Replay the slice through ``stack``; wait for every record in the control plane.
    Anything but timing (a failed request, a lost record, a dead process) fails at once."""
    slo = stack.post("/api/v1/slos", {
        "name": "e2e-sim", "selector": {"model": MODEL}, "vantage": "gateway",
        "objectives": [{"metric": "ttft", "threshold_s": 0.5},
                       {"metric": "tpot", "threshold_s": 0.02}],
        "target": TARGET, "window_s": 3600,
    })  # fmt: skip
    engine_slo = stack.post("/api/v1/slos", {
        "name": "e2e-sim-engine", "selector": {"model": MODEL}, "vantage": "engine",
        "objectives": [{"metric": "ttft", "threshold_s": 0.5}], "target": TARGET,
        "window_s": 3600,
    })  # fmt: skip
    # A record is judged against the SLOs the engine holds when it arrives; the engine polls
    # the registry, and reading an SLO's goodput loads it at once (read-your-writes). Without
    # this, a leg that reached the engine before the SLO did was not counted for it (the
    # engine SLO read 378 or 379 of 380 legs in some runs).
    for created in (slo, engine_slo):
        stack.get(f"/api/v1/slos/{created['id']}/goodput", window="1m")
    bench = run_word_bench(
        BenchOptions(
            url=stack.gateway_url, trace=TRACE, rate_scale=RATE, duration_s=DURATION_S,
            slo=SLO, model=MODEL, max_model_len=MAX_MODEL_LEN, start_s=START_S,
            progress=False, request_id_prefix="e2e",
        )
    )  # fmt: skip
    stack.check_alive()
    records = bench["records"]
    assert len(records) == n and all(r.status == Status.OK for r in records), [
        (r.request_id, r.reason) for r in records if r.status != Status.OK
    ][:5]
    # The gateway's records reach the control plane within a few exporter flushes.
    deadline = time.monotonic() + 60
    while (stats := stack.get(f"/api/v1/slos/{slo['id']}/goodput", window="1h"))["requests"] < n:
        assert time.monotonic() < deadline, f"the control plane has {stats['requests']} of {n}"
        time.sleep(1.0)
    # Both workers ship engine records, as the vLLM plugin does: one per leg, every one
    # accepted by the control plane's ingest.
    deadline = time.monotonic() + 60
    while True:
        shipped = {
            role: httpx.get(f"{url}/sim", timeout=10).json()["engine_records"]
            for role, url in stack.workers.items()
        }
        if all(e["num_exported_records"] >= n for e in shipped.values()):
            break
        assert time.monotonic() < deadline, f"engine records shipped: {shipped}"
        time.sleep(1.0)
    for exporter in shipped.values():
        assert exporter["num_exported_records"] == n, shipped
        assert exporter["num_dropped_records"] == exporter["num_rejected_records"] == 0, shipped
    # Every engine record the exporters had acknowledged is counted, exactly once: ingest
    # applied all 3n records (n gateway records, two legs per request), refused none, and
    # the engine dropped none. The engine SLO's `requests` counts judged legs (ok or
    # error); a leg its worker ended as aborted (finish reason "abort": its client went
    # away first) is counted apart in `aborted`, as every aborted request is. So the exact
    # count is requests + aborted.
    engine = stack.get(f"/api/v1/slos/{engine_slo['id']}/goodput", window="1h")
    metrics = httpx.get(f"{stack.cp_url}/metrics", timeout=10).text
    assert metric_sum(metrics, "goodput_ingest_records_total", protocol="wire") == 3 * n
    assert engine["requests"] + engine["aborted"] == 2 * n, (engine, metrics)
    assert engine["errors"] == 0, engine
    assert metric_sum(metrics, "goodput_ingest_rejected_records_total") == 0
    assert metric_sum(metrics, "goodput_engine_records_total", outcome="dropped_late") == 0
    assert metric_sum(metrics, "goodput_engine_records_total", outcome="dropped_future") == 0
    assert stats["requests"] == n and stats["errors"] == 0, stats
    # How late each worker's loop committed its iterations (its tokens' delay past the model).
    lag = {}
    for role, url in stack.workers.items():
        text = httpx.get(f"{url}/metrics", timeout=10).text
        count = metric_sum(text, "goodput_sim_step_lag_seconds_count")
        within = metric_sum(text, "goodput_sim_step_lag_seconds_bucket", le="0.005")
        lag[role] = f"{within / count:.1%} of {count:.0f} iterations within 5 ms"
    client = request_latencies(RecordBatch.from_records(records))
    return Attempt(stats, client.ttft_s, client.tpot_s, lag, engine["requests"])


def _compare(attempt: Attempt, sim: SimResult, sim_ttft: np.ndarray, sim_tpot: np.ndarray
             ) -> tuple[list[str], str]:  # fmt: skip
    """The agreement criteria this attempt misses (none: it agrees), and its figures."""
    stats = attempt.stats
    ttft_diff = attempt.client_ttft_s - sim_ttft
    tpot_diff = attempt.client_tpot_s - sim_tpot
    band = int(np.sum(np.abs(sim_ttft - parse_slo(SLO)[0].threshold_s) <= BAND_S))
    good_cp, good_sim = stats["good"], sim.stats.good
    report = (
        f"control plane good {good_cp} of {stats['requests']} (attainment "
        f"{stats['attainment_ratio']:.3f}), simulator good {good_sim} (attainment "
        f"{sim.stats.attainment_ratio:.3f}); {band} simulated requests within "
        f"{BAND_S * 1e3:.0f} ms of the TTFT threshold; TTFT client - sim: median "
        f"{np.median(ttft_diff) * 1e3:+.1f} ms, p90 {np.percentile(ttft_diff, 90) * 1e3:+.1f} ms, "
        f"max {ttft_diff.max() * 1e3:+.1f} ms, min {ttft_diff.min() * 1e3:+.1f} ms; TPOT "
        f"median {np.median(tpot_diff) * 1e3:+.3f} ms; simulator TTFT p50/p90 "
        f"{np.median(sim_ttft) * 1e3:.0f}/{np.percentile(sim_ttft, 90) * 1e3:.0f} ms, control "
        f"plane (gateway) TTFT p50/p90 {stats['ttft']['p50_s'] * 1e3:.0f}/"
        f"{stats['ttft']['p90_s'] * 1e3:.0f} ms; worker step lag: {attempt.step_lag}; "
        f"engine records counted by the control plane: {attempt.engine_records_counted}"
    )
    problems = []
    if abs(good_cp - good_sim) > band + 1:
        problems.append(f"good differs by {abs(good_cp - good_sim)} > {band + 1}")
    if abs(np.median(ttft_diff)) > MEDIAN_TTFT_DIFF_S:
        problems.append("median TTFT difference")
    if np.percentile(np.abs(ttft_diff), 90) > P90_TTFT_DIFF_S:
        problems.append("p90 TTFT difference")
    if abs(np.median(tpot_diff)) > 0.002:
        problems.append("median TPOT difference")
    return problems, report


def test_control_plane_goodput_matches_the_simulator(tmp_path: Path) -> None:
    plan = plan_requests(
        load_trace(TRACE), rate_scale=RATE, duration_s=DURATION_S,
        max_model_len=MAX_MODEL_LEN, start_s=START_S,
    )  # fmt: skip
    sim, sim_ttft, sim_tpot = _simulate(plan)
    # The run is an interesting one: some requests miss the SLO, most meet it.
    attainment = sim.stats.attainment_ratio
    assert attainment is not None and 0.5 < attainment < 0.98, sim.stats
    reports = []
    for k in range(ATTEMPTS):
        with running_stack(tmp_path / f"attempt-{k}") as stack:
            attempt = _replay(stack, len(plan))
        problems, report = _compare(attempt, sim, sim_ttft, sim_tpot)
        reports.append(f"attempt {k + 1}: {report}" + (f" -> {problems}" if problems else ""))
        print(reports[-1])
        if not problems:
            return
    pytest.fail("no attempt agreed with the simulator:\n" + "\n".join(reports))


def test_workers_register_and_obey_drain_and_resume(sim_stack: SimStack) -> None:
    ids = {role: url.removeprefix("http://") for role, url in sim_stack.workers.items()}
    deadline = time.monotonic() + 30
    while True:  # the agents register once their workers serve
        members = {m["id"]: m for m in sim_stack.get("/api/v1/fleet", kind="worker")["data"]}
        if set(ids.values()) <= set(members):
            break
        assert time.monotonic() < deadline, members
        time.sleep(0.5)
    for role, member_id in ids.items():
        member = members[member_id]
        assert (member["role"], member["state"], member["model"]) == (role, "ready", MODEL)
        assert member["endpoint"] == sim_stack.workers[role]
    target = ids["decode"]
    for kind, wanted in (("drain", "drained"), ("resume", "ready")):
        command = sim_stack.post("/api/v1/commands", {"kind": kind, "target": target,
                                                      "payload": {}})  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            member = sim_stack.get(f"/api/v1/fleet/{target}")
            state = sim_stack.get(f"/api/v1/commands/{command['id']}")["state"]
            if member["state"] == wanted and state == "acked":
                break
            assert time.monotonic() < deadline, (kind, member, state)
            time.sleep(0.5)
