"""The fleet contract's messages (exporters.fleet)."""

from __future__ import annotations

import pytest

from exporters.commands import (
    Command,
    CommandError,
    CommandKind,
    command_to_json,
    pending_commands_from_json,
)
from exporters.fleet import (
    FleetError,
    FleetHeartbeat,
    FleetKind,
    FleetPage,
    FleetRegister,
    FleetState,
    PoolRole,
)

MEMBER = {"id": "w0", "kind": "worker", "endpoint": "http://w0:1", "role": "decode",
          "state": "ready", "stale": False, "model": "m", "load": {},
          "last_heartbeat_at": None, "registered_at": "2026-01-01T00:00:00Z"}  # fmt: skip


def test_register_and_heartbeat_encode() -> None:
    body = FleetRegister("gw", FleetKind.GATEWAY, "http://gw:8080", state=FleetState.READY)
    assert body.to_json() == {
        "id": "gw",
        "kind": "gateway",
        "endpoint": "http://gw:8080",
        "model": "",
        "role": "both",
        "state": "ready",
        "load": {},
    }
    assert FleetHeartbeat(load={"in_flight": 1}).to_json() == {"load": {"in_flight": 1}}
    assert FleetHeartbeat(FleetState.DRAINED).to_json() == {"load": {}, "state": "drained"}


def test_a_tenant_is_sent_only_when_set_and_decoded_from_the_list() -> None:
    body = FleetRegister("w0", FleetKind.WORKER, "http://w0:1", tenant="acme").to_json()
    assert body["tenant"] == "acme"
    assert "tenant" not in FleetRegister("w0", FleetKind.WORKER, "http://w0:1").to_json()
    page = FleetPage.from_json({"data": [{**MEMBER, "tenant": "acme"}, MEMBER], "count": 2})
    assert [m.tenant for m in page.data] == ["acme", None]
    (error,) = FleetPage.from_json({"data": [{**MEMBER, "tenant": 7}], "count": 1}).invalid
    assert str(error) == "data[0].tenant: must be a string or null, got 7"


def test_a_page_sets_apart_members_that_break_the_contract() -> None:
    bad = {**MEMBER, "id": "w1", "role": "router"}
    page = FleetPage.from_json({"data": [MEMBER, bad], "count": 7})
    assert [m.id for m in page.data] == ["w0"] and page.data[0].role is PoolRole.DECODE
    assert page.size == 2 and page.count == 7
    (error,) = page.invalid
    assert str(error) == (
        "data[1].role: unknown value 'router'; allowed: ['prefill', 'decode', 'both']"
    )
    with pytest.raises(FleetError, match="count: must be an integer >= 0, got None"):
        FleetPage.from_json({"data": []})


def test_pending_commands_keep_the_valid_ones() -> None:
    cmd = Command.new(CommandKind.DRAIN, "w0", {}, version=1, now_ns=1, ttl_s=5.0)
    commands, errors = pending_commands_from_json(
        {"data": [command_to_json(cmd), {"v": 1}], "count": 2}
    )
    assert commands == [cmd] and len(errors) == 1
    with pytest.raises(CommandError, match=r"^data: expected an object"):
        pending_commands_from_json([command_to_json(cmd)])
