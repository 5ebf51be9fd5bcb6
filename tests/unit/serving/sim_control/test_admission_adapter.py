"""The admission rule in the cluster simulator (``serving.sim.control.admission``)."""

from __future__ import annotations

import dataclasses

import pytest

from controlplane.policies.admission import prompt_quartiles
from exporters.slo import Metric, Objective
from serving.sim.cluster.policy import SimPolicy
from serving.sim.cluster.results import SimOptions
from serving.sim.cluster.simulator import Simulator
from serving.sim.cluster.spec import parse_cluster
from serving.sim.cluster.workload import build_workload
from serving.sim.control.admission import SIM_CONFIG, SimAdmission
from serving.sim.control.profile import profile_params
from serving.traces import load_trace

PROFILE = "h100-llama3.1-8b"
OPTIONS = SimOptions(objectives=(Objective(Metric.TTFT, 0.5), Objective(Metric.ITL, 0.05)))


def test_profile_params_are_physical() -> None:
    p = profile_params(PROFILE, prompt_tokens=2048, output_tokens=128)
    assert p.prefill_tokens_per_s > 1_000 and 0 < p.kv_handoff_s < 0.1
    assert p.itl_base_s > 0 and p.itl_per_stream_s >= 0 and p.itl_per_context_token_s >= 0
    assert p.mean_context_tokens == 2048 + 64


def test_overload_keeps_attainment_and_raises_goodput() -> None:
    spec = parse_cluster("prefill=1,decode=1,model=llama3.1-8b")
    work = build_workload(load_trace("azure_conv"), rate_scale=8.0, duration_s=20)
    policy = SimAdmission(profile=spec.profile, objectives=OPTIONS.objectives, interval_s=0.5)
    assert isinstance(policy, SimPolicy)
    plain = Simulator(spec, work, OPTIONS).run()
    shed = Simulator(spec, work, OPTIONS, policy=policy).run()
    assert plain.num_rejected == 0 and shed.num_rejected > 0
    assert shed.stats.attainment_ratio is not None and shed.stats.attainment_ratio >= 0.95
    assert shed.stats.goodput_rps >= 2 * plain.stats.goodput_rps
    # Rejections count against availability, beside goodput.
    assert shed.stats.rejected == shed.num_rejected
    assert shed.stats.availability_ratio == pytest.approx(
        shed.stats.admitted / (shed.stats.admitted + shed.stats.rejected)
    )
    again = Simulator(
        spec, work, OPTIONS,
        policy=SimAdmission(profile=spec.profile, objectives=OPTIONS.objectives, interval_s=0.5),
    ).run()  # fmt: skip
    assert again.num_rejected == shed.num_rejected  # deterministic


def test_light_load_is_admitted() -> None:
    spec = parse_cluster("prefill=1,decode=1,model=llama3.1-8b")
    work = build_workload(load_trace("azure_conv"), rate_scale=1.0, duration_s=20)
    result = Simulator(
        spec,
        work,
        OPTIONS,
        policy=SimAdmission(profile=spec.profile, objectives=OPTIONS.objectives),
    ).run()
    assert result.num_rejected == 0


def test_bad_interval_is_refused() -> None:
    with pytest.raises(ValueError, match="interval_s must be a finite number > 0"):
        SimAdmission(profile=PROFILE, objectives=OPTIONS.objectives, interval_s=0)


def test_the_availability_floor_rides_on_the_quartiles_of_the_prompts_seen() -> None:
    spec = parse_cluster("prefill=1,decode=1,model=llama3.1-8b")
    work = build_workload(load_trace("azure_code"), rate_scale=12.0, duration_s=30)
    floored = SimAdmission(profile=spec.profile, objectives=OPTIONS.objectives, interval_s=0.1)
    Simulator(spec, work, OPTIONS, policy=floored).run()
    bounds = floored.policy.prompt_class_bounds
    assert len(bounds) == 3 and floored.policy.availability_floor == 0.5
    assert bounds == prompt_quartiles(list(work.prompt_tokens)[: floored._bounds_at])
    off = SimAdmission(
        profile=spec.profile,
        objectives=OPTIONS.objectives,
        interval_s=0.1,
        config=dataclasses.replace(SIM_CONFIG, availability_floor=0.0),
    )
    Simulator(spec, work, OPTIONS, policy=off).run()
    assert off.policy.prompt_class_bounds == () and off.rule.num_floor_admitted == 0
    assert set(floored.rule.availability.offered) == {0, 1, 2, 3}  # every class counted
