"""Error messages name the field, what is allowed and the value (pure: pydantic only)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from controlplane.errors import format_validation_errors
from controlplane.schemas.fleet import FleetRegister
from controlplane.schemas.keys import APIKeyCreate
from controlplane.schemas.slo import SLOCreate, SLOUpdate

BASE: dict[str, Any] = {
    "name": "chat",
    "objectives": [{"metric": "ttft", "threshold_s": 0.2}],
    "target": 0.99,
}


def messages(model: type, body: dict[str, Any]) -> list[tuple[str, str]]:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(body)
    return [(d["field"], d["msg"]) for d in format_validation_errors(caught.value.errors())]


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ({"target": 1.5}, ("target", "target must be in (0, 1), got 1.5")),
        (
            {"availability_target": 1},
            ("availability_target", "availability_target must be in (0, 1), got 1"),
        ),
        ({"window_s": 10**9}, ("window_s", "window_s must be in [60, 31622400], got 1000000000")),
        (
            {"window_s": 90.5},
            (
                "window_s",
                "window_s must be a whole number, got 90.5",
            ),
        ),
        ({"target": float("nan")}, ("target", "target must be a finite number, got nan")),
        (
            {"objectives": [{"metric": "itl", "threshold_s": 0.05, "statistic": "p0"}]},
            (
                "objectives[0].statistic",
                "objectives[0].statistic must match "
                "^(max|p100|p[1-9][0-9]?(\\.[0-9]{1,3})?)$, got 'p0'",
            ),
        ),
        (
            {"objectives": [{"threshold_s": 0.05}]},
            ("objectives[0].metric", "objectives[0].metric is required"),
        ),
        (
            {"objectives": [{"metric": "ttft", "threshold_s": 0.05, "unit": "ms"}]},
            ("objectives[0].unit", "objectives[0].unit is not an allowed field, got 'ms'"),
        ),
        (
            {"selector": {"tenant": ""}},
            ("selector.tenant", "selector.tenant must be at least 1 characters, got ''"),
        ),
        (
            {"description": "x" * 2001},
            (
                "description",
                "description must be at most 2000 characters, got '" + "x" * 76 + "...",
            ),
        ),
    ],
)
def test_slo_create_messages(patch: dict[str, Any], expected: tuple[str, str]) -> None:
    assert messages(SLOCreate, {**BASE, **patch}) == [expected]


def test_long_values_are_shortened() -> None:
    ((_, msg),) = messages(SLOCreate, {**BASE, "name": "X" * 500})
    assert msg.endswith("...")
    assert len(msg) < 200


def test_update_refuses_null_for_required_fields_but_allows_clearing_availability() -> None:
    assert messages(SLOUpdate, {"objectives": None}) == [
        (
            "objectives",
            "objectives must not be null (omit the field to keep its current value), got None",
        )
    ]
    assert SLOUpdate.model_validate({"availability_target": None}).model_fields_set == {
        "availability_target"
    }


def test_update_schema_publishes_no_null_for_required_fields() -> None:
    properties = SLOUpdate.model_json_schema()["properties"]
    assert "anyOf" not in properties["target"]
    assert properties["target"]["exclusiveMaximum"] == 1
    assert {"type": "null"} in properties["availability_target"]["anyOf"]


def test_unpaired_surrogate_is_refused() -> None:
    assert messages(SLOCreate, {**BASE, "description": "\ud800"}) == [
        (
            "description",
            "description must be valid Unicode text (no unpaired surrogates), got '\\ud800'",
        )
    ]


def test_key_role_lists_allowed_values() -> None:
    assert messages(APIKeyCreate, {"name": "k", "role": "root"}) == [
        (
            "role",
            "role must be one of 'viewer', 'operator', 'admin', 'ingest' or 'agent', got 'root'",
        )
    ]


def test_fleet_load_refuses_digit_strings_as_numbers() -> None:
    body = {"id": "w", "kind": "worker", "endpoint": "http://w:1", "load": {"q": "1" * 3000}}
    ((field, msg),) = messages(FleetRegister, body)
    assert field == "load.q"
    assert msg.startswith(
        "load.q must be a boolean, a finite number or a string of at most 2000 characters "
        "without NUL, got '1111"
    )


def test_json_decode_errors_carry_no_value() -> None:
    error = {
        "type": "json_invalid",
        "loc": ("body", 7),
        "msg": "JSON decode error",
        "input": {},
        "ctx": {"error": "Expecting value"},
    }
    assert format_validation_errors([error]) == [
        {
            "loc": ["body", 7],
            "field": "[7]",
            "msg": "[7] is not valid JSON (Expecting value)",
            "type": "json_invalid",
        }
    ]
