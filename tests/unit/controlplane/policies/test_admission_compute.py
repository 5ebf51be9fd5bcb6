"""The control plane's admission policy computation: learned model + SLOs + burn → policy."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.goodput import SLOSpec
from controlplane.policies.admission import (
    DEFAULT_CLASSES,
    AdmissionConfig,
    compute_policy,
    margin_ratio,
    max_batch,
    prompt_quartiles,
    slo_key,
)
from controlplane.policies.learning import DEFAULT_PRIOR, LearnedParams
from exporters.admission import prompt_class
from exporters.commands import Command, CommandKind, command_from_json, command_to_json
from exporters.slo import Metric, Objective

PARAMS = LearnedParams(
    prefill_tokens_per_s=8_000.0,
    kv_handoff_s=0.02,
    itl_base_s=0.01,
    itl_per_stream_s=0.0005,
    itl_per_context_token_s=1e-8,
    mean_decode_s=4.0,
    mean_context_tokens=1_000.0,
)


def spec(
    slo_id: str, objectives: tuple[Objective, ...], selector: dict[str, str] | None = None
) -> SLOSpec:
    return SLOSpec(
        id=slo_id,
        name=f"{slo_id}-name",
        objectives=objectives,
        target=0.99,
        window_s=86_400.0,
        selector=selector or {},
    )


def test_margin_tightens_with_the_burn_rate() -> None:
    config = AdmissionConfig(burn_sensitivity=0.25, min_margin_ratio=0.5)
    assert margin_ratio(None, config) == 1.0
    assert margin_ratio(0.4, config) == 1.0
    assert margin_ratio(1.0, config) == 1.0
    assert margin_ratio(3.0, config) == pytest.approx(1 / 1.5)
    assert margin_ratio(5.0, config) == pytest.approx(0.5)
    assert margin_ratio(50.0, config) == 0.5
    assert margin_ratio(math.inf, config) == 0.5
    assert margin_ratio(math.nan, config) == 1.0


def test_slo_key_follows_the_gateway_label() -> None:
    ttft = (Objective(Metric.TTFT, 0.5),)
    assert slo_key(spec("a", ttft, {"slo": "chat", "tenant": "acme"})) == "chat"
    assert slo_key(spec("b", ttft, {"tenant": "acme"})) == "acme"
    assert slo_key(spec("c", ttft)) == "c-name"


def test_policy_from_slos_burn_rates_and_the_learned_model() -> None:
    slos = [
        spec("chat", (Objective(Metric.TTFT, 0.5), Objective(Metric.ITL, 0.05, "p99")),
             {"slo": "chat"}),
        spec("bulk", (Objective(Metric.TTFT, 5.0), Objective(Metric.TPOT, 0.1)),
             {"slo": "bulk"}),
        spec("chat-strict", (Objective(Metric.TTFT, 0.3),), {"slo": "chat"}),
        spec("e2e-only", (Objective(Metric.E2EL, 30.0),), {"tenant": "acme"}),
    ]  # fmt: skip
    policy = compute_policy(
        PARAMS, slos, {"chat": 3.0, "bulk": 0.2, "chat-strict": None}, AdmissionConfig(), version=9
    )
    assert policy.version == 9 and policy.ttl_s == 30.0
    assert dict(policy.classes) == dict(DEFAULT_CLASSES)
    chat, bulk, acme = policy.slos["chat"], policy.slos["bulk"], policy.slos["acme"]
    assert (chat.ttft_s, chat.itl_s, chat.burn_rate) == (0.3, 0.05, 3.0)  # tightest of two
    assert chat.margin_ratio == pytest.approx(1 / 1.5)
    assert (bulk.ttft_s, bulk.itl_s, bulk.margin_ratio) == (5.0, 0.1, 1.0)
    assert (acme.ttft_s, acme.itl_s) == (None, None)
    model = policy.model
    assert model is not None and model.prefill_tokens_per_s == 8_000.0
    # The strictest ITL objective, 0.05 s: (0.05 - 0.01) / (0.0005 + 1e-8 * 1000) = 78.4.
    assert model.max_decode_batch == 78
    # It travels in a command and back unchanged.
    cmd = Command.new(
        CommandKind.SET_ADMISSION_POLICY, "gw", {"policy": policy}, version=9, now_ns=1, ttl_s=60
    )
    again = command_from_json(json.loads(json.dumps(command_to_json(cmd))))
    assert again.admission_policy() == policy


def test_max_batch_bounds() -> None:
    config = AdmissionConfig(max_decode_batch=100)
    assert max_batch(PARAMS, None, config) == 100
    assert max_batch(PARAMS, 10.0, config) == 100  # the model allows more: the cap
    assert max_batch(PARAMS, 0.001, config) == 1  # even the base ITL misses: one stream
    flat = LearnedParams(**{**PARAMS.to_json(), "itl_per_stream_s": 0.0,
                            "itl_per_context_token_s": 0.0})  # type: ignore[arg-type]  # fmt: skip
    assert max_batch(flat, 0.05, config) == 100


def test_priors_give_a_usable_policy_before_any_data() -> None:
    policy = compute_policy(DEFAULT_PRIOR, [], {}, AdmissionConfig(), version=1)
    assert policy.model is not None and policy.slos == {}
    assert policy.model.max_decode_batch == 256


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError, match="min_margin_ratio must be in"):
        AdmissionConfig(min_margin_ratio=0)
    with pytest.raises(ValueError, match="burn_sensitivity must be >= 0"):
        AdmissionConfig(burn_sensitivity=-1)


def test_fingerprint_ignores_the_version_and_noise() -> None:
    from controlplane.runtime.admission import fingerprint

    config = AdmissionConfig()
    slos = [spec("chat", (Objective(Metric.TTFT, 0.5),), {"slo": "chat"})]
    base = compute_policy(PARAMS, slos, {"chat": 3.0}, config, version=1)
    noisy = LearnedParams(**{**PARAMS.to_json(), "prefill_tokens_per_s": 8_001.0})  # type: ignore[arg-type]
    again = compute_policy(noisy, slos, {"chat": 3.0}, config, version=2)
    assert fingerprint(base) == fingerprint(again)
    burning = compute_policy(PARAMS, slos, {"chat": 6.0}, config, version=3)
    assert fingerprint(burning) != fingerprint(base)


@given(st.lists(st.integers(1, 200_000), min_size=1, max_size=400))
def test_prompt_quartiles_cut_nonempty_ascending_classes(prompts: list[int]) -> None:
    bounds = prompt_quartiles(prompts)
    assert len(bounds) <= 3 and list(bounds) == sorted(set(bounds))
    assert all(b in prompts and b < max(prompts) for b in bounds)
    counts = [0] * (len(bounds) + 1)
    for p in prompts:
        counts[prompt_class(bounds, p)] += 1
    assert all(counts)  # every class holds a prompt
    if len(set(prompts)) == len(prompts) >= 8:  # distinct lengths: about a quarter each
        assert len(bounds) == 3 and max(counts) <= math.ceil(len(prompts) / 4) + 1


def test_the_availability_floor_reaches_the_policy_only_with_classes() -> None:
    slos = [spec("a", (Objective(Metric.TTFT, 0.5),))]
    config = AdmissionConfig()
    assert config.availability_floor == 0.5
    plain = compute_policy(PARAMS, slos, {}, config, version=1)
    assert plain.prompt_class_bounds == () and plain.availability_floor == 0.0
    assert "availability_floor" not in plain.to_json()  # the wire as before
    classed = compute_policy(PARAMS, slos, {}, config, version=2, prompt_class_bounds=[500, 2000])
    assert classed.prompt_class_bounds == (500, 2000) and classed.availability_floor == 0.5
    configured = AdmissionConfig(prompt_class_bounds=(1000,), availability_floor=0.3)
    policy = compute_policy(PARAMS, slos, {}, configured, version=3)
    assert policy.prompt_class_bounds == (1000,) and policy.availability_floor == 0.3
    with pytest.raises(ValueError, match="availability_floor must be in"):
        AdmissionConfig(availability_floor=1.0)
