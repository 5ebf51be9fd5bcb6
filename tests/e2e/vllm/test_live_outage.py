"""Live loops on real vLLM (issue 13): the control plane goes away during traffic. The
gateway keeps serving on the last admission policy while it is younger than its TTL, then
on the static fallback cap, and says which on its metrics; when the control plane returns,
the gateway takes a new policy and every record of the outage arrives (nothing lost).

The session's control plane (admission every second, policies trusted for 10 s:
``conftest.LOOP_SETTINGS``) and its two vLLM workers behind one gateway that applies the
pushed policies. The traffic is light (a third of one prefill worker's idle capacity,
measured first), so nothing is shed and every request must come back 200.
"""

from __future__ import annotations

import functools
import statistics
import time
from pathlib import Path

import httpx
import pytest

from exporters.records import Vantage
from goodput.demo_client import OpenLoop, closed_loop
from serving.workers.load import metric_sum

from .conftest import LOOP_SETTINGS, ControlPlane, PDPair
from .live_stack import api, eventually, gateways

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

PROMPT, OUTPUT = (300, 600), 8


def _mode(url: str) -> str:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    modes = ("allow_all", "policy", "fallback")
    return next((m for m in modes if metric_sum(text, "goodput_gateway_admission_mode",
                                                   mode=m) == 1.0), "?")  # fmt: skip


def test_the_gateway_serves_through_an_outage_on_the_last_policy_then_the_cap(
    control_plane: ControlPlane, pd_pair: PDPair, tmp_path: Path
) -> None:
    statics = ["--prefill", pd_pair.prefill.spec.url, "--decode", pd_pair.decode.spec.url]
    ttl_s = LOOP_SETTINGS["admission_policy_ttl_s"]
    with gateways(control_plane, tmp_path, statics, {"gw-outage": True}) as gw:
        url = gw["gw-outage"]
        mean = sum(PROMPT) // 2
        one_at_a_time = functools.partial(
            closed_loop, url, model="tiny", slo="outage", prompt_tokens=mean, max_tokens=OUTPUT
        )
        one_at_a_time(count=2, id_prefix="outage-warm")
        idle = one_at_a_time(count=4, id_prefix="outage-idle")
        rate = 0.3 / statistics.median(o.ttft_s or 1.0 for o in idle)
        eventually(lambda: _mode(url) == "policy", "a policy at the gateway")
        version = metric_sum(
            httpx.get(f"{url}/metrics", timeout=10).text,
            "goodput_gateway_admission_policy_version",
        )
        loop = OpenLoop(url, "tiny", "outage", rate, PROMPT, OUTPUT,
                        mix={"standard": 0.5, "critical": 0.5}, seed=5,
                        id_prefix="outage")  # fmt: skip
        loop.start()
        timeline: list[tuple[float, str]] = []
        try:
            time.sleep(3.0)
            control_plane.stop()
            down_at = time.monotonic()
            timeline.append((0.0, f"control plane stopped; mode {_mode(url)}"))
            # The last policy holds for the rest of its TTL, then the fallback cap.
            eventually(lambda: _mode(url) == "fallback", "fallback mode", timeout_s=ttl_s + 15)
            timeline.append((time.monotonic() - down_at, "mode fallback"))
            time.sleep(3.0)  # serving on the cap
            served_down = sum(o.status == 200 for o in loop.outcomes)
            control_plane.start()
            timeline.append((time.monotonic() - down_at, "control plane back"))
            eventually(lambda: _mode(url) == "policy", "a policy again", timeout_s=30)
            timeline.append((time.monotonic() - down_at, "mode policy"))
            time.sleep(2.0)
        finally:
            loop.stop(drain_s=60.0)
        outcomes = loop.outcomes
        failed = [(o.index, o.status, o.error) for o in outcomes if o.status != 200]
        assert not failed and all(o.complete for o in outcomes), failed[:5]
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert metric_sum(metrics, "goodput_gateway_admission_policy_version") > version
        # Nothing lost: the gateway's record of every request reaches the control plane.
        ids = {f"outage-{o.index}" for o in outcomes}
        records = control_plane.wait_for_records(
            lambda found: ids <= {r.request_id for r in found},
            timeout_s=60.0,
            vantage=Vantage.GATEWAY,
        )
        got = [r for r in records if r.request_id in ids]
        stats = api(control_plane, "/api/v1/slos", limit=1)  # the API answers again
        print(
            f"{len(outcomes)} requests at {rate:.2f} req/s, 0 failed, {served_down} served "
            f"before the control plane came back; timeline "
            f"{[(round(t, 1), e) for t, e in timeline]}; {len(got)} gateway records "
            f"delivered after the outage; slos listed {stats['count']}"
        )
        assert timeline[0][1].endswith("mode policy"), timeline  # the last policy first
        assert timeline[1][0] >= ttl_s - 4.0, timeline  # not before the TTL had run out
