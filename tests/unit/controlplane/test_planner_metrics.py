"""``goodput_planner_*`` as :class:`~controlplane.runtime.loop_metrics.PlannerCollector`
serves them from a planner's state: the moves counter from 0, and the last recorded effect of
a planner move per pool (predicted and observed goodput), absent until one is recorded."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.policies.planner import Plan
from controlplane.runtime.loop_metrics import MoveEffect, PlannerCollector

PREDICTED = "goodput_planner_move_predicted_goodput_rps"
OBSERVED = "goodput_planner_move_observed_goodput_rps"


@dataclass
class FakePlanner:
    moves_started: dict[str, int] = field(default_factory=dict)
    last_plan: Plan | None = None
    move_effects: dict[str, MoveEffect] = field(default_factory=dict)


def scrape(planner: FakePlanner) -> tuple[str, dict[str, dict[str, float]]]:
    registry = CollectorRegistry()
    registry.register(PlannerCollector(planner))
    text = generate_latest(registry).decode()
    samples: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[sample.labels.get("to_role", "")] = sample.value
    return text, samples


def test_move_effects_are_declared_and_absent_until_one_is_recorded() -> None:
    text, samples = scrape(FakePlanner())
    assert f"# TYPE {PREDICTED} gauge" in text
    assert f"# TYPE {OBSERVED} gauge" in text
    assert PREDICTED not in samples and OBSERVED not in samples
    assert samples["goodput_planner_moves_total"] == {"prefill": 0, "decode": 0, "both": 0}


def test_the_last_effect_per_pool_is_exported() -> None:
    planner = FakePlanner(
        moves_started={"prefill": 2, "decode": 1},
        move_effects={
            "prefill": MoveEffect(predicted_goodput_rps=12.5, observed_goodput_rps=11.0),
            "decode": MoveEffect(predicted_goodput_rps=9.0, observed_goodput_rps=9.75),
        },
    )
    _, samples = scrape(planner)
    assert samples[PREDICTED] == {"prefill": 12.5, "decode": 9.0}
    assert samples[OBSERVED] == {"prefill": 11.0, "decode": 9.75}
    # A later move to the same pool replaces its pair: one series per pool, never more.
    planner.move_effects["prefill"] = MoveEffect(14.0, 13.5)
    _, samples = scrape(planner)
    assert samples[PREDICTED] == {"prefill": 14.0, "decode": 9.0}
    assert samples[OBSERVED] == {"prefill": 13.5, "decode": 9.75}


def test_a_move_without_a_prediction_exports_only_what_was_observed() -> None:
    _, samples = scrape(FakePlanner(move_effects={"both": MoveEffect(None, 3.0)}))
    assert PREDICTED not in samples
    assert samples[OBSERVED] == {"both": 3.0}


@pytest.mark.parametrize(
    ("recorded", "effect"),
    [
        ({"observed_goodput_rps": 4, "predicted_goodput_rps": 5.5}, MoveEffect(5.5, 4.0)),
        ({"observed_goodput_rps": 0.0, "predicted_goodput_rps": None}, MoveEffect(None, 0.0)),
        ({"observed_goodput_rps": 2.0}, MoveEffect(None, 2.0)),
    ],
)
def test_move_effect_of_a_recorded_observed_effect(
    recorded: Mapping[str, object], effect: MoveEffect
) -> None:
    assert MoveEffect.of(recorded) == effect
