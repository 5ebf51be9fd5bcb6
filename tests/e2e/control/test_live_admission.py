"""Live check (issue 6): under overload, admission sheds sheddable traffic with 429s and the
admitted requests keep the SLO, on a running PD stack; the same load without control
misses it.

One stack — control plane (admission loop every 0.5 s), a prefill and a decode sim worker
(H100, Llama-3.1-8B) — and two gateways in front of the same workers: ``gw-control``
registers and receives the control plane's admission policies; ``gw-nocontrol`` has no
agent key, so it never gets one (it admits everything, as a stack without the loop would).
The two runs go one after the other with the same open-loop traffic (Poisson, twice the
prefill worker's capacity for these prompts, half ``sheddable`` and half ``standard``), each
under its own SLO key so the control plane's goodput API reports them apart. The
no-control run goes first: its engine records teach the control plane the prefill rate, so
the controlled run is judged with a learned model, not the learner's cautious prior.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from serving.sim.latency_model import LatencyModel
from serving.workers.load import metric_sum

from .conftest import PROFILE, ControlStack, GatewaySpec, Outcome, control_stack, open_loop

pytestmark = pytest.mark.e2e

TTFT_S, TARGET = 1.0, 0.9  # the SLO: TTFT ≤ 1 s for 90 % of requests
PROMPT_MIN, PROMPT_MAX, OUTPUT = 6000, 10000, 8  # prompt-heavy: prefill is the bottleneck
OVERLOAD = 2.0  # offered load ÷ the prefill worker's capacity
NOCONTROL_S, CONTROL_S = 6.0, 14.0  # seconds of arrivals in each run
SETTINGS = {
    "GOODPUT_ADMISSION_INTERVAL_S": "0.5",
    "GOODPUT_ADMISSION_POLICY_TTL_S": "30",
    "GOODPUT_PLANNER_ENABLED": "false",  # this check is about admission alone
}


def _capacity_rps() -> float:
    """Requests/s one prefill worker serves at the mean prompt (the profile's prefill time)."""
    mean_prompt = (PROMPT_MIN + PROMPT_MAX) // 2
    return 1.0 / LatencyModel.for_profile(PROFILE).prefill_s([mean_prompt])


def _traffic(stack: ControlStack, gateway: str, slo: str, duration_s: float, seed: int,
             first_index: int) -> list[Outcome]:  # fmt: skip
    def headers_of(k: int) -> tuple[str, dict[str, str]]:
        priority = "sheddable" if k % 2 == 0 else "standard"
        return priority, {"x-goodput-slo": slo, "x-goodput-priority": priority}

    return open_loop(
        stack.gateways[gateway],
        rate_rps=OVERLOAD * _capacity_rps(),
        duration_s=duration_s,
        prompt_tokens=lambda rng: int(rng.integers(PROMPT_MIN, PROMPT_MAX + 1)),
        max_tokens=OUTPUT,
        headers_of=headers_of,
        seed=seed,
        first_index=first_index,
    )


def _slo(stack: ControlStack, key: str) -> None:
    stack.post(
        "/api/v1/slos",
        {"name": key, "selector": {"slo": key}, "vantage": "gateway",
         "objectives": [{"metric": "ttft", "threshold_s": TTFT_S}], "target": TARGET,
         "window_s": 3600},
    )  # fmt: skip


def _client_attainment(outcomes: list[Outcome]) -> float:
    served = [o for o in outcomes if o.status == 200]
    return sum(o.ttft_s is not None and o.ttft_s <= TTFT_S for o in served) / max(len(served), 1)


def _settled(stack: ControlStack, key: str, admitted: int, rejected: int) -> dict[str, Any]:
    """The SLO's stats once the control plane holds every record of the run."""

    def check() -> dict[str, Any] | None:
        stats: dict[str, Any] = stack.get(f"/api/v1/slos/{key}/goodput", window="1h")
        done = stats["admitted"] >= admitted and stats["rejected"] >= rejected
        return stats if done else None

    stats: dict[str, Any] = stack.eventually(
        check, f"records of {key} at the control plane", timeout_s=45
    )
    return stats


def test_overload_sheds_sheddable_traffic_and_admitted_requests_keep_the_slo(
    tmp_path: Path,
) -> None:
    gateways = (GatewaySpec("gw-control"), GatewaySpec("gw-nocontrol", agent=False))
    with control_stack(
        tmp_path, settings=SETTINGS, roles=("prefill", "decode"), gateways=gateways,
        sim_config="jitter=0.02",
    ) as stack:  # fmt: skip
        for key in ("live-control", "live-nocontrol"):
            _slo(stack, key)

        # The controlled gateway holds a policy that knows the SLO (acked, so audited).
        def policy_acked() -> bool:
            page = stack.get("/api/v1/commands", target="gw-control", state="acked",
                             kind="set_admission_policy")  # fmt: skip
            return any("live-control" in c["payload"]["policy"]["slos"] for c in page["data"])

        stack.eventually(policy_acked, "an acked admission policy naming the SLO")

        nocontrol = _traffic(stack, "gw-nocontrol", "live-nocontrol", NOCONTROL_S, 1, 0)
        control = _traffic(stack, "gw-control", "live-control", CONTROL_S, 2, 100_000)
        stack.check_alive()

        by_status = {
            name: {s: sum(o.status == s for o in run) for s in {o.status for o in run}}
            for name, run in (("nocontrol", nocontrol), ("control", control))
        }
        # Nothing failed: every request was served to its end or (with control) refused.
        assert {o.status for o in nocontrol} == {200}, by_status
        assert {o.status for o in control} <= {200, 429}, by_status
        assert all(o.complete for o in nocontrol + control if o.status == 200)

        shed = [o for o in control if o.status == 429]
        sent = {p: sum(o.priority == p for o in control) for p in ("sheddable", "standard")}
        shed_by = {p: sum(o.priority == p for o in shed) for p in sent}
        # Sheddable traffic is refused first: a larger share of it than of standard traffic.
        assert shed_by["sheddable"] / sent["sheddable"] > 0.3, (shed_by, sent)
        assert shed_by["sheddable"] / sent["sheddable"] > shed_by["standard"] / sent["standard"]
        for o in shed:
            error = o.body["error"]
            assert int(o.headers["retry-after"]) >= 1
            assert (error["code"], error["type"], error["slo"]) == (429, "rate_limited",
                                                                    "live-control")  # fmt: skip
            assert error["objective"] in ("ttft", "itl", "batch"), error
            assert error["predicted"] > error["allowed"] > 0, error
            assert error["message"].startswith("slo 'live-control': predicted ")
            assert f"priority '{o.priority}'" in error["message"], error

        # The gateway counts the same refusals in its metrics, and ran on the pushed policy.
        gateway = stack.gateways["gw-control"]
        metrics = httpx.get(f"{gateway}/metrics", timeout=10).text
        for priority, count in shed_by.items():
            name = "goodput_gateway_admission_rejections_total"
            assert metric_sum(metrics, name, priority=priority) == count, (priority, count)
        assert metric_sum(metrics, "goodput_gateway_admission_mode", mode="policy") == 1.0
        health = httpx.get(f"{stack.gateways['gw-nocontrol']}/health", timeout=10).json()
        assert health["admission"]["mode"] == "allow_all", health  # never had a policy

        n_ok = by_status["control"].get(200, 0)
        stats = _settled(stack, "live-control", n_ok, len(shed))
        base = _settled(stack, "live-nocontrol", len(nocontrol), 0)
        report = (
            f"offered {OVERLOAD:g}x capacity ({OVERLOAD * _capacity_rps():.2f} req/s, prompts "
            f"{PROMPT_MIN}-{PROMPT_MAX}, {OUTPUT} output tokens), SLO TTFT <= {TTFT_S:g} s @ "
            f"{TARGET:g}; no control: {len(nocontrol)} sent, attainment "
            f"{base['attainment_ratio']:.3f} (client {_client_attainment(nocontrol):.3f}), "
            f"TTFT p50/p90 {base['ttft']['p50_s']:.2f}/{base['ttft']['p90_s']:.2f} s; control: "
            f"{len(control)} sent, {len(shed)} rejected (sheddable {shed_by['sheddable']}/"
            f"{sent['sheddable']}, standard {shed_by['standard']}/{sent['standard']}), "
            f"admitted {stats['admitted']}, attainment {stats['attainment_ratio']:.3f} (client "
            f"{_client_attainment(control):.3f}), availability {stats['availability_ratio']:.3f}, "
            f"goodput {stats['good']} good; TTFT p50/p90 {stats['ttft']['p50_s']:.2f}/"
            f"{stats['ttft']['p90_s']:.2f} s; 429 predicted TTFT median "
            f"{np.median([o.body['error']['predicted'] for o in shed]):.2f} s"
        )
        last = stack.get("/api/v1/commands", target="gw-control", state="acked",
                         kind="set_admission_policy")["data"]  # fmt: skip
        model = max(last, key=lambda c: c["version"])["payload"]["policy"]["model"]
        mean_prompt = (PROMPT_MIN + PROMPT_MAX) // 2
        report += (
            f"; last policy's prefill rate {model['prefill_tokens_per_s']:.0f} tokens/s "
            f"(profile {mean_prompt * _capacity_rps():.0f})"
        )
        print(report)
        # The control plane counts what the client saw: the 429s as rejected (availability),
        # the rest as admitted and judged.
        assert (stats["admitted"], stats["rejected"]) == (n_ok, len(shed)), report
        assert stats["availability_ratio"] == pytest.approx(n_ok / len(control)), report
        assert base["rejected"] == 0 and base["requests"] == len(nocontrol), report
        # The loop matters: without it the same load misses the SLO; with it, it holds.
        assert base["attainment_ratio"] < TARGET, report
        assert stats["attainment_ratio"] >= TARGET, report
