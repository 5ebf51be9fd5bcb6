"""Failures the gateway must survive with the real PD pair: the decode instance dies in the
middle of a stream, and the control plane goes away during traffic."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator

import httpx
import pytest

from exporters.records import Status, Vantage
from serving.gateway.process import GatewayProcess

from .conftest import READY_TIMEOUT_S, ControlPlane, PDPair, token_prompt
from .test_gateway import start_gateway, stream

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]


@pytest.fixture(scope="module")
def gateway(
    pd_pair: PDPair, control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    # Pools from the fleet registry only: when the control plane is down, what the gateway
    # last learnt is all it has.
    gw = start_gateway(
        ["--gateway-id", "e2e-faults-gateway", "--cooldown", "1"],
        control_plane,
        tmp_path_factory.mktemp("faults") / "gateway.log",
    )
    try:
        deadline = time.monotonic() + 20
        while len(httpx.get(f"{gw.url}/health").json()["instances"]) < 2:
            assert time.monotonic() < deadline, "the gateway never learnt the pools"
            time.sleep(0.2)
        yield gw
    finally:
        gw.stop()


def wait_serving(url: str, timeout_s: float) -> None:
    """Until a request through the gateway succeeds again."""
    deadline = time.monotonic() + timeout_s
    seed = 5000
    while True:
        seed += 1
        with contextlib.suppress(AssertionError):  # a failed stream: not serving yet
            if stream(url, token_prompt(140, seed=seed), 2, f"recover-{seed}")[-1] == "[DONE]":
                return
        assert time.monotonic() < deadline, "the gateway did not serve again"
        time.sleep(0.5)


def decode_streams(client: httpx.Client, gateway: GatewayProcess, url: str) -> int:
    """The streams the gateway is relaying from the instance at ``url`` right now."""
    for instance in client.get(f"{gateway.url}/health", timeout=5).json()["instances"]:
        if instance["id"] == url:
            return int(instance["decode_streams"])
    return 0


def test_decode_killed_mid_stream_ends_cleanly_and_is_counted_failed(
    gateway: GatewayProcess, pd_pair: PDPair, control_plane: ControlPlane
) -> None:
    # As long as the context allows (200 + 1800 < 2048): seconds of decoding to kill into.
    body = {"model": "tiny", "prompt": token_prompt(200, seed=4001), "max_tokens": 1800,
            "ignore_eos": True, "stream": True}  # fmt: skip
    events: list[str] = []
    killed = False
    health = httpx.Client()  # one client for the checks below: none is made per line
    try:
        with httpx.stream(
            "POST", f"{gateway.url}/v1/completions", json=body,
            headers={"x-request-id": "fault-decode"}, timeout=120,
        ) as response:  # fmt: skip
            assert response.status_code == 200
            for line in response.iter_lines():
                if line:
                    events.append(line)
                # Kill only while the gateway is still relaying from the decode instance
                # (a client that reads late could otherwise find the stream already done).
                if not killed and decode_streams(health, gateway, pd_pair.decode.url) > 0:
                    pd_pair.decode.kill_engine()
                    killed = True
        assert killed, f"the stream ended before the kill: {events[-3:]}"
        assert events[-1] == "data: [DONE]", events[-3:]
        last = json.loads(events[-2][len("data: ") :])
        assert "error" in last, f"no error event after the kill: {events[-3:]} ({len(events)})"
        error = last["error"]
        assert error["code"] == 502 and error["type"] == "upstream_error"
        assert error["message"].startswith(f"decode stream from {pd_pair.decode.url} broke")
        # The gateway lives on, and the control plane counts the request as failed.
        assert httpx.get(f"{gateway.url}/health", timeout=5).json()["status"] == "ok"
        (record,) = control_plane.wait_for_records(
            lambda found: len(found) == 1, vantage=Vantage.GATEWAY, request_id="fault-decode"
        )
        assert record.status == Status.ERROR
        assert 1 <= record.output_tokens < 1800
    finally:
        health.close()
        # The worker restarts its engine (whatever happened above: later tests need it).
        pd_pair.decode.wait_ready(READY_TIMEOUT_S)
    wait_serving(gateway.url, 60)


def test_serving_goes_on_without_the_control_plane_and_records_arrive_later(
    gateway: GatewayProcess, control_plane: ControlPlane
) -> None:
    ids = [f"cp-down-{i}" for i in range(3)]
    wait_serving(gateway.url, READY_TIMEOUT_S)  # the pools are known and healthy
    control_plane.stop()
    try:
        # Until the gateway has failed to read the fleet: the pools it keeps are what it
        # serves the requests below with.
        deadline = time.monotonic() + 30
        while fleet_refresh_failures(gateway) < 1:
            assert time.monotonic() < deadline, "the gateway never noticed the outage"
            time.sleep(0.2)
        for i, request_id in enumerate(ids):
            assert stream(gateway.url, token_prompt(150, seed=4100 + i), 4, request_id)[-1] == (
                "[DONE]"
            )
        health = httpx.get(f"{gateway.url}/health", timeout=5).json()
        assert len(health["instances"]) == 2
        assert control_plane.records(vantage=Vantage.GATEWAY, request_id=ids[0]) == []
    finally:
        control_plane.start()
    found = control_plane.wait_for_records(
        lambda found: {r.request_id for r in found} >= set(ids),
        timeout_s=30,
        vantage=Vantage.GATEWAY,
    )
    assert all(r.status == Status.OK for r in found if r.request_id in ids)
    assert fleet_refresh_failures(gateway) >= 1


def fleet_refresh_failures(gateway: GatewayProcess) -> float:
    text = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    (line,) = [
        line for line in text.splitlines()
        if line.startswith("goodput_gateway_fleet_refresh_failures_total ")
    ]  # fmt: skip
    return float(line.split()[1])
