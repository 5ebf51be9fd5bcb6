"""Clock steps on the exporter side (an NTP correction, a VM resumed, a clock never set).

The recorder reads the wall clock once per request, for ``arrival_time_ns``, and every
token and phase time from the monotonic clock; a wall-clock step therefore moves where a
request is counted, never its latencies. Steps the engine can place (back by minutes, or
forward within its tolerance) are counted with their true latencies; a step it cannot place
(an hour ahead, or back to 1970) is refused at ingest record by record, counted by the
exporter as rejected, and costs the records around it nothing.

A real control plane (``goodput controlplane serve``, SQLite) fed by the real exporter.
"""

from __future__ import annotations

import itertools
import time

import pytest
from prometheus_client import CollectorRegistry

from controlplane.goodput._batch import FUTURE_TOLERANCE_S
from exporters.recorder import RequestRecorder
from exporters.records import Labels, Vantage
from exporters.transport import ControlPlaneExporter
from tests.faults.conftest import ControlPlane

pytestmark = pytest.mark.faults

S = 1_000_000_000


class SteppingWallClock:
    """``time.time_ns`` plus an offset the test steps."""

    def __init__(self) -> None:
        self.offset_ns = 0

    def __call__(self) -> int:
        return time.time_ns() + self.offset_ns


def exporter_for(plane: ControlPlane) -> ControlPlaneExporter:
    return ControlPlaneExporter(
        plane.url, api_key=plane.keys["ingest"], flush_interval_s=0.05,
        backoff_initial_s=0.05, backoff_max_s=0.5, registry=CollectorRegistry(),
    )  # fmt: skip


def slo_stats(plane: ControlPlane) -> dict[str, int]:
    with plane.admin() as http:
        response = http.get("/api/v1/slos/all/goodput", params={"window": "1h"})
        response.raise_for_status()
        body = response.json()
    return {k: int(body[k]) for k in ("requests", "good", "bad")}


def test_steps_the_engine_can_place_keep_every_latency(control_plane: ControlPlane) -> None:
    plane = control_plane.prepare().start()
    clock = SteppingWallClock()
    exporter = exporter_for(plane)
    recorder = RequestRecorder(Vantage.GATEWAY, exporter, wall_clock_ns=clock)
    # Back 30 s, back 10 min, forward within the tolerance, and steps in the middle of a
    # request (between its arrival and its tokens) as well as between requests.
    offsets = itertools.cycle([0, -30 * S, -600 * S, S // 2, -1800 * S])
    sent = 0
    try:
        for k in range(400):
            clock.offset_ns = next(offsets)
            trace = recorder.start(f"r{k}", Labels(model="llama"))
            clock.offset_ns = next(offsets)  # the step lands mid-request
            trace.token()
            trace.tokens(3)
            trace.finish()
            sent += 1
        assert exporter.force_flush(30)
        stats = exporter.stats()
        assert stats.num_rejected_records == stats.num_dropped_records == 0, stats
        assert stats.num_exported_records == sent
        time.sleep(1.5)  # the records stamped half a second ahead land in a past second
        # Every request counted, and good: a wall-clock step is no latency (TTFT 5 s here;
        # a TTFT read from the wall clock would have been minutes).
        assert slo_stats(plane) == {"requests": sent, "good": sent, "bad": 0}
    finally:
        exporter.shutdown(10)


def test_steps_the_engine_cannot_place_are_refused_alone(control_plane: ControlPlane) -> None:
    plane = control_plane.prepare().start()
    clock = SteppingWallClock()
    exporter = exporter_for(plane)
    recorder = RequestRecorder(Vantage.GATEWAY, exporter, wall_clock_ns=clock)
    unplaceable = [
        (FUTURE_TOLERANCE_S + 3600) * S,  # an hour past the engine's tolerance
        -time.time_ns() + 86_400 * S,  # 1970-01-02: a clock that was never set
    ]
    sent = refused = 0
    try:
        for k in range(300):
            bad = k % 10 == 9
            clock.offset_ns = unplaceable[k % 2] if bad else 0
            trace = recorder.start(f"r{k}", Labels(model="llama"))
            trace.token()
            trace.finish()
            sent += 1
            refused += bad
        assert exporter.force_flush(30)
        stats = exporter.stats()
        # Refused one by one and counted (never retried forever, never silently lost) ...
        assert stats.num_rejected_records == refused, stats
        assert stats.num_dropped_records == stats.num_rejected_batches == 0, stats
        assert stats.num_exported_records == sent - refused
        # ... and the good records of the same batches were counted.
        assert slo_stats(plane) == {"requests": sent - refused, "good": sent - refused, "bad": 0}
    finally:
        exporter.shutdown(10)
