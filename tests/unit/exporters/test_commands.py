"""The down contract: commands, admission policies and acks, round trips and refusals."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporters.commands import (
    COMMAND_VERSION,
    AdmissionPolicy,
    ClassPolicy,
    Command,
    CommandAck,
    CommandError,
    CommandKind,
    Pool,
    command_from_json,
    command_to_json,
)
from exporters.fleet import PoolRole
from exporters.wire import WireError

ID = "6f1c2a9e-3b4d-4c5e-8f90-a1b2c3d4e5f6"
NOW = 1_700_000_000_000_000_000


def policy() -> AdmissionPolicy:
    return AdmissionPolicy(
        version=3,
        ttl_s=30,
        fallback_max_concurrency=64,
        classes={
            "batch": ClassPolicy(shed_order=0),
            "interactive": ClassPolicy(shed_order=1, ttft_s=0.5),
            "system": ClassPolicy(sheddable=False),
        },
    )


PAYLOADS: dict[CommandKind, Mapping[str, Any]] = {
    CommandKind.SET_ADMISSION_POLICY: {"policy": policy().to_json()},
    CommandKind.SET_ROLE: {"role": "decode"},
    CommandKind.SET_POOL_MEMBERSHIP: {"pool": "prefill", "instances": ["10.0.0.1:8000", "w-2"]},
    CommandKind.DRAIN: {},
    CommandKind.RESUME: {},
}


def command(kind: CommandKind, payload: Mapping[str, Any] | None = None) -> Command:
    return Command(
        id=ID,
        kind=kind,
        target="gateway-0",
        version=4,
        issued_time_ns=NOW,
        expires_time_ns=NOW + 60 * 10**9,
        payload=PAYLOADS[kind] if payload is None else payload,
    )


def through_text(obj: dict[str, Any]) -> Any:
    return json.loads(json.dumps(obj))


@pytest.mark.parametrize("kind", list(CommandKind))
def test_every_kind_round_trips_through_json_text(kind: CommandKind) -> None:
    cmd = command(kind)
    obj = command_to_json(cmd)
    assert obj["v"] == COMMAND_VERSION
    assert obj["kind"] == kind.value
    assert command_from_json(through_text(obj)) == cmd


def test_payloads_are_stored_in_canonical_read_only_form() -> None:
    role = command(CommandKind.SET_ROLE)
    assert role.payload == {"role": PoolRole.DECODE}
    assert role.payload["role"] is PoolRole.DECODE
    pool = command(CommandKind.SET_POOL_MEMBERSHIP)
    assert pool.payload == {"pool": Pool.PREFILL, "instances": ("10.0.0.1:8000", "w-2")}
    with pytest.raises(TypeError):
        pool.payload["pool"] = Pool.DECODE  # type: ignore[index]
    assert command_to_json(pool)["payload"] == {
        "pool": "prefill",
        "instances": ["10.0.0.1:8000", "w-2"],
    }


def test_admission_policy_travels_as_json_and_comes_back_equal() -> None:
    by_object = command(CommandKind.SET_ADMISSION_POLICY, {"policy": policy()})
    assert by_object == command(CommandKind.SET_ADMISSION_POLICY)
    assert by_object.admission_policy() == policy()
    assert policy().class_policy("interactive").ttft_s == 0.5
    assert policy().class_policy("unlisted") == ClassPolicy()
    with pytest.raises(CommandError) as exc:
        command(CommandKind.DRAIN).admission_policy()
    assert str(exc.value) == "kind: drain carries no admission policy"


@given(
    shed=st.integers(0, 1_000_000),
    sheddable=st.booleans(),
    ttft=st.none() | st.floats(1e-6, 1e6),
    ttl=st.floats(1e-3, 1e6),
    cap=st.integers(1, 2**31 - 1),
    name=st.text(min_size=1, max_size=30),
)
def test_any_valid_policy_round_trips(
    shed: int, sheddable: bool, ttft: float | None, ttl: float, cap: int, name: str
) -> None:
    original = AdmissionPolicy(1, ttl, cap, {name: ClassPolicy(shed, sheddable, ttft)})
    assert AdmissionPolicy.from_json(through_text(original.to_json())) == original


def test_new_commands_get_fresh_ids_and_an_expiry() -> None:
    first = Command.new(CommandKind.DRAIN, "w-1", {}, version=1, now_ns=NOW, ttl_s=2.5)
    second = Command.new(CommandKind.DRAIN, "w-1", {}, version=1, now_ns=NOW, ttl_s=2.5)
    assert first.id != second.id
    assert first.expires_time_ns == NOW + 2_500_000_000
    assert not first.expired(NOW + 2_499_999_999)
    assert first.expired(NOW + 2_500_000_000)


def test_acks_round_trip_and_are_validated() -> None:
    ack = CommandAck(command_id=ID, target="w-1", ok=False, detail="expired", acked_time_ns=NOW)
    assert CommandAck.from_json(through_text(ack.to_json())) == ack
    with pytest.raises(CommandError) as exc:
        CommandAck.from_json({**ack.to_json(), "ok": "yes"})
    assert str(exc.value) == "ok: must be true or false, got 'yes'"
    with pytest.raises(CommandError) as exc:
        CommandAck.from_json({**ack.to_json(), "command_id": ID.upper()})
    assert (
        str(exc.value)
        == f"command_id: must be a lower-case hyphenated UUID string, got {ID.upper()!r}"
    )


def payload_error(kind: CommandKind, payload: Any) -> str:
    with pytest.raises(CommandError) as exc:
        command_from_json({**command_to_json(command(kind)), "payload": payload})
    return str(exc.value)


@pytest.mark.parametrize(
    ("kind", "payload", "message"),
    [
        (
            CommandKind.SET_ROLE,
            {"role": "leader"},
            "payload.role: unknown value 'leader'; allowed: ['prefill', 'decode', 'both']",
        ),
        (CommandKind.SET_ROLE, {}, "payload.role: missing"),
        (
            CommandKind.SET_ROLE,
            {"role": "both", "pool": "decode"},
            "payload: unknown fields ['pool']; allowed: ['role']",
        ),
        (
            CommandKind.SET_POOL_MEMBERSHIP,
            {"pool": "both", "instances": []},
            "payload.pool: unknown value 'both'; allowed: ['prefill', 'decode']",
        ),
        (
            CommandKind.SET_POOL_MEMBERSHIP,
            {"pool": "decode", "instances": "w-1"},
            "payload.instances: expected a list of endpoint strings, got 'w-1'",
        ),
        (
            CommandKind.SET_POOL_MEMBERSHIP,
            {"pool": "decode", "instances": ["w-1", ""]},
            "payload.instances: must be a non-empty string of at most 256 characters, got ''",
        ),
        (
            CommandKind.SET_POOL_MEMBERSHIP,
            {"pool": "decode", "instances": ["w-1", "w-2", "w-1"]},
            "payload.instances: duplicate endpoint 'w-1'",
        ),
        (CommandKind.DRAIN, {"now": True}, "payload: unknown fields ['now']; allowed: []"),
        (CommandKind.RESUME, [], "payload: expected an object, got []"),
        (CommandKind.SET_ADMISSION_POLICY, {}, "payload.policy: missing"),
        (
            CommandKind.SET_ADMISSION_POLICY,
            {"policy": {**policy().to_json(), "ttl_s": 0}},
            "payload.policy.ttl_s: must be a number of seconds > 0, got 0",
        ),
        (
            CommandKind.SET_ADMISSION_POLICY,
            {"policy": {**policy().to_json(), "fallback_max_concurrency": 0}},
            "payload.policy.fallback_max_concurrency: must be an integer in [1, 2147483647], got 0",
        ),
        (
            CommandKind.SET_ADMISSION_POLICY,
            {
                "policy": {
                    **policy().to_json(),
                    "classes": {"x": {"shed_order": -1, "sheddable": True, "ttft_s": None}},
                }
            },
            "payload.policy.classes.x.shed_order: must be an integer in [0, 1000000], got -1",
        ),
        (
            CommandKind.SET_ADMISSION_POLICY,
            {
                "policy": {
                    **policy().to_json(),
                    "classes": {"x": {"shed_order": 0, "sheddable": True, "ttft_s": "fast"}},
                }
            },
            "payload.policy.classes.x.ttft_s: must be a number of seconds > 0 or null, got 'fast'",
        ),
        (
            CommandKind.SET_ADMISSION_POLICY,
            {"policy": {**policy().to_json(), "classes": {"x": {"shed_order": 0}}}},
            "payload.policy.classes.x.sheddable: missing",
        ),
    ],
)
def test_payloads_are_validated_per_kind(kind: CommandKind, payload: Any, message: str) -> None:
    assert payload_error(kind, payload) == message


def command_error(**changes: Any) -> str:
    with pytest.raises(CommandError) as exc:
        command_from_json({**command_to_json(command(CommandKind.DRAIN)), **changes})
    return str(exc.value)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"v": 2}, "v: unsupported command version 2; supported versions: [1]"),
        ({"v": True}, "v: unsupported command version True; supported versions: [1]"),
        ({"id": "42"}, "id: must be a lower-case hyphenated UUID string, got '42'"),
        (
            {"kind": "reboot"},
            "kind: unknown value 'reboot'; allowed: ['set_admission_policy', 'set_role', "
            "'set_pool_membership', 'drain', 'resume']",
        ),
        ({"target": ""}, "target: must be a non-empty string of at most 256 characters, got ''"),
        ({"version": -1}, f"version: must be an integer in [0, {2**63 - 1}], got -1"),
        (
            {"issued_time_ns": 1.5},
            f"issued_time_ns: must be an integer in [0, {2**63 - 1}], got 1.5",
        ),
        (
            {"expires_time_ns": NOW},
            f"expires_time_ns: must be after issued_time_ns ({NOW}), got {NOW}",
        ),
        (
            {"priority": 1},
            "command: unknown fields ['priority']; allowed: "
            + str(
                [
                    "v",
                    "id",
                    "kind",
                    "target",
                    "version",
                    "issued_time_ns",
                    "expires_time_ns",
                    "payload",
                ]
            ),
        ),
    ],
)
def test_command_fields_are_validated(changes: dict[str, Any], message: str) -> None:
    assert command_error(**changes) == message


def test_missing_fields_and_non_objects_are_refused() -> None:
    obj = command_to_json(command(CommandKind.DRAIN))
    del obj["target"]
    with pytest.raises(CommandError, match=r"^target: missing$"):
        command_from_json(obj)
    with pytest.raises(CommandError, match=r"^command: expected a JSON object, got list$"):
        command_from_json([])


def test_command_errors_are_wire_errors_with_field_and_reason() -> None:
    with pytest.raises(WireError) as exc:
        command(CommandKind.SET_ROLE, {"role": "x"})
    assert isinstance(exc.value, CommandError)
    assert exc.value.field == "payload.role"
    assert exc.value.reason == "unknown value 'x'; allowed: ['prefill', 'decode', 'both']"
