"""Pool membership from static config and the fleet registry, load counters, affinity."""

from __future__ import annotations

import pytest

from exporters.fleet import FleetMember, PoolRole
from serving.gateway.pool import InstancePool, StaticInstance


def member(endpoint: str, role: str = "both", state: str = "ready", **kw: object) -> FleetMember:
    return FleetMember.from_json({"id": endpoint, "kind": "worker", "endpoint": endpoint,
                                  "role": role, "state": state, "stale": False, **kw})  # fmt: skip


def test_static_instances_are_normalised_and_unique() -> None:
    pool = InstancePool([StaticInstance("http://a:1/v1/", PoolRole.PREFILL)])
    assert [s.id for s in pool.states()] == ["http://a:1"]
    with pytest.raises(ValueError, match="given twice"):
        InstancePool([StaticInstance("http://a:1", PoolRole.PREFILL),
                      StaticInstance("http://a:1/", PoolRole.DECODE)])  # fmt: skip
    with pytest.raises(ValueError, match="must start with http:// or https://, got 'a:1'"):
        InstancePool([StaticInstance("a:1", PoolRole.DECODE)])


def test_fleet_members_join_update_static_and_leave() -> None:
    pool = InstancePool([StaticInstance("http://a:1", PoolRole.PREFILL)])
    pool.apply_fleet([
        member("http://a:1", role="decode"),
        member("http://b:1", role="prefill"),
        member("http://c:1", state="starting"),
        member("http://d:1", stale=True),
        member("http://gw:1", kind="gateway"),
        member("nonsense"),
    ])  # fmt: skip
    by_id = {s.id: s for s in pool.states()}
    assert set(by_id) == {"http://a:1", "http://b:1", "http://c:1", "http://d:1"}
    assert by_id["http://a:1"].role is PoolRole.DECODE  # the fleet's role wins
    assert by_id["http://b:1"].healthy
    assert not by_id["http://c:1"].healthy and not by_id["http://d:1"].healthy
    pool.add_load("http://b:1", decode_streams=2)
    pool.apply_fleet([member("http://b:1", role="prefill")])
    by_id = {s.id: s for s in pool.states()}
    # a is static: back to its command-line role; c and d left; b kept its load.
    assert set(by_id) == {"http://a:1", "http://b:1"}
    assert by_id["http://a:1"].role is PoolRole.PREFILL and by_id["http://a:1"].healthy
    assert by_id["http://b:1"].decode_streams == 2


def test_static_instances_are_trusted_while_starting_but_not_when_stopped() -> None:
    pool = InstancePool([StaticInstance("http://a:1", PoolRole.PREFILL)])
    for state, stale, healthy in [
        ("starting", False, True), ("ready", True, True), ("draining", False, False),
        ("drained", False, False), ("down", False, False), ("ready", False, True),
    ]:  # fmt: skip
        pool.apply_fleet([member("http://a:1", role="prefill", state=state, stale=stale)])
        state_now = pool.get("http://a:1")
        assert state_now is not None and state_now.healthy is healthy, state


def test_load_cool_down_and_recovery() -> None:
    pool = InstancePool([StaticInstance("http://a:1", PoolRole.BOTH)], cooldown_s=5.0)
    pool.add_load("http://a:1", prefill_tokens=300, decode_streams=1)
    pool.add_load("http://a:1", prefill_tokens=-500)
    state = pool.get("http://a:1")
    assert state is not None and (state.prefill_tokens, state.decode_streams) == (0, 1)
    pool.add_load("http://gone:1", decode_streams=1)  # left the fleet meanwhile: ignored
    pool.mark_down("http://a:1", 100.0)
    state = pool.get("http://a:1")
    assert state is not None and state.down_until_s == 105.0
    pool.mark_up("http://a:1")
    state = pool.get("http://a:1")
    assert state is not None and state.down_until_s == 0.0


def test_affinity_table_is_bounded_least_recently_used_out() -> None:
    pool = InstancePool(max_affinity_keys=2)
    pool.pin("k1", "p", "d")
    pool.pin("k2", "p", "d")
    pool.pin("k1", "p", "d2")  # used again: now the most recent
    pool.pin("k3", "p", "d")
    pool.pin(None, "p", "d")
    assert dict(pool.affinity) == {"k1": ("p", "d2"), "k3": ("p", "d")}
