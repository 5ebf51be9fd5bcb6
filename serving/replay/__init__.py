"""Trace replay for the demo: a stand-in latency model and the paced driver that turns its
token times into gateway request records for any :class:`~exporters.sinks.RecordSink`."""

from serving.replay.driver import (
    DEFAULT_MODEL,
    RampSchedule,
    ReplayDriver,
    ReplayStats,
    build_record,
)
from serving.replay.latency_model import ModelParams, ReplayLatencyModel, RequestTimings

__all__ = [
    "DEFAULT_MODEL",
    "ModelParams",
    "RampSchedule",
    "ReplayDriver",
    "ReplayLatencyModel",
    "ReplayStats",
    "RequestTimings",
    "build_record",
]
