"""Trace replay for the demo: a stand-in latency model and the paced driver that turns its
token times into gateway request records for any :class:`~exporters.sinks.RecordSink`."""

from serving.replay.driver import (
    DEFAULT_MODEL,
    RampSchedule,
    ReplayDriver,
    ReplayStats,
    build_record,
)
from serving.replay.latency_model import LatencyModel, ModelParams, RequestTimings

__all__ = [
    "DEFAULT_MODEL",
    "LatencyModel",
    "ModelParams",
    "RampSchedule",
    "ReplayDriver",
    "ReplayStats",
    "RequestTimings",
    "build_record",
]
