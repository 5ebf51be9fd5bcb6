"""Live loops on real vLLM (issue 13): under overload, admission sheds sheddable traffic with
429s naming the SLO, never critical traffic, and the admitted requests keep the SLO that the
same load without control misses; the gateway's metrics, the API's ``rejected`` and the
availability agree with what the client saw. The gateways send each request's class as the
engines' priority (``--engine-priority policy``; the engines schedule by it, whole prompts
per step: conftest.py), so a critical request never waits behind queued lower classes.
Critical requests are 5 % of the load (0.15 of what one prefill instance serves at the idle
TTFT): the class is never shed, so its own bursts must fit the SLO; at 15 % (0.45 of it)
they did not, and the admitted attainment missed the target in about half the runs
(docs/admission.md, "Live on vLLM").

The session's control plane (PostgreSQL, admission every second) and its two vLLM workers
(prefill on core 0, decode on core 1) behind two gateways: ``gw-control`` registers and
applies the pushed policies; ``gw-open`` takes no commands. Everything timing-dependent is
relative to a baseline measured first in the same run, because the machine is shared: the
idle TTFT of a long prompt (the median of six) sets the SLO (4x it, at least 0.5 s), and the
fastest of the six the offered load (3x the requests per second one prefill worker serves at
that TTFT, so at least 2x what the pair serves within the SLO — checked on the no-control
run).
"""

from __future__ import annotations

import functools
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from goodput.demo_client import OpenLoop, Outcome, closed_loop
from serving.workers.load import metric_sum

from .conftest import ControlPlane, PDPair
from .live_stack import api, eventually, gateways, post

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

PROMPT = (900, 1300)  # long prompts, short outputs: prefill is the bottleneck
OUTPUT = 8
TARGET = 0.9
OVERLOAD = 3.0  # offered ÷ (1 / idle TTFT)
NOCONTROL_S, CONTROL_S = 12.0, 24.0
MIX = {"critical": 0.05, "standard": 0.35, "sheddable": 0.6}
# The class order of the admission policy as the engines' priority (critical first); the
# engines schedule by it (conftest.SCHEDULING_POLICY). gw-open never gets a policy, so it
# sends none: its requests are served in arrival order.
ENGINE_PRIORITY = ("--engine-priority", "policy")


def _slo(control_plane: ControlPlane, key: str, ttft_s: float) -> None:
    post(control_plane, "/api/v1/slos", {
        "name": key, "selector": {"slo": key}, "vantage": "gateway",
        "objectives": [{"metric": "ttft", "threshold_s": ttft_s}], "target": TARGET,
        "window_s": 3600,
    })  # fmt: skip


def _run(url: str, key: str, rate: float, seconds: float, seed: int) -> list[Outcome]:
    loop = OpenLoop(url, "tiny", key, rate, PROMPT, OUTPUT, mix=MIX, seed=seed,
                    id_prefix=f"live-{key}")  # fmt: skip
    loop.start()
    time.sleep(seconds)
    loop.stop(drain_s=120.0)
    return loop.outcomes


def _settled(control_plane: ControlPlane, key: str, admitted: int, rejected: int) -> Any:
    def check() -> Any:
        stats = api(control_plane, f"/api/v1/slos/{key}/goodput", window="1h")
        return stats if stats["admitted"] >= admitted and stats["rejected"] >= rejected else None

    return eventually(check, f"records of {key} at the control plane", timeout_s=60)


def test_overload_sheds_sheddable_first_never_critical_and_admitted_requests_keep_the_slo(
    control_plane: ControlPlane, pd_pair: PDPair, tmp_path: Path
) -> None:
    statics = ["--prefill", pd_pair.prefill.spec.url, "--decode", pd_pair.decode.spec.url]
    specs = {"gw-control": True, "gw-open": False}
    with gateways(control_plane, tmp_path, statics, specs, ENGINE_PRIORITY) as gw:
        mean = sum(PROMPT) // 2
        one_at_a_time = functools.partial(closed_loop, gw["gw-open"], model="tiny", slo="idle",
                                          prompt_tokens=mean, max_tokens=OUTPUT)  # fmt: skip
        one_at_a_time(count=2, id_prefix="live-warm")
        idle = one_at_a_time(count=6, id_prefix="live-idle")
        assert all(o.status == 200 and o.complete for o in idle), idle
        idle_ttft = statistics.median(o.ttft_s or 0.0 for o in idle)
        ttft_slo = max(0.5, 4 * idle_ttft)
        # The load from the fastest idle request: a median raised by another process on the
        # two cores (591 ms against 186 ms in one run) made the load no overload.
        fastest = min(o.ttft_s or idle_ttft for o in idle)
        rate = OVERLOAD / fastest
        for key in ("live-control", "live-open"):
            _slo(control_plane, key, ttft_slo)

        def policy_acked() -> bool:
            page = api(control_plane, "/api/v1/commands", target="gw-control", state="acked",
                       kind="set_admission_policy")  # fmt: skip
            policies = [c["payload"]["policy"] for c in page["data"]]
            return any("live-control" in p.get("slos", {}) for p in policies)

        eventually(policy_acked, "an acked admission policy naming the SLO")

        nocontrol = _run(gw["gw-open"], "live-open", rate, NOCONTROL_S, 1)
        control = _run(gw["gw-control"], "live-control", rate, CONTROL_S, 2)

        def count(run: list[Outcome]) -> dict[int, int]:
            return {s: sum(o.status == s for o in run) for s in {o.status for o in run}}

        assert {o.status for o in nocontrol} == {200}, count(nocontrol)
        assert {o.status for o in control} <= {200, 429}, count(control)
        assert all(o.complete for o in nocontrol + control if o.status == 200)
        shed = [o for o in control if o.status == 429]
        sent = {p: sum(o.priority == p for o in control) for p in MIX}
        shed_by = {p: sum(o.priority == p for o in shed) for p in MIX}
        assert shed_by["critical"] == 0, shed_by  # never shed
        assert shed_by["sheddable"] > 0, shed_by
        share = {p: shed_by[p] / max(sent[p], 1) for p in MIX}
        assert share["sheddable"] >= share["standard"], (shed_by, sent)  # sheddable first
        for o in shed:
            assert o.error is not None and int(o.retry_after or 0) >= 1, o
            assert (o.error["code"], o.error["slo"]) == (429, "live-control"), o.error
            assert o.error["message"].startswith("slo 'live-control': predicted "), o.error

        metrics = httpx.get(f"{gw['gw-control']}/metrics", timeout=10).text
        name = "goodput_gateway_admission_rejections_total"
        gateway_shed = {p: metric_sum(metrics, name, priority=p) for p in MIX}
        assert gateway_shed == {p: float(n) for p, n in shed_by.items()}, gateway_shed
        n_ok = sum(o.status == 200 for o in control)
        served = {p: [o for o in control if o.status == 200 and o.priority == p] for p in MIX}
        within = {p: f"{sum((o.ttft_s or 0.0) <= ttft_slo for o in v)}/{len(v)}"
                  for p, v in served.items()}  # fmt: skip
        stats = _settled(control_plane, "live-control", n_ok, len(shed))
        base = _settled(control_plane, "live-open", len(nocontrol), 0)
        report = (
            f"idle TTFT {idle_ttft * 1000:.0f} ms (fastest {fastest * 1000:.0f}) -> SLO TTFT "
            f"<= {ttft_slo:.2f} s @ {TARGET}; "
            f"offered {rate:.2f} req/s; no control: {len(nocontrol)} sent, good "
            f"{base['good']} ({base['good'] / NOCONTROL_S:.2f} req/s), attainment "
            f"{base['attainment_ratio']:.3f}; control: {len(control)} sent, shed {shed_by} "
            f"of {sent}, admitted {stats['admitted']}, attainment "
            f"{stats['attainment_ratio']:.3f}, availability {stats['availability_ratio']:.3f}, "
            f"good {stats['good']} ({stats['good'] / CONTROL_S:.2f} req/s); within the SLO "
            f"by class (client's TTFT) {within}"
        )
        print(report)
        # The load was at least twice what the pair serves within the SLO.
        assert rate >= 2 * base["good"] / NOCONTROL_S, report
        # Gateway metrics, the API's counts and the availability agree with the client.
        assert (stats["admitted"], stats["rejected"]) == (n_ok, len(shed)), report
        assert stats["availability_ratio"] == pytest.approx(n_ok / len(control)), report
        assert base["rejected"] == 0, report
        # Without the loop the SLO is missed; with it, the admitted requests do better.
        assert base["attainment_ratio"] < TARGET, report
        assert stats["attainment_ratio"] > base["attainment_ratio"], report
        assert stats["good"] / CONTROL_S > base["good"] / NOCONTROL_S, report
        # The admitted requests keep the SLO (docs/admission.md, "Live on vLLM").
        assert stats["attainment_ratio"] >= TARGET, report
