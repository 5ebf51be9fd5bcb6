"""The planner's pipeline end to end, on PostgreSQL and SQLite, with real worker agents over
loopback HTTP: records ingested → planner tick → a role move's commands persisted with the
evidence and the prediction → delivered → acknowledged → switched → observed effect
recorded beside the prediction; pausing stops it, pins hold, every step is audited."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import pytest
import pytest_asyncio
import sqlalchemy as sa
import uvicorn
from fastapi import FastAPI

from controlplane.models import Command, KeyRole
from controlplane.settings import Settings
from exporters.commands import CommandKind
from exporters.records import Labels, RecordBatch, RequestRecord, Vantage
from exporters.wire import CONTENT_TYPE_BINARY, encode_batch
from serving.workers.agent import Agent, AgentReport, AgentSettings

from .conftest import MakeKey, bearer

pytestmark = pytest.mark.integration

AUTOMATION = "/api/v1/automation"


@pytest.fixture
def settings(database_url: str) -> Settings:
    # The loop never fires by itself here (the tests tick through the API); no dwell, the
    # effect is observed at once after a move, and a busy worker switches 2 s after its
    # drain was acknowledged.
    return Settings(
        database_url=database_url,
        planner_interval_s=3600.0,
        planner_min_dwell_s=0.0,
        planner_observe_after_s=0.05,
        planner_drain_timeout_s=2.0,
    )


@dataclass
class Worker:
    """The worker side of the agent contract: a role, a drain flag, what it applied."""

    role: str
    draining: bool = False
    running: int = 0  # requests in flight: a draining worker stays "draining" while > 0
    refuse: frozenset[CommandKind] = frozenset()
    applied: list[tuple[CommandKind, dict[str, Any]]] = field(default_factory=list)

    def report(self) -> AgentReport:
        state = ("draining" if self.running else "drained") if self.draining else "ready"
        load = {"num_requests_running": self.running, "num_requests_waiting": 0}
        return AgentReport(self.role, state, load)

    def apply(self, kind: CommandKind, payload: Mapping[str, Any]) -> str:
        if kind in self.refuse:
            raise RuntimeError(f"{kind.value} refused by this worker")
        self.applied.append((kind, dict(payload)))
        if kind is CommandKind.DRAIN:
            self.draining = True
        elif kind is CommandKind.RESUME:
            self.draining = False
        elif kind is CommandKind.SET_ROLE:
            self.role = str(payload["role"])
        return f"{kind.value} applied"


@dataclass
class Fleet:
    workers: dict[str, Worker]
    agents: dict[str, Agent]

    async def step(self) -> None:
        for agent in self.agents.values():
            await asyncio.to_thread(agent.step)


@pytest_asyncio.fixture(loop_scope="function")
async def fleet(app: FastAPI, make_key: MakeKey) -> AsyncIterator[Fleet]:
    """One prefill and three decode workers, each with a real agent over loopback HTTP."""
    key = await make_key(KeyRole.AGENT, name="planner-agents")
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    workers = {"p0": Worker("prefill")} | {f"d{k}": Worker("decode") for k in range(3)}
    agents = {
        name: Agent(
            AgentSettings(
                url=f"http://127.0.0.1:{port}",
                member_id=name,
                endpoint=f"http://10.0.0.{k}:8100",
                key=key,
            ),
            report=worker.report,
            apply=worker.apply,
        )
        for k, (name, worker) in enumerate(workers.items())
    }
    try:
        for _ in range(200):
            if server.started:
                break
            await asyncio.sleep(0.02)
        assert server.started
        fleet = Fleet(workers, agents)
        await fleet.step()  # every agent registers
        yield fleet
    finally:
        for agent in agents.values():
            await asyncio.to_thread(agent.stop)
        server.should_exit = True
        await serving


def prefill_heavy(n: int = 600) -> RecordBatch:
    """``n`` requests of 1500-token prompts arriving 100 ms apart over the last minute, 3
    output tokens each: 15k prompt tokens/s, more than one prefill instance serves (the
    learner's prior: 10k tokens/s) and fewer than two."""
    start = time.time_ns() - 65_000_000_000
    return RecordBatch.from_records(
        [
            RequestRecord(
                request_id=f"r{k}",
                vantage=Vantage.GATEWAY,
                arrival_time_ns=start + k * 100_000_000,
                labels=Labels(model="llama"),
                prompt_tokens=1500,
                emission_offsets_us=np.array([300_000, 320_000, 340_000]),
            )
            for k in range(n)
        ]
    )


@pytest_asyncio.fixture(loop_scope="function")
async def demand(
    app: FastAPI, client: httpx.AsyncClient, admin_headers: dict[str, str], make_key: MakeKey
) -> None:
    """An SLO (TTFT ≤ 0.5 s, ITL ≤ 50 ms) and a prefill-heavy minute of gateway records,
    through the real ingest route."""
    slo = {
        "name": "chat",
        "selector": {"model": "llama"},
        "objectives": [
            {"metric": "ttft", "threshold_s": 0.5},
            {"metric": "itl", "threshold_s": 0.05},
        ],
        "target": 0.9,
        "window_s": 86_400,
    }
    response = await client.post("/api/v1/slos", json=slo, headers=admin_headers)
    assert response.status_code == 201, response.text
    await app.state.live.refresh_slos()
    headers = {**bearer(await make_key(KeyRole.INGEST)), "Content-Type": CONTENT_TYPE_BINARY}
    body = encode_batch(prefill_heavy(), exporter_id="gw-0", seq=0)
    response = await client.post("/api/v1/ingest", content=body, headers=headers)
    assert response.status_code == 200, response.text


async def tick(client: httpx.AsyncClient, headers: dict[str, str]) -> dict[str, Any]:
    response = await client.post(f"{AUTOMATION}/tick", headers=headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def move_of(client: httpx.AsyncClient, headers: dict[str, str], move_id: str) -> Any:
    response = await client.get(f"{AUTOMATION}/moves/{move_id}", headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


async def commands_of(app: FastAPI, move_id: str) -> list[Command]:
    async with app.state.sessions() as session:
        rows = await session.scalars(
            sa.select(Command)
            .where(Command.move_id == uuid.UUID(move_id))
            .order_by(Command.created_at)
        )
        return list(rows)


async def test_tick_to_observed_effect(
    app: FastAPI,
    client: httpx.AsyncClient,
    operator_headers: dict[str, str],
    admin_headers: dict[str, str],
    fleet: Fleet,
    demand: None,
) -> None:
    first = await tick(client, operator_headers)
    assert first["paused"] is False
    assert len(first["moves_started"]) == 1, first["reason"]
    move_id = first["moves_started"][0]
    move = await move_of(client, operator_headers, move_id)
    assert (move["from_role"], move["to_role"], move["state"]) == ("decode", "prefill", "draining")
    assert move["member_id"] == "d0"  # all equally idle: the first by id
    assert move["evidence"]["demand"]["prompt_tokens_per_s"] > 0
    assert move["evidence"]["pools"] == {"prefill": 1.0, "decode": 3.0}
    assert move["predicted_effect"]["after"]["num_prefill"] == 2.0
    (drain,) = await commands_of(app, move_id)
    assert drain.kind == "drain" and drain.state.value == "pending"
    assert drain.evidence == move["evidence"] and drain.predicted_effect == move["predicted_effect"]

    # The agent polls, applies and acks the drain; its next heartbeat says drained.
    await fleet.step()
    await fleet.step()
    assert fleet.workers["d0"].draining
    assert [k for k, _ in fleet.workers["d0"].applied] == [CommandKind.DRAIN]
    second = await tick(client, operator_headers)
    assert second["moves_started"] == [] and second["moves_advanced"] == 1
    assert (await move_of(client, operator_headers, move_id))["state"] == "switching"

    await fleet.step()  # set_role then resume, in that order; acked
    assert [k for k, _ in fleet.workers["d0"].applied] == [
        CommandKind.DRAIN,
        CommandKind.SET_ROLE,
        CommandKind.RESUME,
    ]
    assert fleet.workers["d0"].role == "prefill" and not fleet.workers["d0"].draining
    await fleet.step()  # re-registers with its new role
    await tick(client, operator_headers)
    done = await move_of(client, operator_headers, move_id)
    assert done["state"] == "done" and done["observe_at"] is not None
    await asyncio.sleep(0.1)
    await tick(client, operator_headers)
    observed = (await move_of(client, operator_headers, move_id))["observed_effect"]
    assert observed["pools"] == {"prefill": 2, "decode": 2, "both": 0}
    assert observed["predicted_goodput_rps"] == move["predicted_effect"]["after"]["goodput_rps"]
    assert [s["slo"] for s in observed["slos"]] == ["chat"]
    # The same two figures on /metrics, for the pool the move went to.
    text = (await client.get("/metrics", headers=operator_headers)).text
    assert samples(text, "goodput_planner_move_predicted_goodput_rps") == {
        "prefill": pytest.approx(observed["predicted_goodput_rps"])
    }
    assert samples(text, "goodput_planner_move_observed_goodput_rps") == {
        "prefill": pytest.approx(observed["observed_goodput_rps"])
    }
    for command in await commands_of(app, move_id):
        assert command.state.value == "acked"
        assert command.observed_effect is not None
        assert command.observed_effect["observed"] == observed
        assert command.observed_effect["ack"]["ok"] is True
    fleet_row = await client.get("/api/v1/fleet/d0", headers=operator_headers)
    assert fleet_row.json()["role"] == "prefill"

    # Audited: the move (by the planner), its three commands and their acknowledgements.
    ids = {str(c.id) for c in await commands_of(app, move_id)}
    audit = await client.get("/api/v1/audit", params={"limit": 500}, headers=admin_headers)
    entries = audit.json()["data"]
    starts = [e for e in entries if e["action"] == "move.start"]
    assert [(e["actor"], e["target_id"]) for e in starts] == [("planner", move_id)]
    on_commands = sorted(e["action"] for e in entries if e["target_id"] in ids)
    assert on_commands == ["command.ack"] * 3 + ["command.issue"] * 3


async def test_paused_planner_issues_nothing(
    app: FastAPI,
    client: httpx.AsyncClient,
    operator_headers: dict[str, str],
    admin_headers: dict[str, str],
    viewer_headers: dict[str, str],
    fleet: Fleet,
    demand: None,
) -> None:
    paused = await client.post(
        f"{AUTOMATION}/pause", json={"reason": "maintenance"}, headers=operator_headers
    )
    assert paused.status_code == 200 and paused.json()["paused"] is True
    result = await tick(client, operator_headers)
    assert result["paused"] is True and result["moves_started"] == []
    assert result["reason"] == "paused: maintenance"
    async with app.state.sessions() as session:
        assert await session.scalar(sa.select(sa.func.count()).select_from(Command)) == 0
    status = (await client.get(AUTOMATION, headers=viewer_headers)).json()
    assert status["planner"]["paused"] is True and status["enabled"] is True
    resumed = await client.post(f"{AUTOMATION}/resume", json={}, headers=operator_headers)
    assert resumed.json()["paused"] is False
    assert len((await tick(client, operator_headers))["moves_started"]) == 1
    audit = await client.get(
        "/api/v1/audit", params={"target_type": "automation"}, headers=admin_headers
    )
    assert [e["action"] for e in audit.json()["data"]] == ["automation.resume", "automation.pause"]


async def test_pinned_members_are_never_moved(
    client: httpx.AsyncClient, operator_headers: dict[str, str], fleet: Fleet, demand: None
) -> None:
    for name in ("d0", "d1"):
        response = await client.put(
            f"{AUTOMATION}/pins/{name}", json={"role": "decode"}, headers=operator_headers
        )
        assert response.status_code == 201, response.text
    first = await tick(client, operator_headers)
    (move_id,) = first["moves_started"]
    assert (await move_of(client, operator_headers, move_id))["member_id"] == "d2"
    # d2 is moving and d0, d1 are pinned: nothing else may move, tick after tick.
    for _ in range(3):
        assert (await tick(client, operator_headers))["moves_started"] == []
    moves = await client.get(f"{AUTOMATION}/moves", headers=operator_headers)
    assert [m["member_id"] for m in moves.json()["data"]] == ["d2"]


async def test_a_refused_drain_fails_the_move(
    app: FastAPI,
    client: httpx.AsyncClient,
    operator_headers: dict[str, str],
    fleet: Fleet,
    demand: None,
) -> None:
    fleet.workers["d0"].refuse = frozenset({CommandKind.DRAIN})
    (move_id,) = (await tick(client, operator_headers))["moves_started"]
    await fleet.step()  # the agent acks the drain with ok=false
    after = await tick(client, operator_headers)
    move = await move_of(client, operator_headers, move_id)
    assert (move["state"], move["detail"]) == ("failed", "drain failed")
    assert [c.kind for c in await commands_of(app, move_id)] == ["drain"]  # nothing more
    assert fleet.workers["d0"].role == "decode" and not fleet.workers["d0"].draining
    # A failed move counts as a role change for the dwell time (0 s here), so the same
    # tick may try again; with the default 60 s a refusing worker is retried once a minute.
    (retry,) = after["moves_started"]
    assert (await move_of(client, operator_headers, retry))["member_id"] == "d0"


async def test_a_busy_worker_switches_after_the_drain_timeout(
    client: httpx.AsyncClient, operator_headers: dict[str, str], fleet: Fleet, demand: None
) -> None:
    for worker in fleet.workers.values():
        worker.running = 3  # streams that keep running: never drained
    (move_id,) = (await tick(client, operator_headers))["moves_started"]
    await fleet.step()
    await fleet.step()
    await tick(client, operator_headers)  # acknowledged just now: still draining
    assert (await move_of(client, operator_headers, move_id))["state"] == "draining"
    await asyncio.sleep(2.2)
    await tick(client, operator_headers)
    move = await move_of(client, operator_headers, move_id)
    assert (move["state"], move["detail"]) == ("switching", "drain timed out; switching")
    await fleet.step()
    await tick(client, operator_headers)
    assert (await move_of(client, operator_headers, move_id))["state"] == "done"
    moved = fleet.workers[move["member_id"]]
    assert moved.role == "prefill" and moved.running == 3  # its streams carried on


def samples(text: str, name: str) -> dict[str, float]:
    """``{label value: value}`` of a one-label family in a /metrics text."""
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            out[labels.split('"')[1]] = float(value)
    return out


async def test_metrics_show_moves_and_the_last_prediction(
    client: httpx.AsyncClient,
    operator_headers: dict[str, str],
    fleet: Fleet,
    demand: None,
) -> None:
    before = (await client.get("/metrics", headers=operator_headers)).text
    assert samples(before, "goodput_planner_moves_total") == {
        "prefill": 0.0,
        "decode": 0.0,
        "both": 0.0,
    }
    assert "# TYPE goodput_planner_predicted_goodput_rps gauge" in before
    assert samples(before, "goodput_planner_predicted_goodput_rps") == {}  # no tick yet
    (move_id,) = (await tick(client, operator_headers))["moves_started"]
    predicted = (await move_of(client, operator_headers, move_id))["predicted_effect"]
    after = (await client.get("/metrics", headers=operator_headers)).text
    assert samples(after, "goodput_planner_moves_total")["prefill"] == 1.0
    gauges = samples(after, "goodput_planner_predicted_goodput_rps")
    assert gauges["current"] == pytest.approx(predicted["before"]["goodput_rps"])
    assert gauges["target"] == pytest.approx(predicted["after"]["goodput_rps"])
    assert gauges["best"] == pytest.approx(predicted["best"]["goodput_rps"])
