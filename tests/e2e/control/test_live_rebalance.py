"""Live check (issue 6): a forced imbalance on a running PD stack makes the planner move a
worker, and the move — drain, set_role, resume — is persisted with its evidence and
prediction, delivered, executed by the worker's agent and acknowledged, the gateway routes
by the new roles, and not one request fails while it happens.

The imbalance: three sim workers (H100, Llama-3.1-8B; each can serve either phase, as
vLLM's ``kv_both`` connectors can) started as one prefill and two decode workers, under a
prompt-heavy open loop (long prompts, short outputs) at 90 % of one prefill worker's
capacity — the lone prefill worker queues and TTFTs grow while the decode workers idle.
The control plane's planner ticks every second with a short dwell; admission is off (the
gateway refuses nothing, so every request must come back 200 and whole).
"""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from serving.sim.latency_model import LatencyModel
from serving.workers.load import metric_sum

from .conftest import PROFILE, GatewaySpec, control_stack, open_loop

pytestmark = pytest.mark.e2e

TTFT_S, ITL_S, TARGET = 0.5, 0.05, 0.9
PROMPT_MIN, PROMPT_MAX, OUTPUT = 6000, 10000, 4
LOAD = 0.9  # offered load ÷ one prefill worker's capacity at the mean prompt
DURATION_S = 32.0  # seconds of arrivals; the move happens inside them
PAUSED_S = 12.0  # the planner is paused for the first seconds of them
SETTINGS = {
    "GOODPUT_ADMISSION_ENABLED": "false",
    "GOODPUT_PLANNER_INTERVAL_S": "1",
    "GOODPUT_PLANNER_MIN_DWELL_S": "5",
    "GOODPUT_PLANNER_OBSERVE_AFTER_S": "5",
    "GOODPUT_PLANNER_DRAIN_TIMEOUT_S": "30",
}


def _prefill_rate_rps() -> float:
    mean_prompt = (PROMPT_MIN + PROMPT_MAX) // 2
    return 1.0 / LatencyModel.for_profile(PROFILE).prefill_s([mean_prompt])


def _profile_rate() -> float:
    """Prompt tokens/s of one prefill worker at the mean prompt, by the profile."""
    return (PROMPT_MIN + PROMPT_MAX) // 2 * _prefill_rate_rps()


def _local_prompt_tokens(url: str) -> float:
    """Prompt tokens the worker prefilled itself (a decode leg's prompt arrives as KV)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return metric_sum(text, "vllm:prompt_tokens_by_source_total", source="local_compute")


def _uuid(value: str) -> str:
    """The hyphenated form (SQLite stores UUIDs as 32 hex digits)."""
    return str(uuid.UUID(value))


def _command_rows(db: Path, move_id: str) -> list[dict[str, Any]]:
    """The move's commands as persisted (the API shows their state, the row also holds the
    evidence and the predicted effect)."""
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        rows = conn.execute(
            "SELECT * FROM command WHERE replace(move_id, '-', '') = ? ORDER BY created_at",
            (move_id.replace("-", ""),),
        ).fetchall()
    return [dict(r) for r in rows]


def test_forced_imbalance_moves_a_decode_worker_to_prefill_without_failures(
    tmp_path: Path,
) -> None:
    with control_stack(
        tmp_path, settings=SETTINGS, roles=("prefill", "decode", "decode"),
        gateways=(GatewaySpec("gw-planner"),), sim_config="jitter=0.02",
    ) as stack:  # fmt: skip
        stack.post(
            "/api/v1/slos",
            {"name": "live-pd", "selector": {"model": "llama-3.1-8b"}, "vantage": "gateway",
             "objectives": [{"metric": "ttft", "threshold_s": TTFT_S},
                            {"metric": "itl", "threshold_s": ITL_S}],
             "target": TARGET, "window_s": 3600},
        )  # fmt: skip

        def registered() -> dict[str, str] | None:  # agents register shortly after /health
            members = stack.get("/api/v1/fleet", kind="worker")["data"]
            ready = {m["id"]: m["role"] for m in members if m["state"] == "ready"}
            return ready if len(ready) == len(stack.workers) else None

        roles = stack.eventually(registered, "every worker registered")
        decode_ids = sorted(i for i, r in roles.items() if r == "decode")
        assert len(decode_ids) == 2 and list(roles.values()).count("prefill") == 1, roles
        before = {i: _local_prompt_tokens(stack.workers[i]) for i in decode_ids}
        # The imbalance first builds up with the planner paused (an operator's switch); then
        # automation resumes and the planner acts on what it has seen.
        stack.post("/api/v1/automation/pause", {"reason": "e2e: let the imbalance build"})
        t0 = time.monotonic()
        with ThreadPoolExecutor(1) as pool:
            traffic = pool.submit(
                open_loop, stack.gateways["gw-planner"], rate_rps=LOAD * _prefill_rate_rps(),
                duration_s=DURATION_S, max_tokens=OUTPUT, seed=3,
                prompt_tokens=lambda rng: int(rng.integers(PROMPT_MIN, PROMPT_MAX + 1)),
                headers_of=lambda k: ("standard", {}),
            )  # fmt: skip
            time.sleep(PAUSED_S)
            assert not stack.get("/api/v1/automation/moves")["data"]  # paused: nothing moves
            stack.post("/api/v1/automation/resume", {"reason": "e2e: rebalance"})
            timeline: list[tuple[float, str]] = [(time.monotonic() - t0, "automation resumed")]

            def moved() -> dict[str, Any] | None:
                for move in stack.get("/api/v1/automation/moves")["data"]:
                    event = f"move {move['member_id']} {move['from_role']}->{move['to_role']}"
                    event += f" {move['state']}"
                    if not timeline or timeline[-1][1] != event:
                        timeline.append((time.monotonic() - t0, event))
                    if move["state"] == "done":
                        return dict(move)
                    assert move["state"] in ("draining", "switching"), move
                return None

            move = stack.eventually(moved, "a finished role move", timeout_s=DURATION_S + 20)
            outcomes = traffic.result()
        stack.check_alive()
        member = move["member_id"]

        # Nothing failed, before, during or after the move.
        failed = [(o.index, o.status, o.body) for o in outcomes if o.status != 200]
        assert not failed and all(o.complete for o in outcomes), failed[:5]

        # The move helps: requests sent after it see shorter TTFTs than those sent before it.
        done_at = next(t for t, e in timeline if e.endswith(" done"))
        drain_at = next((t for t, e in timeline if e.endswith(" draining")), done_at)
        during = sum(o.sent_s <= done_at and o.end_s >= drain_at for o in outcomes)
        ttft_before = np.median([o.ttft_s for o in outcomes if o.sent_s < PAUSED_S])
        ttft_after = np.median([o.ttft_s for o in outcomes if o.sent_s > done_at + 2.0])
        assert ttft_after < ttft_before, (ttft_before, ttft_after)

        # The move: a decode worker to prefill, chosen and predicted by the planner.
        assert (move["from_role"], move["to_role"], move["source"]) == (
            "decode", "prefill", "planner")  # fmt: skip
        assert member in decode_ids
        assert move["evidence"] and move["predicted_effect"], move
        # Its commands: persisted with the move's evidence and prediction, each delivered,
        # executed by the worker's agent and acknowledged, in the order drain, set_role, resume.
        rows = _command_rows(stack.directory / "goodput.db", move["id"])
        assert [r["kind"] for r in rows] == ["drain", "set_role", "resume"], rows
        for row in rows:
            assert row["target"] == member and row["state"] == "acked", row
            assert json.loads(row["evidence"]) and json.loads(row["predicted_effect"]), row
            public = stack.get(f"/api/v1/commands/{row['id']}")
            assert public["ack"]["ok"] is True and public["delivered_at"], public
        assert json.loads(rows[1]["payload"])["role"] == "prefill"

        # The registry and the worker agree on the new role; the gateway sends it prefill legs.
        fleet = stack.get(f"/api/v1/fleet/{member}")
        assert (fleet["role"], fleet["state"]) == ("prefill", "ready"), fleet
        sim = httpx.get(f"{stack.workers[member]}/sim", timeout=10).json()
        assert sim["role"] == "prefill", sim
        after = {i: _local_prompt_tokens(stack.workers[i]) for i in decode_ids}
        assert after[member] > before[member], (before, after)
        other = next(i for i in decode_ids if i != member)
        assert after[other] == before[other], (before, after)  # still decoding only

        # The observed effect is recorded beside the prediction a few seconds later.
        done = stack.eventually(
            lambda: (
                (m := stack.get(f"/api/v1/automation/moves/{move['id']}"))["observed_effect"] and m
            ),
            "the observed effect",
            timeout_s=20,
        )
        stats = stack.get("/api/v1/slos/live-pd/goodput", window="1h")
        ev = move["evidence"]
        audit = sorted(
            (e["action"], e["actor"])
            for target in [move["id"], *(r["id"] for r in rows)]
            for e in stack.get("/api/v1/audit", "admin", target_id=_uuid(target))["data"]
        )
        actions = [action for action, _ in audit]
        assert ("move.start", "planner") in audit, audit
        assert actions.count("command.issue") == actions.count("command.ack") == 3, audit
        print(
            f"{len(outcomes)} requests at {LOAD * _prefill_rate_rps():.2f} req/s (prompts "
            f"{PROMPT_MIN}-{PROMPT_MAX}, {OUTPUT} output tokens), 0 failed, {during} in flight "
            f"during the move; timeline "
            f"{[(round(t, 1), e) for t, e in timeline]}; commands "
            f"{[(r['kind'], r['state'], r['attempts']) for r in rows]}; evidence: demand "
            f"{ev['demand']['prompt_tokens_per_s']:.0f} prompt tokens/s, queued "
            f"{ev['queued_prefill_tokens']:.0f}, prefill rate {ev['prefill_rate_tokens_per_s']:.0f}"
            f" tokens/s (profile {_profile_rate():.0f}), TTFT correction {ev['ttft_correction']:g}"
            f"; client TTFT median "
            f"{ttft_before:.2f} s before the move, {ttft_after:.2f} s after; predicted "
            f"{json.dumps(move['predicted_effect'])[:400]}; observed "
            f"{json.dumps(done['observed_effect'])[:400]}; control plane: {stats['requests']} "
            f"judged, {stats['errors']} errors, attainment {stats['attainment_ratio']:.3f}; "
            f"audit {audit}"
        )
        assert stats["errors"] == 0, stats
        # One move fixed it: the planner did not move anything back (hysteresis, dwell).
        moves = stack.get("/api/v1/automation/moves")["data"]
        assert [m["id"] for m in moves] == [move["id"]], moves
