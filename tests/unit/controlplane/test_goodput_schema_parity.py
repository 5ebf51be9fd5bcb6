"""The API's goodput model carries every field of the engine's stats, and nothing else:
a field added to one and not the other fails here, not in a client."""

from __future__ import annotations

import dataclasses

from controlplane.goodput import GoodputStats, LatencyPercentiles
from controlplane.schemas.goodput import GoodputStatsPublic, LatencyPercentilesPublic


def test_goodput_stats_and_their_public_model_have_the_same_fields() -> None:
    engine = [f.name for f in dataclasses.fields(GoodputStats)]
    public = list(GoodputStatsPublic.model_fields)
    assert sorted(engine) == sorted(public)


def test_latency_percentiles_and_their_public_model_have_the_same_fields() -> None:
    engine = [f.name for f in dataclasses.fields(LatencyPercentiles)]
    assert sorted(engine) == sorted(LatencyPercentilesPublic.model_fields)
