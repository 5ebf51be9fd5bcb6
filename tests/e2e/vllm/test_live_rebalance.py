"""Live loops on real vLLM (issue 13): a forced imbalance — all long prompts, one prefill
worker — makes the planner move a vLLM worker decode → prefill while requests are in
flight. The drain waits for them, no request fails, the command chain (drain → set_role →
resume) is persisted with evidence and predicted effect, delivered, acked and audited, the
gateway routes prefill legs to the moved worker, and the observed effect is recorded.

The session's two workers (prefill on core 0, decode on core 1) plus a third vLLM decode
worker on core 1, started here and stopped at the end (the planner keeps one worker per
pool, so a move needs a second decode worker). The session pair is pinned to its roles
for the test, so the third worker is the one that moves and the pair is as it was after.
The gateway takes no commands (no admission: every request must come back 200). The load
is relative to a baseline measured first: 1.2x the requests per second one prefill worker
serves at its idle TTFT; the planner is paused for the first seconds so the imbalance
builds, then resumed.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from exporters.fleet import PoolRole
from goodput.demo_client import OpenLoop, closed_loop
from serving.workers import AgentSettings, SupervisorSettings, VllmSpec, WorkerSupervisor
from serving.workers.load import metric_sum

from .conftest import ENGINE_NICE, HEARTBEAT_S, ControlPlane, PDPair, free_port
from .live_stack import api, eventually, gateways, post

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

PROMPT, OUTPUT = (1000, 1500), 8
LOAD = 1.2  # offered ÷ (1 / idle TTFT)
PAUSED_S, DURATION_S = 10.0, 40.0


@pytest.fixture
def third_worker(
    tiny_model: Path, control_plane: ControlPlane, pd_pair: PDPair, tmp_path: Path
) -> Iterator[WorkerSupervisor]:
    port = free_port()
    spec = VllmSpec(
        model=tiny_model, port=port, cpu=1, kv_dir=pd_pair.kv_dir, served_model_name="tiny",
        nice=ENGINE_NICE, sched_idle=True,
        engine_env={"GOODPUT_CONTROL_PLANE_URL": control_plane.url,
                    "GOODPUT_INGEST_KEY": control_plane.keys["ingest"]},
    )  # fmt: skip
    agent = AgentSettings(
        url=control_plane.url, key=control_plane.keys["agent"], member_id=f"127.0.0.1:{port}",
        endpoint=spec.url, model="tiny", heartbeat_interval_s=HEARTBEAT_S,
    )  # fmt: skip
    settings = SupervisorSettings(health_interval_s=0.5, backoff_initial_s=0.5, load_interval_s=1.0)
    worker = WorkerSupervisor(spec, run_dir=tmp_path / "third", role=PoolRole.DECODE,
                              settings=settings, agent=agent)  # fmt: skip
    worker.start()
    try:
        worker.wait_ready(600.0)
        yield worker
    finally:
        worker.stop()


def _member(url: str) -> str:
    return url.removeprefix("http://")


def test_forced_imbalance_moves_a_vllm_decode_worker_to_prefill_under_traffic(
    control_plane: ControlPlane, pd_pair: PDPair, third_worker: WorkerSupervisor,
    tmp_path: Path,
) -> None:  # fmt: skip
    third = _member(third_worker.spec.url)
    pinned = {_member(pd_pair.prefill.spec.url): "prefill",
              _member(pd_pair.decode.spec.url): "decode"}  # fmt: skip

    def registered() -> bool:
        members = {m["id"]: m for m in control_plane.fleet()}
        return all(members.get(m, {}).get("state") == "ready" for m in (*pinned, third))

    eventually(registered, "the three workers ready in the registry", timeout_s=60)
    post(control_plane, "/api/v1/automation/pause", {"reason": "e2e: let the imbalance build"})
    for member, role in pinned.items():
        response = httpx.put(
            f"{control_plane.url}/api/v1/automation/pins/{member}",
            json={"role": role, "reason": "e2e: the session pair keeps its roles"},
            headers=control_plane.headers("admin"), timeout=10,
        )  # fmt: skip
        assert response.status_code in (200, 201), response.text
    statics = ["--prefill", pd_pair.prefill.spec.url, "--decode", pd_pair.decode.spec.url,
               "--decode", third_worker.spec.url]  # fmt: skip
    try:
        with gateways(control_plane, tmp_path, statics, {"gw-rebalance": False}) as gw:
            _check_move(control_plane, gw["gw-rebalance"], third)
    finally:
        for member in pinned:
            httpx.delete(f"{control_plane.url}/api/v1/automation/pins/{member}",
                         headers=control_plane.headers("admin"), timeout=10)  # fmt: skip
        post(control_plane, "/api/v1/automation/resume", {"reason": "e2e: done"})


def _check_move(control_plane: ControlPlane, url: str, third: str) -> None:
    mean = sum(PROMPT) // 2
    closed_loop(url, model="tiny", slo="rebalance", count=2, prompt_tokens=mean,
                max_tokens=OUTPUT, id_prefix="rebalance-warm")  # fmt: skip
    idle = closed_loop(url, model="tiny", slo="rebalance", count=5, prompt_tokens=mean,
                       max_tokens=OUTPUT, id_prefix="rebalance-idle")  # fmt: skip
    idle_ttft = statistics.median(o.ttft_s or 1.0 for o in idle)
    post(control_plane, "/api/v1/slos", {
        "name": "live-rebalance", "selector": {"slo": "rebalance"}, "vantage": "gateway",
        "objectives": [{"metric": "ttft", "threshold_s": max(0.5, 3 * idle_ttft)}],
        "target": 0.9, "window_s": 3600,
    })  # fmt: skip
    rate = LOAD / idle_ttft
    loop = OpenLoop(url, "tiny", "rebalance", rate, PROMPT, OUTPUT, mix={"standard": 1.0},
                    seed=7, id_prefix="rebalance")  # fmt: skip
    t0 = time.monotonic()
    loop.start()
    try:
        timeline: list[tuple[float, str]] = []
        time.sleep(PAUSED_S)
        assert not [m for m in api(control_plane, "/api/v1/automation/moves")["data"]
                    if m["member_id"] == third]  # fmt: skip
        post(control_plane, "/api/v1/automation/resume", {"reason": "e2e: rebalance"})
        timeline.append((time.monotonic() - t0, "automation resumed"))
        in_flight_at_drain: list[int] = []

        def moved() -> dict[str, Any] | None:
            for move in api(control_plane, "/api/v1/automation/moves", member_id=third)["data"]:
                event = f"{move['from_role']}->{move['to_role']} {move['state']}"
                if not timeline or timeline[-1][1] != event:
                    timeline.append((time.monotonic() - t0, event))
                    if move["state"] == "draining":
                        in_flight_at_drain.append(loop.in_flight())
                if move["state"] == "done":
                    return dict(move)
                assert move["state"] in ("draining", "switching"), move
            return None

        move = eventually(moved, "a finished role move", timeout_s=DURATION_S + 30)
        remaining = DURATION_S - (time.monotonic() - t0)
        time.sleep(max(remaining, 5.0))
        loop.stop(drain_s=120.0)
    finally:
        loop.stop(drain_s=5.0)  # at once when the loop already stopped
    outcomes = loop.outcomes
    failed = [(o.index, o.status, o.error) for o in outcomes if o.status != 200]
    assert not failed and all(o.complete for o in outcomes), failed[:5]
    assert (move["from_role"], move["to_role"], move["source"]) == ("decode", "prefill",
                                                                   "planner")  # fmt: skip
    assert move["evidence"] and move["predicted_effect"], move
    commands = [api(control_plane, f"/api/v1/commands/{c}") for c in move["command_ids"]]
    assert [c["kind"] for c in commands] == ["drain", "set_role", "resume"], commands
    for command in commands:
        assert command["target"] == third and command["state"] == "acked", command
        assert command["delivered_at"] and command["ack"]["ok"] is True, command
    audit = [
        (entry["action"], entry["actor"])
        for target in [move["id"], *move["command_ids"]]
        for entry in api(control_plane, "/api/v1/audit", "admin", target_id=target)["data"]
    ]
    actions = [a for a, _ in audit]
    assert ("move.start", "planner") in audit, audit
    assert actions.count("command.issue") == actions.count("command.ack") == 3, audit
    assert api(control_plane, f"/api/v1/fleet/{third}")["role"] == "prefill"
    text = httpx.get(f"http://{third}/metrics", timeout=10).text
    local = metric_sum(text, "vllm:prompt_tokens_by_source_total", source="local_compute")
    assert local > 0, "the moved worker prefilled nothing"
    done = eventually(
        lambda: (m := api(control_plane, f"/api/v1/automation/moves/{move['id']}"))[
            "observed_effect"] and m,
        "the observed effect", timeout_s=30,
    )  # fmt: skip
    print(
        f"idle TTFT {idle_ttft * 1000:.0f} ms; {len(outcomes)} requests at {rate:.2f} req/s, 0 "
        f"failed, {in_flight_at_drain[:1]} in flight when the drain was issued; timeline "
        f"{[(round(t, 1), e) for t, e in timeline]}; predicted "
        f"{str(move['predicted_effect'])[:300]}; observed {str(done['observed_effect'])[:300]}"
    )
