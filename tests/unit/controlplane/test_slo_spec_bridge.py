"""Registry rows → the goodput engine's SLOSpec (pure: ORM objects never touch a database)."""

from __future__ import annotations

import uuid

from controlplane.models import SLO, SLOVantage
from controlplane.services.slos import to_spec
from exporters.records import Vantage
from exporters.slo import Metric, Objective


def row(**overrides: object) -> SLO:
    fields: dict[str, object] = {
        "id": uuid.UUID("7c9e6679-7425-40de-944b-e07fc1f90ae7"),
        "name": "chat",
        "selector": {"model": "llama", "tenant": "acme"},
        "objectives": [
            {"metric": "ttft", "threshold_s": 0.2, "statistic": "max"},
            {"metric": "itl", "threshold_s": 0.05, "statistic": "p99"},
        ],
        "target": 0.99,
        "window_s": 2_419_200,
        "vantage": SLOVantage.ENGINE,
        "availability_target": 0.999,
        "infeasible": "reject",
        "version": 4,
    }
    fields.update(overrides)
    return SLO(**fields)


def test_every_field_carries_over() -> None:
    spec = to_spec(row())
    assert spec.id == "7c9e6679-7425-40de-944b-e07fc1f90ae7"
    assert spec.name == "chat"
    assert spec.objectives == (Objective(Metric.TTFT, 0.2), Objective(Metric.ITL, 0.05, "p99"))
    assert (spec.target, spec.window_s, spec.version) == (0.99, 2_419_200.0, 4)
    assert dict(spec.selector) == {"model": "llama", "tenant": "acme"}
    assert spec.vantage is Vantage.ENGINE
    assert spec.availability_target == 0.999
    assert spec.infeasible == "reject"
    assert to_spec(row(infeasible=None)).infeasible == "admit"  # not flushed: the default
    assert spec.objective_keys == ("ttft", "itl_p99")


def test_repeated_objectives_reduce_to_the_strictest() -> None:
    spec = to_spec(
        row(
            objectives=[
                {"metric": "ttft", "threshold_s": 0.5, "statistic": "max"},
                {"metric": "e2el", "threshold_s": 9.0, "statistic": "max"},
                {"metric": "ttft", "threshold_s": 0.2, "statistic": "max"},
            ]
        )
    )
    assert spec.objectives == (Objective(Metric.TTFT, 0.2), Objective(Metric.E2EL, 9.0))


def test_no_objectives_is_an_availability_only_slo() -> None:
    assert to_spec(row(objectives=[], vantage=SLOVantage.GATEWAY)).objectives == ()
