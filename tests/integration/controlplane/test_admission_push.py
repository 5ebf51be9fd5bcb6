"""Admission end to end on loopback: the control plane (real HTTP, PostgreSQL) pushes a
policy, a real gateway (in front of a sim worker) applies and acknowledges it, and sheds
sheddable requests with a 429 whose body names the SLO and the latencies."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import uvicorn

from controlplane.db import utcnow
from controlplane.main import create_app
from controlplane.models import KeyRole
from controlplane.services import keys as key_service
from controlplane.settings import Settings
from exporters.admission import AdmissionPolicy
from serving.gateway import GatewayConfig
from serving.gateway import create_app as create_gateway
from serving.sim.worker.cli import SimWorkerSpec, build_worker
from serving.sim.worker.server import create_app as create_sim_worker

from .conftest import MakeKey, bearer, empty_tables

pytestmark = pytest.mark.integration

HOST = "127.0.0.1"
GATEWAY_ID = "gw-admission"


@asynccontextmanager
async def serving(app: Any, *, lifespan: str = "on") -> AsyncIterator[str]:
    """``app`` under uvicorn on a free loopback port; its base URL."""
    sock = socket.socket()
    sock.bind((HOST, 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan=lifespan))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        for _ in range(500):
            if server.started or task.done():
                break
            await asyncio.sleep(0.02)
        assert server.started, "server did not start"
        yield f"http://{HOST}:{port}"
    finally:
        server.should_exit = True
        await task


async def eventually(check: Callable[[], Awaitable[Any]], timeout_s: float = 15.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        result = await check()
        if result:
            return result
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


async def test_policy_pushed_applied_acked_and_sheddable_requests_get_429(
    postgresql_url: str,
) -> None:
    settings = Settings(
        database_url=postgresql_url, admission_interval_s=0.2, admission_policy_ttl_s=30.0
    )
    cp_app = create_app(settings)
    async with serving(cp_app) as cp_url:
        keys: dict[str, str] = {}
        async with cp_app.state.sessions() as session, session.begin():
            for role in (KeyRole.ADMIN, KeyRole.AGENT, KeyRole.VIEWER, KeyRole.INGEST):
                _, keys[role.value] = await key_service.create_key(
                    session, name=f"adm-{role.value}", role=role, tenant=None, actor="cli",
                    now=utcnow(),
                )  # fmt: skip
        admin = {"Authorization": f"Bearer {keys['admin']}"}
        try:
            async with httpx.AsyncClient(base_url=cp_url, timeout=10) as cp:
                slo = {
                    "name": "chat",
                    "selector": {"slo": "chat"},
                    "objectives": [{"metric": "ttft", "threshold_s": 0.25}],
                    "target": 0.99,
                }
                assert (await cp.post("/api/v1/slos", json=slo, headers=admin)).status_code == 201
                sock = socket.socket()
                sock.bind((HOST, 0))
                worker_port = sock.getsockname()[1]
                sock.close()
                engine, sim_settings, handoff, control = build_worker(
                    SimWorkerSpec(host=HOST, port=worker_port)
                )
                worker = create_sim_worker(engine, sim_settings, handoff, control)
                async with serving(worker) as worker_url:
                    config = GatewayConfig(
                        colocated=(worker_url,),
                        control_plane=cp_url,
                        agent_key=keys["agent"],
                        viewer_key=keys["viewer"],
                        ingest_key=keys["ingest"],
                        gateway_id=GATEWAY_ID,
                        command_poll_s=0.1,
                    )
                    gw_app = create_gateway(config)
                    async with serving(gw_app) as gw_url:
                        await check_push_and_shedding(cp, admin, gw_app, gw_url, sim_settings)
        finally:
            await empty_tables(cp_app)


async def check_push_and_shedding(
    cp: httpx.AsyncClient, admin: dict[str, str], gw_app: Any, gw_url: str, sim: Any
) -> None:
    rule = gw_app.state.gateway.admission

    async def applied() -> bool:  # the first ticks may come before the engine has the SLO
        return rule.mode() == "policy" and "chat" in rule.policy.slos

    await eventually(applied)
    policy = rule.policy
    assert policy.slos["chat"].ttft_s == 0.25 and policy.model is not None

    async def acked() -> list[dict[str, Any]]:
        page = await cp.get(
            "/api/v1/commands",
            params={"target": GATEWAY_ID, "state": "acked", "kind": "set_admission_policy"},
            headers=admin,
        )
        assert page.status_code == 200, page.text
        data: list[dict[str, Any]] = page.json()["data"]
        return [c for c in data if c["version"] == policy.version]

    (first,) = await eventually(acked)
    assert first["ack"]["ok"] is True
    assert first["ack"]["detail"].startswith("admission policy version ")
    assert first["payload"]["policy"]["slos"]["chat"]["ttft_s"] == 0.25
    audit = await cp.get("/api/v1/audit", params={"target_id": first["id"]}, headers=admin)
    assert audit.status_code == 200, audit.text
    entries = {(e["actor"], e["action"]) for e in audit.json()["data"]}
    assert ("controlplane:admission", "command.issue") in entries
    assert any(action == "command.ack" for _, action in entries)

    # A 2,000-token prompt: TTFT predicted at least 2000 / prefill rate (10,000 tokens/s
    # before any data) = 0.2 s + the 0.02 s hand-off: within the 0.25 s objective on an idle
    # instance (feasible), over the sheddable class's 0.7 x 0.25 = 0.175 s.
    body = {"model": sim.served_model_name, "prompt": [1] * 2000, "max_tokens": 4}
    async with httpx.AsyncClient(base_url=gw_url, timeout=30) as gw:
        shed = await gw.post(
            "/v1/completions",
            json=body,
            headers={"x-goodput-slo": "chat", "x-goodput-priority": "sheddable"},
        )
        assert shed.status_code == 429, shed.text
        assert int(shed.headers["retry-after"]) >= 1
        error = shed.json()["error"]
        assert (error["code"], error["type"], error["slo"], error["objective"]) == (
            429, "rate_limited", "chat", "ttft")  # fmt: skip
        assert error["allowed"] == pytest.approx(0.175) and error["predicted"] >= 0.2
        message = error["message"]
        assert message.startswith("slo 'chat': predicted TTFT ")
        assert "> allowed 0.175 s (0.25 s objective x 0.70 margin; priority 'sheddable'" in message
        served = await gw.post(
            "/v1/completions",
            json=body,
            headers={"x-goodput-slo": "chat", "x-goodput-priority": "critical"},
        )
        assert served.status_code == 200, served.text
        assert served.json()["usage"]["completion_tokens"] == 4
        metrics = (await gw.get("/metrics")).text
        health = (await gw.get("/health")).json()
        assert health["admission"]["mode"] == "policy"
        assert health["admission"]["policy_version"] >= policy.version
    assert 'goodput_gateway_admission_mode{mode="policy"} 1.0' in metrics
    assert (
        'goodput_gateway_admission_rejections_total{priority="sheddable",reason="ttft"} 1.0'
        in metrics
    )

    # The rejection reaches the control plane and counts against the SLO's availability.
    async def rejected() -> dict[str, Any] | None:
        stats = await cp.get("/api/v1/slos/chat/goodput", params={"window": "5m"}, headers=admin)
        assert stats.status_code == 200, stats.text
        body: dict[str, Any] = stats.json()
        return body if body["rejected"] >= 1 and body["admitted"] >= 1 else None

    stats = await eventually(rejected)
    assert stats["availability_ratio"] == pytest.approx(0.5)


async def test_operators_issue_full_policies_and_bad_fields_are_named(
    client: httpx.AsyncClient, make_key: MakeKey, operator_headers: dict[str, str]
) -> None:
    agent = bearer(await make_key(KeyRole.AGENT, name="adm-agent"))
    member = {"id": GATEWAY_ID, "kind": "gateway", "endpoint": "http://127.0.0.1:9"}
    registered = await client.post("/api/v1/fleet/register", json=member, headers=agent)
    assert registered.status_code == 200, registered.text
    policy = {
        "version": 1,
        "ttl_s": 30,
        "fallback_max_concurrency": 16,
        "classes": {"sheddable": {"shed_order": 0, "sheddable": True, "ttft_s": None,
                                  "headroom_ratio": 0.6}},
        "slos": {"chat": {"ttft_s": 0.5, "itl_s": 0.05, "burn_rate": 2.0, "margin_ratio": 0.8}},
        "model": {"prefill_tokens_per_s": 9000.0, "max_decode_batch": 64},
        "tenant_weights": {"acme": 2.0},
        "over_share_ratio": 0.5,
    }  # fmt: skip
    body = {"kind": "set_admission_policy", "target": GATEWAY_ID, "payload": {"policy": policy}}
    issued = await client.post("/api/v1/commands", json=body, headers=operator_headers)
    assert issued.status_code == 201, issued.text
    (delivered,) = (await client.get(f"/api/v1/fleet/{GATEWAY_ID}/commands", headers=agent)).json()[
        "data"
    ]
    wire = AdmissionPolicy.from_json(delivered["payload"]["policy"])
    assert wire.slos["chat"].margin_ratio == 0.8 and wire.tenant_weights == {"acme": 2.0}
    assert wire.model is not None and wire.model.max_decode_batch == 64
    assert wire.classes["sheddable"].headroom_ratio == 0.6
    policy["slos"]["chat"]["margin_ratio"] = 1.5  # type: ignore[index]
    refused = await client.post("/api/v1/commands", json=body, headers=operator_headers)
    assert refused.status_code == 422
    (error,) = [e for e in refused.json()["detail"] if e["loc"][-1] == "margin_ratio"]
    assert error["loc"][-5:] == ["payload", "policy", "slos", "chat", "margin_ratio"]
    assert error["msg"].endswith("policy.slos.chat.margin_ratio must be <= 1.0, got 1.5")
