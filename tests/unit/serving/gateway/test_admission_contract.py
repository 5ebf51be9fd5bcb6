"""The admission policy contract (``exporters.admission``): round trips, the first version's
JSON still read, and refusals that name the field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from exporters.admission import AdmissionModel, AdmissionPolicy, ClassPolicy, SLOAdmission
from exporters.commands import CommandError

FULL = AdmissionPolicy(
    version=7,
    ttl_s=30.0,
    fallback_max_concurrency=64,
    classes={"critical": ClassPolicy(shed_order=2, sheddable=False),
             "sheddable": ClassPolicy(shed_order=0, headroom_ratio=0.7)},
    slos={"chat": SLOAdmission(ttft_s=0.5, itl_s=0.05, burn_rate=3.0, margin_ratio=0.8)},
    model=AdmissionModel(prefill_tokens_per_s=20_000.0, kv_handoff_s=0.01,
                         instance_prefill_tokens_per_s={"http://p1:8000": 25_000.0}),
    tenant_weights={"acme": 2.0},
    over_share_ratio=0.6,
)  # fmt: skip


def test_round_trip_through_json() -> None:
    assert AdmissionPolicy.from_json(json.loads(json.dumps(FULL.to_json()))) == FULL
    assert FULL.model is not None and FULL.model.prefill_rate("http://p1:8000") == 25_000.0
    assert FULL.model.prefill_rate("http://p2:8000") == 20_000.0
    assert FULL.model.prefill_rate(None) == 20_000.0


def test_first_version_policies_read_and_write_as_before() -> None:
    old = {
        "version": 3,
        "ttl_s": 30.0,
        "fallback_max_concurrency": 64,
        "classes": {"interactive": {"shed_order": 1, "sheddable": True, "ttft_s": 0.5}},
    }
    policy = AdmissionPolicy.from_json(old)
    assert policy.model is None and policy.slos == {} and policy.over_share_ratio == 0.8
    assert policy.classes["interactive"].headroom_ratio == 1.0
    assert policy.to_json() == old


def _with(path: str, value: Any) -> dict[str, Any]:
    obj = FULL.to_json()
    *parents, last = path.split(".")
    node = obj
    for key in parents:
        node = node[key]
    node[last] = value
    return obj


RATIO = "must be a number in (0.0, 1.0], got"
POSITIVE = "must be a number in (0.0, inf], got"


@pytest.mark.parametrize(
    ("path", "value", "reason"),
    [
        ("slos.chat.margin_ratio", 1.5, f"{RATIO} 1.5"),
        ("slos.chat.ttft_s", -1, "must be a number of seconds > 0 or null, got -1"),
        ("slos.chat.burn_rate", "hot", "must be a number in [0.0, inf], got 'hot'"),
        ("classes.sheddable.headroom_ratio", 0, f"{RATIO} 0"),
        ("model.max_decode_batch", 0, "must be an integer in [1, 2147483647], got 0"),
        ("model.prefill_tokens_per_s", float("nan"), f"{POSITIVE} nan"),
        ("model.instance_prefill_tokens_per_s", [], "expected an object, got []"),
        ("tenant_weights.acme", 0, f"{POSITIVE} 0"),
        ("over_share_ratio", 2, f"{RATIO} 2"),
        ("slos", [], "expected an object, got []"),
    ],
)
def test_refusals_name_the_field(path: str, value: Any, reason: str) -> None:
    with pytest.raises(CommandError) as info:
        AdmissionPolicy.from_json(_with(path, value))
    assert str(info.value) == f"policy.{path}: {reason}"


def test_unknown_fields_are_refused_with_the_allowed_ones() -> None:
    with pytest.raises(CommandError, match=r"^policy.model: unknown fields \['speed'\]; allowed: "):
        AdmissionPolicy.from_json(_with("model.speed", 1))


def test_missing_model_field_is_named() -> None:
    obj = FULL.to_json()
    del obj["model"]["mean_decode_s"]
    with pytest.raises(CommandError, match=r"^policy.model.mean_decode_s: missing$"):
        AdmissionPolicy.from_json(obj)


@given(
    ttft=st.one_of(st.none(), st.floats(1e-3, 100)),
    margin=st.floats(1e-3, 1.0),
    rate=st.floats(1.0, 1e7),
    batch=st.integers(1, 10_000),
)
def test_any_valid_policy_survives_json(
    ttft: float | None, margin: float, rate: float, batch: int
) -> None:
    policy = AdmissionPolicy(
        version=1, ttl_s=5.0, fallback_max_concurrency=1,
        slos={"s": SLOAdmission(ttft_s=ttft, margin_ratio=margin)},
        model=AdmissionModel(prefill_tokens_per_s=rate, max_decode_batch=batch),
    )  # fmt: skip
    assert AdmissionPolicy.from_json(json.loads(json.dumps(policy.to_json()))) == policy
