"""A planner move on Kubernetes, end to end on loopback: the worker's agent runs ``set_role``,
which patches its pod's ``goodput.dev/role`` label on the fake API server; the fake turns the
patch into a ``MODIFIED`` watch event, and a gateway with ``pools_from=kubernetes`` routes
the decode leg to the moved worker. The control plane is scripted (httpx.MockTransport);
the sim workers, the API server and the gateway speak real HTTP."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from exporters.commands import Command, CommandKind
from exporters.fleet import PoolRole
from exporters.sinks import InMemorySink
from serving.gateway import GatewayConfig, create_app
from serving.gateway.config import PoolSource
from serving.kubernetes_api import KubernetesAPI
from serving.sim.worker.cli import SimWorkerSpec, build_worker
from serving.sim.worker.server import create_app as create_sim_app
from serving.workers import Agent, PodRelabeler
from tests.unit.serving.gateway.fake_kubernetes import FakeKubernetes, pod, wait_for
from tests.unit.serving.gateway.test_kubernetes_watch import loopback_port, serve
from tests.unit.serving.workers.test_agent import MEMBER, SETTINGS, FakeControlPlane

pytestmark = pytest.mark.integration


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    api = FakeKubernetes().start()
    try:
        yield api
    finally:
        api.stop()


def test_set_role_relabels_the_pod_and_the_gateway_routes_to_the_new_pool(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    hosts = ("127.0.0.2", "127.0.0.3")
    port = loopback_port(*hosts)
    servers = []
    try:
        controls = []
        for host in hosts:  # both start as prefill: no decode instance yet
            spec = SimWorkerSpec(port=port, host=host, role=PoolRole.PREFILL,
                                 sim_config="jitter=0", kv_dir=tmp_path)  # fmt: skip
            parts = build_worker(spec)
            controls.append(parts[3])
            servers.append(serve(create_sim_app(*parts), host, port))
        fake.put(pod("worker-0", "prefill", ip=hosts[0]))
        fake.put(pod("worker-1", "prefill", ip=hosts[1]))
        config = GatewayConfig(pools_from=PoolSource.KUBERNETES, kubernetes_api=fake.url,
                               kubernetes_namespace="goodput", worker_port=port)  # fmt: skip
        app = create_app(config, sink=InMemorySink(), registry=CollectorRegistry(), link=False)
        gw_port = loopback_port("127.0.0.1")
        servers.append(serve(app, "127.0.0.1", gw_port))
        body = {"model": "llama-3.1-8b", "prompt": "hello " * 40, "max_tokens": 4,
                "ignore_eos": True}  # fmt: skip
        with httpx.Client(base_url=f"http://127.0.0.1:{gw_port}", timeout=30) as client:

            def roles() -> dict[str, str]:
                return {i["id"]: i["role"] for i in client.get("/health").json()["instances"]}

            wait_for(lambda: client.get("/health").json()["pools_from"]["connected"], 10, "watch")
            wait_for(lambda: len(roles()) == 2, 10, "both pods")
            assert client.post("/v1/completions", json=body).status_code == 503  # no decode

            # The planner moves worker-1 (its agent is MEMBER) to decode.
            move = Command.new(CommandKind.SET_ROLE, MEMBER, {"role": "decode"}, version=1,
                               now_ns=time.time_ns(), ttl_s=60)  # fmt: skip
            plane = FakeControlPlane(commands=[move])
            relabeler = PodRelabeler(KubernetesAPI(fake.url), namespace="goodput",
                                     pod="worker-1")  # fmt: skip
            agent = Agent(SETTINGS, report=controls[1].report, apply=controls[1].apply_command,
                          relabeler=relabeler, transport=httpx.MockTransport(plane))  # fmt: skip
            try:
                agent.step()
            finally:
                agent.stop()

            (ack,) = plane.acks
            assert ack["ok"] is True, ack
            assert controls[1].role is PoolRole.DECODE
            assert [p["name"] for p in fake.patches] == ["worker-1"]
            wait_for(lambda: roles()[f"http://{hosts[1]}:{port}"] == "decode", 10, "the move")
            assert roles() == {f"http://{hosts[0]}:{port}": "prefill",
                               f"http://{hosts[1]}:{port}": "decode"}  # fmt: skip
            answer = client.post("/v1/completions", json=body)
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["completion_tokens"] == 4
    finally:
        for server in reversed(servers):
            server.should_exit = True
