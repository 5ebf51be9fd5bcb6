"""The control plane's fleet schemas accept what the contract's messages encode
(``exporters.fleet``), field for field, and list members the contract decodes."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from controlplane.schemas.fleet import (
    FleetHeartbeat,
    FleetMemberPublic,
    FleetRegister,
)
from exporters import fleet


def test_the_schemas_have_the_contracts_fields() -> None:
    for message, schema in (
        (fleet.FleetRegister, FleetRegister),
        (fleet.FleetHeartbeat, FleetHeartbeat),
    ):
        assert {f.name for f in dataclasses.fields(message)} == set(schema.model_fields)


def test_encoded_messages_validate() -> None:
    register = fleet.FleetRegister(
        id="10.0.0.7:8100",
        kind=fleet.FleetKind.WORKER,
        endpoint="http://10.0.0.7:8100",
        model="tiny",
        role=fleet.PoolRole.DECODE,
        state=fleet.FleetState.READY,
        load={"num_requests_running": 3, "kv_both": True},
        tenant="acme",
    )
    parsed = FleetRegister.model_validate(register.to_json())
    assert (parsed.role, parsed.state, parsed.load, parsed.tenant) == (
        fleet.PoolRole.DECODE,
        fleet.FleetState.READY,
        {"num_requests_running": 3, "kv_both": True},
        "acme",
    )
    beat = FleetHeartbeat.model_validate(fleet.FleetHeartbeat(load={"in_flight": 2}).to_json())
    assert beat.state is None and beat.load == {"in_flight": 2}


def test_listed_members_decode() -> None:
    public = FleetMemberPublic(
        id="w0",
        kind=fleet.FleetKind.WORKER,
        endpoint="http://w0:8100",
        model="tiny",
        role=fleet.PoolRole.PREFILL,
        state=fleet.FleetState.DRAINING,
        last_heartbeat_at=datetime(2026, 1, 1, tzinfo=UTC),
        load={},
        registered_at=datetime(2026, 1, 1, tzinfo=UTC),
        tenant="acme",
        stale=True,
    )
    page = fleet.FleetPage.from_json({"data": [public.model_dump(mode="json")], "count": 1})
    assert page.invalid == ()
    (member,) = page.data
    assert (member.role, member.state, member.stale, member.tenant) == (
        fleet.PoolRole.PREFILL,
        fleet.FleetState.DRAINING,
        True,
        "acme",
    )
