"""The gateway's pod watcher against a fake Kubernetes API server on loopback.

No cluster can run here: :mod:`fake_kubernetes` stands in for the API server, serving the
pod list and a watch stream the test writes event by event, over real HTTP. The watcher
(:class:`serving.gateway.kubernetes.PodWatcher`) keeps an :class:`InstancePool` equal to
the Ready, non-terminating worker pods, by role label: the first list, a relabel moving the
member within one event, pods leaving (not Ready, terminating, deleted), relisting on a
410 (as the watch's status and as an ``ERROR`` event) from the new resourceVersion,
skipping malformed lines, relisting after an oversized one, backing off after a failure.
Last, a gateway started with ``pools_from=kubernetes`` routes a request to sim workers the
fake API names.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
import uvicorn
from prometheus_client import CollectorRegistry

from exporters.fleet import PoolRole
from exporters.sinks import InMemorySink
from serving.gateway import GatewayConfig, InstancePool, create_app
from serving.gateway.config import PoolSource
from serving.gateway.kubernetes import KubernetesAPI, PodWatcher
from serving.sim.worker.cli import SimWorkerSpec, build_worker
from serving.sim.worker.server import create_app as create_sim_app
from tests.unit.serving.gateway.fake_kubernetes import FakeKubernetes, pod, wait_for

pytestmark = pytest.mark.integration

PORT = 8000


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    api = FakeKubernetes().start()
    try:
        yield api
    finally:
        api.stop()


class Watched:
    """A running watcher, its pool and its registry."""

    def __init__(self, fake: FakeKubernetes, **kwargs: Any) -> None:
        self.pool = InstancePool()
        self.registry = CollectorRegistry()
        api = kwargs.pop("api", KubernetesAPI(fake.url))
        self.watcher = PodWatcher(self.pool.apply_fleet, api=api, namespace="goodput",
                                  port=PORT, registry=self.registry, backoff_s=0.05,
                                  max_backoff_s=0.2, **kwargs)  # fmt: skip

    def roles(self) -> dict[str, PoolRole]:
        return {s.url: s.role for s in self.pool.states()}

    def metric(self, name: str) -> float:
        value = self.registry.get_sample_value(name)
        assert value is not None, name
        return value


async def until(check: Callable[[], bool], what: str = "", timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what or check}"
        await asyncio.sleep(0.01)


@pytest_asyncio.fixture(loop_scope="function")  # the watcher runs on the test's loop
async def watched(fake: FakeKubernetes) -> AsyncIterator[Watched]:
    fake.put(pod("prefill-a", "prefill", ip="10.0.0.1"))
    fake.put(pod("decode-a", "decode", ip="10.0.0.2"))
    fake.put(pod("starting", "decode", ip="10.0.0.9", ready=False))
    w = Watched(fake)
    w.watcher.start()
    await until(lambda: fake.num_streams == 1, "the watch")
    try:
        yield w
    finally:
        await w.watcher.stop()


def url(ip: str) -> str:
    return f"http://{ip}:{PORT}"


async def test_the_first_list_makes_the_pools_then_the_watch_follows_its_version(
    fake: FakeKubernetes, watched: Watched
) -> None:
    assert watched.roles() == {url("10.0.0.1"): PoolRole.PREFILL, url("10.0.0.2"): PoolRole.DECODE}
    (listing,) = fake.lists
    assert listing["labelSelector"] == ["app.kubernetes.io/component=worker"]
    (watch,) = fake.watches
    assert watch["resourceVersion"] == [str(fake.resource_version)]
    assert watch["allowWatchBookmarks"] == ["true"]
    assert watched.watcher.connected
    assert watched.metric("goodput_gateway_pool_watch_connected") == 1
    assert watched.metric("goodput_gateway_pool_watch_relists_total") == 1


async def test_a_relabel_moves_the_member_within_one_event(
    fake: FakeKubernetes, watched: Watched
) -> None:
    fake.send("MODIFIED", pod("prefill-a", "decode", ip="10.0.0.1"))
    await until(lambda: watched.watcher.num_events == 1, "the event")
    assert watched.roles() == {url("10.0.0.1"): PoolRole.DECODE, url("10.0.0.2"): PoolRole.DECODE}
    assert watched.watcher.resource_version == str(fake.resource_version)


@pytest.mark.parametrize("change", [{"ready": False}, {"terminating": True}, {"ip": None}], ids=str)
async def test_a_pod_leaves_when_not_ready_terminating_or_without_an_ip(
    fake: FakeKubernetes, watched: Watched, change: dict[str, Any]
) -> None:
    fake.send("MODIFIED", pod("decode-a", "decode", **{"ip": "10.0.0.2", **change}))
    await until(lambda: watched.watcher.num_events == 1, "the event")
    assert watched.roles() == {url("10.0.0.1"): PoolRole.PREFILL}
    fake.send("MODIFIED", pod("starting", "decode", ip="10.0.0.9"))  # now Ready: it joins
    await until(lambda: watched.watcher.num_events == 2, "the event")
    assert watched.roles() == {url("10.0.0.1"): PoolRole.PREFILL, url("10.0.0.9"): PoolRole.DECODE}


async def test_a_deleted_pod_leaves_and_an_added_one_joins(
    fake: FakeKubernetes, watched: Watched
) -> None:
    fake.send("DELETED", pod("prefill-a", "prefill", ip="10.0.0.1"))
    fake.send("ADDED", pod("prefill-b", "prefill", ip="10.0.0.3"))
    fake.send("BOOKMARK", {"kind": "Pod", "metadata": {"resourceVersion": "999"}})
    await until(lambda: watched.watcher.num_events == 3, "the events")
    assert watched.roles() == {url("10.0.0.2"): PoolRole.DECODE, url("10.0.0.3"): PoolRole.PREFILL}
    assert watched.watcher.resource_version == "999"


async def test_a_410_status_relists_and_watches_from_the_new_version(
    fake: FakeKubernetes,
) -> None:
    fake.put(pod("prefill-a", "prefill", ip="10.0.0.1"))
    fake.watch_status = [410]
    w = Watched(fake)
    w.watcher.start()
    try:
        await until(lambda: fake.num_streams == 1, "the second watch")
        assert len(fake.lists) == 2 and len(fake.watches) == 2
        assert fake.watches[1]["resourceVersion"] == [str(fake.resource_version)]
        assert w.roles() == {url("10.0.0.1"): PoolRole.PREFILL}
        assert w.metric("goodput_gateway_pool_watch_relists_total") == 2
    finally:
        await w.watcher.stop()


async def test_a_410_error_event_relists_and_watches_from_the_new_version(
    fake: FakeKubernetes, watched: Watched
) -> None:
    fake.put(pod("decode-b", "decode", ip="10.0.0.4"))  # missed: only the relist shows it
    expired = {"kind": "Status", "status": "Failure", "reason": "Expired", "code": 410}
    fake.send("ERROR", expired)
    await until(lambda: fake.num_streams == 2, "the second watch")
    assert len(fake.lists) == 2
    assert fake.watches[1]["resourceVersion"] == [str(fake.resource_version)]
    assert url("10.0.0.4") in watched.roles()


async def test_a_malformed_line_is_skipped_and_the_watch_goes_on(
    fake: FakeKubernetes, watched: Watched, caplog: pytest.LogCaptureFixture
) -> None:
    fake.send_raw(b"{not json\n")
    fake.send_raw(b"[1, 2]\n")
    fake.send_raw(b'{"type": "MODIFIED"}\n')  # no object
    fake.send_raw(b'{"type": "SURPRISE", "object": {}}\n')
    fake.send("MODIFIED", pod("prefill-a", "decode", ip="10.0.0.1"))
    await until(lambda: watched.watcher.num_events == 1, "the valid event")
    assert watched.roles()[url("10.0.0.1")] is PoolRole.DECODE
    assert fake.num_streams == 1 and len(fake.lists) == 1  # the same watch
    assert watched.metric("goodput_gateway_pool_watch_errors_total") == 4
    assert sum("malformed pod watch event" in r.message for r in caplog.records) == 4


async def test_a_line_over_the_bound_relists_without_reading_it_whole(
    fake: FakeKubernetes,
) -> None:
    fake.put(pod("prefill-a", "prefill", ip="10.0.0.1"))
    w = Watched(fake, max_line_bytes=4096)
    w.watcher.start()
    try:
        await until(lambda: fake.num_streams == 1, "the watch")
        fake.send_raw(b'{"type": "MODIFIED", "object": "' + b"x" * 100_000)  # no newline yet
        await until(lambda: fake.num_streams == 2, "the watch after the relist")
        assert len(fake.lists) == 2
        assert w.metric("goodput_gateway_pool_watch_errors_total") == 1
    finally:
        await w.watcher.stop()


async def test_a_failing_list_backs_off_keeps_the_pool_and_retries(
    fake: FakeKubernetes, caplog: pytest.LogCaptureFixture
) -> None:
    fake.put(pod("prefill-a", "prefill", ip="10.0.0.1"))
    fake.list_status = [500, 503, 500]
    w = Watched(fake)
    w.watcher.start()
    try:
        await until(lambda: fake.num_streams == 1, "the watch")
        assert len(fake.lists) == 4
        assert w.metric("goodput_gateway_pool_watch_errors_total") == 3
        assert w.roles() == {url("10.0.0.1"): PoolRole.PREFILL}
        # Logged once until it works again, with the server's reason.
        (failure,) = [r.message for r in caplog.records if "pod watch failed" in r.message]
        assert "listing pods answered HTTP 500" in failure and "InternalError" in failure
        # The watch breaks and the relist fails: the pool keeps what it knew.
        fake.list_status = [500]
        fake.end_watch()
        await until(lambda: fake.num_streams == 2, "the watch after the failure")
        assert w.roles() == {url("10.0.0.1"): PoolRole.PREFILL}
    finally:
        await w.watcher.stop()


async def test_an_unknown_role_is_left_out_and_logged_once(
    fake: FakeKubernetes, watched: Watched, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "serving.gateway.kubernetes")
    for _ in range(3):
        fake.send("MODIFIED", pod("odd", "sidecar", ip="10.0.0.7"))
    await until(lambda: watched.watcher.num_events == 3, "the events")
    assert url("10.0.0.7") not in watched.roles()
    assert sum("'sidecar'" in r.message for r in caplog.records) == 1


async def test_the_service_account_token_is_sent(fake: FakeKubernetes, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("secret-token\n")
    w = Watched(fake, api=KubernetesAPI(fake.url, token_file=token))
    w.watcher.start()
    try:
        await until(lambda: fake.num_streams == 1, "the watch")
        assert {h.get("Authorization") for h in fake.headers} == {"Bearer secret-token"}
    finally:
        await w.watcher.stop()


# -- the gateway, end to end --


def loopback_port(*hosts: str) -> int:
    """A port free on every one of ``hosts`` (pods share a port and differ by IP)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = int(s.getsockname()[1])
            try:
                for host in hosts[1:]:
                    with socket.socket() as t:
                        t.bind((host, port))
            except OSError:
                continue
            return port
    raise AssertionError("no common free port")


def serve(app: Any, host: str, port: int) -> uvicorn.Server:
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    wait_for(lambda: server.started, 30, "a server")
    return server


def test_a_gateway_with_pools_from_kubernetes_routes_to_the_pods_the_api_names(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    hosts = ("127.0.0.2", "127.0.0.3")
    port = loopback_port(*hosts)
    servers = []
    try:
        for host, role in zip(hosts, (PoolRole.PREFILL, PoolRole.DECODE), strict=True):
            spec = SimWorkerSpec(port=port, host=host, role=role, sim_config="jitter=0",
                                 kv_dir=tmp_path)  # fmt: skip
            servers.append(serve(create_sim_app(*build_worker(spec)), host, port))
        fake.put(pod("worker-0", "prefill", ip=hosts[0]))
        fake.put(pod("worker-1", "decode", ip=hosts[1]))
        config = GatewayConfig(pools_from=PoolSource.KUBERNETES, kubernetes_api=fake.url,
                               kubernetes_namespace="goodput", worker_port=port)  # fmt: skip
        registry = CollectorRegistry()
        app = create_app(config, sink=InMemorySink(), registry=registry, link=False)
        gw_port = loopback_port("127.0.0.1")
        servers.append(serve(app, "127.0.0.1", gw_port))
        with httpx.Client(base_url=f"http://127.0.0.1:{gw_port}", timeout=30) as client:
            wait_for(lambda: client.get("/health").json()["pools_from"]["connected"], 10, "watch")
            health = client.get("/health").json()
            assert health["pools_from"]["source"] == "kubernetes"
            assert {i["id"]: i["role"] for i in health["instances"]} == {
                f"http://{hosts[0]}:{port}": "prefill",
                f"http://{hosts[1]}:{port}": "decode",
            }
            assert registry.get_sample_value("goodput_gateway_pool_watch_connected") == 1
            body = {
                "model": "llama-3.1-8b",
                "prompt": "hello " * 40,
                "max_tokens": 4,
                "ignore_eos": True,
            }
            answer = client.post("/v1/completions", json=body)
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["completion_tokens"] == 4
            # The prefill pod is deleted: the gateway has no prefill instance left.
            fake.send("DELETED", pod("worker-0", "prefill", ip=hosts[0]))
            wait_for(lambda: len(client.get("/health").json()["instances"]) == 1, 10, "leave")
            assert client.post("/v1/completions", json=body).status_code == 503
    finally:
        for server in reversed(servers):
            server.should_exit = True
