"""Records the engine would drop or misplace are refused at ingest, one by one, with a
reason; an acknowledged record is a counted record (issue 15, item 8)."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.goodput import GoodputEngine, SLOSpec
from controlplane.ingest import Deduplicator, Ingestor
from controlplane.ingest.screen import MAX_TOKENS_PER_EMISSION, MIN_ARRIVAL_NS, screen
from exporters.records import NUM_PHASES, Labels, Phase, RecordBatch, RequestRecord, Vantage
from exporters.slo import Metric, Objective
from exporters.wire import BatchHeader

NOW = 1_700_000_000.0
NOW_NS = int(NOW * 1e9)
SPEC = SLOSpec(
    id="all", name="all", objectives=(Objective(Metric.TTFT, 0.2),), target=0.9, window_s=86_400
)


def record(
    request_id: str,
    *,
    arrival_ns: int = NOW_NS - 30 * 10**9,
    offsets: tuple[int, ...] = (100_000, 120_000),
    tokens: tuple[int, ...] | None = None,
    phases: dict[Phase, int] | None = None,
    vantage: Vantage = Vantage.GATEWAY,
    final: bool = True,
) -> RequestRecord:
    phase_offsets = np.full(NUM_PHASES, -1, dtype=np.int64)
    for phase, value in (phases or {}).items():
        phase_offsets[phase] = value
    return RequestRecord(
        request_id=request_id,
        vantage=vantage,
        arrival_time_ns=arrival_ns,
        labels=Labels(model="m"),
        emission_offsets_us=np.array(offsets, dtype=np.int64),
        emission_tokens=None if tokens is None else np.array(tokens, dtype=np.int32),
        phase_offsets_us=phase_offsets,
        final=final,
    )


BAD = {
    "zero arrival": (record("a0", arrival_ns=0), "arrival_time_ns",
                     f"must be >= {MIN_ARRIVAL_NS} (2000-01-01T00:00:00Z), got 0"),
    "negative arrival": (record("a1", arrival_ns=-5), "arrival_time_ns",
                         f"must be >= {MIN_ARRIVAL_NS} (2000-01-01T00:00:00Z), got -5"),
    "far future": (record("a2", arrival_ns=NOW_NS + 3600 * 10**9), "arrival_time_ns",
                   "is 3600 s ahead of the control plane's clock; at most 60 s allowed"),
    "tokens": (record("t", tokens=(1, 2**31 - 1)), "emission_tokens",
               f"at most {MAX_TOKENS_PER_EMISSION} tokens per emission, got 2147483647"),
    "overflow": (record("o", offsets=(2**62,)), "emission_offsets_us",
                 f"a token time or phase {2**62} µs after arrival; a request lasts at most "
                 "604800 s"),
    "phases": (record("p", phases={Phase.PREFILL_START: 50_000, Phase.PREFILL_END: 10_000}),
               "phase_offsets_us", "phases must be in order (queued, prefill start, prefill "
               "end, KV handoff start, KV handoff end, finished), got "
               "[-1, 50000, 10000, -1, -1, -1]"),
    "late": (record("l", arrival_ns=NOW_NS - 3 * 3600 * 10**9), "arrival_time_ns",
             "the request finished more than 7200 s before the control plane's clock (at "
             f"{int(NOW) - 3 * 3600}); its minute is closed"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_each_kind_of_unplaceable_record_is_refused_alone(case: str) -> None:
    bad, field, reason = BAD[case]
    batch = RecordBatch.from_records([record("good-0"), bad, record("good-1")])
    screened = screen(batch, NOW)
    assert screened.batch.request_ids == ["good-0", "good-1"]
    ((index, request_id, got_field, got_reason),) = [
        (r.index, r.request_id, r.field, r.reason) for r in screened.rejections
    ]
    assert (index, request_id, got_field, got_reason) == (1, bad.request_id, field, reason)


def test_a_request_id_repeated_in_a_batch_counts_once() -> None:
    """Regression: three final records of one request in a batch were counted three times."""
    batch = RecordBatch.from_records(
        [record("dup"), record("dup"), record("other"), record("dup"),
         record("dup", vantage=Vantage.ENGINE), record("dup", final=False)]
    )  # fmt: skip
    screened = screen(batch, NOW)
    assert [r.index for r in screened.rejections] == [1, 3]
    assert {r.field for r in screened.rejections} == {"request_id"}
    assert len(screened.batch) == 4


def test_a_clean_batch_is_passed_through_untouched() -> None:
    batch = RecordBatch.from_records([record(f"r{k}") for k in range(5)])
    assert screen(batch, NOW).batch is batch


def test_acknowledged_equals_counted() -> None:
    """Every record the ingestor reports as applied is counted by the engine, and nothing
    it refused is."""
    engine = GoodputEngine(clock=lambda: NOW)
    engine.set_slos([SPEC])
    ingestor = Ingestor(engine, Deduplicator())
    records = [record("good-0"), *(bad for bad, _, _ in BAD.values()), record("good-1"),
               record("good-0")]  # fmt: skip
    outcome = ingestor.apply(
        BatchHeader("gw", 0, NOW_NS), RecordBatch.from_records(records), validated=False
    )
    assert outcome.num_records == 2
    assert len(outcome.rejections) == len(BAD) + 1
    assert engine.query("all", "1h").requests == 2
    health = engine.health()
    assert (health.dropped_late, health.dropped_future) == (0, 0)
