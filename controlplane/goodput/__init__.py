"""The live goodput engine: per-SLO windows over request verdicts, in memory.

:class:`GoodputEngine` ingests :class:`~exporters.records.RecordBatch` values and answers
:class:`GoodputStats` per SLO and window; :class:`GoodputCollector` exposes it to
Prometheus; :class:`MinuteRollup` values carry its history to storage and back.
"""

from controlplane.goodput._blob import rollup_sketches
from controlplane.goodput.collector import GoodputCollector
from controlplane.goodput.engine import DEFAULT_ITL_PERCENTILES, GoodputEngine, UnknownSLOError
from controlplane.goodput.spec import SLOSpec, SpecError, objective_key
from controlplane.goodput.stats import (
    COMPLIANCE,
    STANDARD_WINDOWS,
    EngineHealth,
    GoodputStats,
    LatencyHistogram,
    LatencyPercentiles,
    MinuteRollup,
    SLOTotals,
)

__all__ = [
    "COMPLIANCE",
    "DEFAULT_ITL_PERCENTILES",
    "STANDARD_WINDOWS",
    "EngineHealth",
    "GoodputCollector",
    "GoodputEngine",
    "GoodputStats",
    "LatencyHistogram",
    "LatencyPercentiles",
    "MinuteRollup",
    "SLOSpec",
    "SLOTotals",
    "SpecError",
    "UnknownSLOError",
    "objective_key",
    "rollup_sketches",
]
