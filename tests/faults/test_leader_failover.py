"""Two control-plane replicas on one PostgreSQL database: exactly one leads the loops; after
``kill -9`` of the leader the other takes the lease, with a higher fencing epoch, within
10 s; a leader stopped cleanly hands over at the other's next renewal."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from serving.workers.load import metric_sum
from tests.faults.conftest import ControlPlane
from tests.integration.controlplane.conftest import create_schema, drop_schema, schema_url

pytestmark = pytest.mark.faults

FAILOVER_S = 10.0


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[ControlPlane, ControlPlane]]:
    schema = create_schema()
    first = ControlPlane(tmp_path / "a")
    second = ControlPlane(tmp_path / "b")
    try:
        first.folder.mkdir()
        second.folder.mkdir()
        settings = {"database_url": schema_url(schema), "durable_ingest": "false",
                    "planner_enabled": "true", "admission_enabled": "true",
                    "admission_interval_s": "1"}  # fmt: skip
        first.prepare(replica_id="cp-a", **settings)
        second.env = {**first.env, "GOODPUT_REPLICA_ID": "cp-b"}
        second.keys = first.keys
        yield first.start(), second.start()
    finally:
        first.stop()
        second.stop()
        drop_schema(schema)


def leading(plane: ControlPlane) -> tuple[bool, float]:
    """Whether ``plane`` leads, and its epoch (0 while it follows)."""
    text = httpx.get(f"{plane.url}/metrics", timeout=5).text
    return metric_sum(text, "goodput_leader") == 1, metric_sum(text, "goodput_leader_epoch")


def wait_for_leader(plane: ControlPlane, timeout_s: float) -> float:
    """Seconds until ``plane`` leads (AssertionError after ``timeout_s``)."""
    started = time.monotonic()
    while not leading(plane)[0]:
        assert time.monotonic() - started < timeout_s, f"{plane.url} did not lead"
        time.sleep(0.1)
    return time.monotonic() - started


def test_one_leader_and_failover_within_ten_seconds(
    replicas: tuple[ControlPlane, ControlPlane],
) -> None:
    first, second = replicas
    time.sleep(1.0)
    states = [leading(first), leading(second)]
    assert sorted(lead for lead, _ in states) == [False, True], states  # exactly one
    leader, follower = (first, second) if states[0][0] else (second, first)
    epoch = max(e for _, e in states)
    # Both answer the API; only the leader's loops tick.
    with follower.admin() as http:
        assert http.get("/api/v1/slos").status_code == 200

    leader.kill()
    took_s = wait_for_leader(follower, FAILOVER_S)
    assert leading(follower)[1] == epoch + 1  # a new epoch fences the old leader out
    print(f"failover after kill -9: {took_s:.2f} s")

    # The killed replica comes back as a follower; a clean stop of the leader hands over
    # at the follower's next renewal (a third of the TTL), not after the whole TTL.
    leader.start()
    time.sleep(1.0)
    assert leading(leader) == (False, 0)
    follower.stop()
    handover_s = wait_for_leader(leader, 4.0)
    assert leading(leader)[1] == epoch + 2
    print(f"handover after a clean stop: {handover_s:.2f} s")
