"""Refusing at ingest, one record at a time, what the goodput engine would drop or misplace.

The wire decoder checks a batch's *shape* (columns, lengths, codes, monotonic token times)
and refuses a malformed batch whole. What is left are records that are well formed but
that the engine could not count where they belong; each is refused alone, with the field
and the reason, so that an acknowledged record is a counted record
(``goodput_ingest_records_total`` equals what the engine counted):

* ``arrival_time_ns`` before 2000-01-01 (:data:`MIN_ARRIVAL_NS`: zero, negative, or a
  clock that was never set) or more than :data:`FUTURE_TOLERANCE_S` ahead of the engine's
  clock;
* ``emission_tokens`` above :data:`MAX_TOKENS_PER_EMISSION` in one emission;
* an emission or phase offset more than :data:`MAX_REQUEST_S` after arrival (which also
  keeps arrival + offset far from int64 overflow);
* ``phase_offsets_us`` out of order (a present phase before an earlier one);
* a final record whose finish time lies outside the engine's window: more than
  :data:`LATE_HORIZON_S` before its clock or more than :data:`FUTURE_TOLERANCE_S` after;
* ``request_id``: a second final record of the same request and vantage in one batch
  (the first is kept).

The work is vectorised (a few numpy passes over rows and emissions); Python per record runs
only for the rows refused, and for the duplicate search when a batch repeats an id.

Example::

    screened = screen(batch, now_s=time.time())
    engine.ingest(screened.batch, now=now_s)
    for rejection in screened.rejections:
        print(rejection.index, rejection.field, rejection.reason)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from controlplane.goodput._batch import FUTURE_TOLERANCE_S, LATE_HORIZON_S
from exporters.records import Phase, RecordBatch

__all__ = [
    "FUTURE_TOLERANCE_S",
    "LATE_HORIZON_S",
    "MAX_REQUEST_S",
    "MAX_TOKENS_PER_EMISSION",
    "MIN_ARRIVAL_NS",
    "RecordRejection",
    "Screened",
    "finish_seconds",
    "screen",
]

B = npt.NDArray[np.bool_]
I64 = npt.NDArray[np.int64]

#: 2000-01-01T00:00:00Z: an earlier arrival is a clock that was never set.
MIN_ARRIVAL_NS = 946_684_800 * 10**9
#: The longest a request may last (token times and phases after its arrival): 7 days.
MAX_REQUEST_S = 7 * 86_400
MAX_REQUEST_US = MAX_REQUEST_S * 10**6
#: The most tokens one emission (a streamed chunk) may carry.
MAX_TOKENS_PER_EMISSION = 1 << 20
_NS_PER_S = 10**9
_MAX_SHOWN_ID = 80


@dataclass(frozen=True, slots=True)
class RecordRejection:
    """Record ``index`` (its row in the batch as sent) was not taken: ``field`` and why."""

    index: int
    request_id: str
    field: str
    reason: str


@dataclass(frozen=True, slots=True)
class Screened:
    """The records taken (``batch``) and the ones refused, in row order.
    ``max_finish_minute``: the latest finish minute (Unix minutes) of the records taken,
    -1 when none (the write-ahead log keeps a segment until a checkpoint covers it)."""

    batch: RecordBatch
    rejections: tuple[RecordRejection, ...]
    max_finish_minute: int = -1


def finish_seconds(batch: RecordBatch) -> I64:
    """Each record's finish second as the engine places it: arrival + its last token time
    (else its finished phase, else 0). For records the screen took (no overflow)."""
    n = len(batch)
    starts, offsets = batch.emission_starts, batch.emission_offsets_us
    has = np.diff(starts) > 0
    last_us = np.zeros(n, dtype=np.int64)
    last_us[has] = offsets[starts[1:][has] - 1]
    finished = batch.phase_offsets_us[:, Phase.FINISHED]
    ended = ~has & (finished >= 0)
    last_us[ended] = finished[ended]
    seconds: I64 = (batch.arrival_time_ns + last_us * 1000) // _NS_PER_S
    return seconds


def _latest_minute(batch: RecordBatch) -> int:
    return int(finish_seconds(batch).max()) // 60 if len(batch) else -1


def _row_max(values: npt.NDArray[np.integer], starts: I64, has: B, n: int) -> I64:
    """Per row, the largest of its emissions' ``values`` (0 for a row without any). Reduced
    in the values' own dtype: no widened copy of every emission."""
    out = np.zeros(n, dtype=np.int64)
    if has.any():
        out[has] = np.maximum.reduceat(values, starts[:-1][has])
    return out


def _checks(batch: RecordBatch, now_s: float) -> tuple[list[tuple[str, B, str]], I64]:
    """``(field, bad rows, reason template)`` in the order the reasons are reported, and
    each row's finish second (:func:`finish_seconds` for the rows whose arrival and
    offsets are in range, the others' meaningless)."""
    n = len(batch)
    starts, offsets = batch.emission_starts, batch.emission_offsets_us
    has = np.diff(starts) > 0
    arrival = batch.arrival_time_ns
    horizon_ns = int((np.floor(now_s) + FUTURE_TOLERANCE_S + 1) * _NS_PER_S)
    tokens = _row_max(batch.emission_tokens, starts, has, n)
    last_us = np.zeros(n, dtype=np.int64)
    last_us[has] = offsets[starts[1:][has] - 1]
    phases = batch.phase_offsets_us
    latest_us = np.maximum(last_us, phases.max(axis=1, initial=-1))
    finished = phases[:, Phase.FINISHED]
    ended = ~has & (finished >= 0)
    last_us[ended] = finished[ended]
    running = np.maximum.accumulate(phases, axis=1)
    out_of_order = ((phases[:, 1:] >= 0) & (phases[:, 1:] < running[:, :-1])).any(axis=1)
    # Safe from overflow: arrival and offsets are within range once the checks above pass.
    sane = (arrival >= MIN_ARRIVAL_NS) & (arrival < horizon_ns) & (latest_us <= MAX_REQUEST_US)
    finish_s = (np.where(sane, arrival, 0) + np.where(sane, last_us, 0) * 1000) // _NS_PER_S
    # The engine's own rule: finish second in (now - horizon, now + tolerance].
    now_floor = int(np.floor(now_s))
    late = sane & batch.final & (finish_s <= now_floor - LATE_HORIZON_S)
    ahead = sane & batch.final & (finish_s > now_floor + FUTURE_TOLERANCE_S)
    checks = [
        ("arrival_time_ns", arrival < MIN_ARRIVAL_NS, "must be >= {MIN_ARRIVAL_NS} "
         "(2000-01-01T00:00:00Z), got {arrival}"),
        ("arrival_time_ns", arrival >= horizon_ns, "is {ahead_s:.0f} s ahead of the control "
         f"plane's clock; at most {FUTURE_TOLERANCE_S} s allowed"),
        ("emission_tokens", tokens > MAX_TOKENS_PER_EMISSION,
         f"at most {MAX_TOKENS_PER_EMISSION} tokens per emission, got {{tokens}}"),
        ("emission_offsets_us", latest_us > MAX_REQUEST_US,
         f"a token time or phase {{latest_us}} µs after arrival; a request lasts at most "
         f"{MAX_REQUEST_S} s"),
        ("phase_offsets_us", out_of_order, "phases must be in order (queued, prefill start, "
         "prefill end, KV handoff start, KV handoff end, finished), got {phases}"),
        ("arrival_time_ns", late, f"the request finished more than {LATE_HORIZON_S} s before "
         "the control plane's clock (at {finish_s}); its minute is closed"),
        ("arrival_time_ns", ahead, "the request finishes at {finish_s}, more than "
         f"{FUTURE_TOLERANCE_S} s after the control plane's clock"),
    ]  # fmt: skip
    return checks, finish_s


def _duplicates(batch: RecordBatch) -> B:
    """Final rows whose (request id, vantage) an earlier final row of the batch has."""
    n = len(batch)
    dup = np.zeros(n, dtype=np.bool_)
    ids = batch.request_ids
    if len(set(ids)) == n:  # the common case, in C
        return dup
    seen: set[tuple[str, int]] = set()
    for row, (request_id, vantage, final) in enumerate(
        zip(ids, batch.vantage.tolist(), batch.final.tolist(), strict=True)
    ):
        if final:
            key = (request_id, vantage)
            dup[row] = key in seen
            seen.add(key)
    return dup


def _shown_id(request_id: str) -> str:
    return request_id if len(request_id) <= _MAX_SHOWN_ID else request_id[:77] + "..."


def screen(batch: RecordBatch, now_s: float) -> Screened:
    """Split ``batch`` (validated) into the records the engine counts at ``now_s`` and the
    refused ones (module doc). Returns ``batch`` itself when nothing is refused."""
    n = len(batch)
    if n == 0:
        return Screened(batch, ())
    checks, finish_s = _checks(batch, now_s)
    checks.append(("request_id", _duplicates(batch), "a final record of this request and "
                   "vantage comes earlier in the batch; one is counted"))  # fmt: skip
    bad = np.zeros(n, dtype=np.bool_)
    for _, rows, _ in checks:
        bad |= rows
    if not bad.any():  # every row in range: its finish second is finish_seconds'
        return Screened(batch, (), int(finish_s.max()) // 60)
    rejections = []
    reported = np.zeros(n, dtype=np.bool_)
    starts = batch.emission_starts
    for field, rows, template in checks:
        for row in np.flatnonzero(rows & ~reported).tolist():
            arrival = int(batch.arrival_time_ns[row])
            emitted = batch.emission_tokens[starts[row] : starts[row + 1]]
            offsets = batch.emission_offsets_us[starts[row] : starts[row + 1]]
            phases = batch.phase_offsets_us[row]
            last = int(offsets[-1]) if offsets.shape[0] else int(phases[Phase.FINISHED])
            values = {
                "MIN_ARRIVAL_NS": MIN_ARRIVAL_NS,
                "arrival": arrival,
                "ahead_s": arrival / _NS_PER_S - now_s,
                "tokens": int(emitted.max()) if emitted.shape[0] else 0,
                "latest_us": max(int(phases.max()), int(offsets.max()) if offsets.shape[0] else 0),
                "phases": phases.tolist(),
                "finish_s": (arrival + max(last, 0) * 1000) // _NS_PER_S,
            }
            reason = template.format(**values)
            rejections.append(
                RecordRejection(row, _shown_id(batch.request_ids[row]), field, reason)
            )
        reported |= rows
    rejections.sort(key=lambda r: r.index)
    taken = batch.take(~bad)
    return Screened(taken, tuple(rejections), _latest_minute(taken))
