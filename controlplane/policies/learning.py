"""Online learning of the latency model admission predicts with. Pure and streaming.

:class:`AdmissionLearner` takes batches of request records as the control plane ingests
them (:meth:`~AdmissionLearner.observe`, columnar: a few numpy passes per batch, no Python
per record) and keeps, from the start, an estimate (:meth:`~AdmissionLearner.params`) that
begins at a prior and moves toward the data:

* **prefill rate** (prompt tokens/s of one instance), from the uncached prompt tokens and
  the time between ``PREFILL_START`` and ``PREFILL_END``, averaged across batches with
  exponential forgetting. Engine records (one instance's batch; the engine's phases start
  when the request is scheduled) give Σ tokens ÷ the time the instance was prefilling (the
  union of the intervals: prompts prefilled together share their seconds). The union is
  kept per exporter (``source``: one engine instance) across batches for
  :data:`BUSY_MEMORY_S`: under chunked prefill consecutive prompts share an iteration, and
  a record shipped in the next batch must not count that shared time twice (it did: the
  rate read about 20 % low with one-second batches). Gateway
  records are used only while no engine record has come: Σ tokens ÷ Σ seconds, whose
  phases include the wait in the prefill queue, so the rate errs low (shedding a little
  early);
* **KV handoff** (``KV_HANDOFF_START`` → ``KV_HANDOFF_END``: the decode's first token after
  the prefill), a forgetting mean;
* **ITL model** ``itl = a + b·batch + c·context_tokens``: each request that decoded at least
  two tokens is one sample — its mean inter-token time (TPOT) against the mean decode batch
  and the mean KV tokens of that batch while it decoded. Batch and context come from the
  overlap of the batch's decode intervals (a step function of running streams integrated
  with cumulative sums: O(n log n)), divided by the number of decode instances the records
  spread over (1 for an engine's own records). The fit is exponentially weighted least
  squares with a ridge prior (the prior is worth ``prior_weight`` samples), the
  closed-form equivalent of recursive least squares with forgetting; slopes are constrained
  to ≥ 0 (the best fit with a slope held at 0 when the free one would be negative);
* **mean decode time** and **mean context** of a stream, forgetting means.

``forget`` is the weight one batch leaves on the past (0.9: about the last ten batches).
Everything is deterministic; there is no clock and no I/O.

Example::

    learner = AdmissionLearner()
    learner.observe(batch)                    # every ingested batch
    params = learner.params()                 # LearnedParams, JSON-ready with to_json()
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from exporters.records import Phase, RecordBatch, Status, Vantage

__all__ = [
    "BUSY_MEMORY_S",
    "DEFAULT_PRIOR",
    "MAX_BUSY_SOURCES",
    "AdmissionLearner",
    "LearnedParams",
    "decode_samples",
]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
#: How far back an engine's counted prefill time is remembered (longer than a request's
#: decode, whose final record carries its prefill interval).
BUSY_MEMORY_S = 600.0
MAX_BUSY_SOURCES = 4096  # engine exporters remembered at once
_CONTEXT_SCALE = 1e4  # context tokens are fitted in units of 10k (a well-conditioned system)


@dataclass(frozen=True, slots=True)
class LearnedParams:
    """The learned latency model and how many samples each part rests on."""

    prefill_tokens_per_s: float
    kv_handoff_s: float
    itl_base_s: float
    itl_per_stream_s: float
    itl_per_context_token_s: float
    mean_decode_s: float
    mean_context_tokens: float
    num_prefill_samples: int = 0
    num_handoff_samples: int = 0
    num_itl_samples: int = 0

    def itl_s(self, batch: float, context_tokens: float) -> float:
        return (
            self.itl_base_s
            + self.itl_per_stream_s * batch
            + self.itl_per_context_token_s * context_tokens
        )

    def to_json(self) -> dict[str, float | int]:
        return asdict(self)


#: Where learning starts before any data: an 8B-class model on one GPU, roughly. Replaced
#: within a few batches of real records; the control plane's settings may give another.
DEFAULT_PRIOR = LearnedParams(
    prefill_tokens_per_s=10_000.0,
    kv_handoff_s=0.02,
    itl_base_s=0.015,
    itl_per_stream_s=0.0002,
    itl_per_context_token_s=1e-8,
    mean_decode_s=5.0,
    mean_context_tokens=1000.0,
)


def decode_samples(
    start_s: F64, end_s: F64, context: F64, *, num_instances: int = 1
) -> tuple[F64, F64]:
    """Per stream, the mean number of streams decoding and their mean total context over
    its own interval ``[start_s, end_s]`` (streams ``context`` tokens each), assuming the
    streams spread evenly over ``num_instances`` instances. Streams with an empty interval
    get NaN."""
    n = start_s.shape[0]
    if n == 0:
        return np.zeros(0), np.zeros(0)
    times = np.concatenate([start_s, end_s])
    order = np.argsort(times, kind="stable")
    sorted_t = times[order]
    steps = np.concatenate([np.ones(n), -np.ones(n)])[order]
    weights = np.concatenate([context, -context])[order]
    running = np.cumsum(steps)  # streams after each breakpoint
    ctx_running = np.cumsum(weights)
    gaps = np.diff(sorted_t, append=sorted_t[-1])
    area = np.concatenate([[0.0], np.cumsum(running * gaps)[:-1]])
    ctx_area = np.concatenate([[0.0], np.cumsum(ctx_running * gaps)[:-1]])
    lo = np.searchsorted(sorted_t, start_s, side="left")
    hi = np.searchsorted(sorted_t, end_s, side="left")
    span = end_s - start_s
    with np.errstate(invalid="ignore", divide="ignore"):
        batch = (area[hi] - area[lo]) / span / num_instances
        ctx = (ctx_area[hi] - ctx_area[lo]) / span / num_instances
    bad = span <= 0
    batch[bad] = np.nan
    ctx[bad] = np.nan
    return batch, ctx


class AdmissionLearner:
    """Streaming estimates of :class:`LearnedParams` (see the module docstring)."""

    def __init__(
        self, prior: LearnedParams = DEFAULT_PRIOR, *, forget: float = 0.9, prior_weight: float = 2
    ) -> None:
        if not 0 < forget <= 1:
            raise ValueError(f"forget must be in (0, 1], got {forget!r}")
        if not (math.isfinite(prior_weight) and prior_weight > 0):
            raise ValueError(f"prior_weight must be a number > 0, got {prior_weight!r}")
        self.prior = prior
        self.forget = forget
        self.prior_weight = prior_weight
        # Σ-statistics with forgetting: (weight, weighted sum) per mean.
        self._prefill = [0.0, 0.0]  # seconds, tokens (gateway records)
        self._prefill_engine = [0.0, 0.0]  # busy seconds, tokens (engine records)
        self._busy: dict[str, _Intervals] = {}  # per exporter: the busy time counted lately
        self._handoff = [0.0, 0.0]
        self._decode = [0.0, 0.0]
        self._context = [0.0, 0.0]
        self._xtx = np.zeros((3, 3))
        self._xty = np.zeros(3)
        self._itl_weight = 0.0  # Σ sample weights under forgetting
        self._theta0 = np.array(
            [
                prior.itl_base_s,
                prior.itl_per_stream_s,
                prior.itl_per_context_token_s * _CONTEXT_SCALE,
            ]
        )
        self.counts = {"prefill": 0, "handoff": 0, "itl": 0}

    def observe(self, batch: RecordBatch, *, decode_instances: int = 1, source: str = "") -> None:
        """Learn from one batch of records (final, successful ones; others are skipped).
        ``decode_instances``: how many decode instances the gateway-vantage records of the
        batch spread over (engine records are one instance's). ``source``: the exporter that
        sent the batch; engine batches of one source are one instance's."""
        if len(batch) == 0:
            return
        ok = batch.final & (batch.status == Status.OK)
        phases = batch.phase_offsets_us
        f = self.forget
        # prefill rate
        start, end = phases[:, Phase.PREFILL_START], phases[:, Phase.PREFILL_END]
        rows = ok & (start >= 0) & (end > start)
        tokens = np.maximum(batch.prompt_tokens - batch.cached_tokens, 0).astype(np.float64)
        rows &= tokens > 0
        engine = batch.vantage == Vantage.ENGINE
        for mask, acc in ((rows & engine, self._prefill_engine), (rows & ~engine, self._prefill)):
            if not mask.any():
                continue
            if acc is self._prefill_engine:  # the instance's busy time
                at = batch.arrival_time_ns[mask] // 1000
                seconds = self._new_busy_s(source, at + start[mask], at + end[mask])
            else:
                seconds = float((end - start)[mask].sum()) / 1e6
            _decay_add(acc, f, seconds, float(tokens[mask].sum()))
            self.counts["prefill"] += int(mask.sum())
        # KV handoff
        h0, h1 = phases[:, Phase.KV_HANDOFF_START], phases[:, Phase.KV_HANDOFF_END]
        rows = ok & (h0 >= 0) & (h1 >= h0)
        if rows.any():
            _decay_add(self._handoff, f, float(rows.sum()), float((h1 - h0)[rows].sum()) / 1e6)
            self.counts["handoff"] += int(rows.sum())
        self._observe_decode(batch, ok, decode_instances)

    def _new_busy_s(self, source: str, start_us: I64, end_us: I64) -> float:
        """Seconds of ``[start_us, end_us]`` not already counted for ``source``."""
        counted = self._busy.get(source)
        if counted is None:
            if len(self._busy) >= MAX_BUSY_SOURCES:  # exporters come and go: forget the oldest
                del self._busy[next(iter(self._busy))]
            counted = _Intervals(np.zeros(0, np.int64), np.zeros(0, np.int64))
        before = _union_s(counted.start_us, counted.end_us)
        merged = _merge(
            np.concatenate([counted.start_us, start_us]), np.concatenate([counted.end_us, end_us])
        )
        after = float((merged.end_us - merged.start_us).sum()) / 1e6
        horizon = int(merged.end_us[-1]) - int(BUSY_MEMORY_S * 1e6)
        keep = merged.end_us > horizon
        self._busy[source] = _Intervals(merged.start_us[keep], merged.end_us[keep])
        return max(after - before, 0.0)

    def _observe_decode(
        self, batch: RecordBatch, ok: npt.NDArray[np.bool_], instances: int
    ) -> None:
        starts = batch.emission_starts
        counts = starts[1:] - starts[:-1]
        out = batch.output_tokens().astype(np.float64)
        rows = ok & (counts >= 2) & (out >= 2)
        if not rows.any():
            return
        f = self.forget
        idx = np.flatnonzero(rows)
        first = batch.emission_offsets_us[starts[idx]].astype(np.float64) / 1e6
        last = batch.emission_offsets_us[starts[idx + 1] - 1].astype(np.float64) / 1e6
        arrival = (batch.arrival_time_ns[idx] - batch.arrival_time_ns[idx].min()) / 1e9
        context = batch.prompt_tokens[idx].astype(np.float64) + out[idx] / 2
        duration = last - first
        tpot = duration / (out[idx] - 1)
        engine = batch.vantage[idx] == Vantage.ENGINE
        _decay_add(self._decode, f, float(idx.size), float(duration.sum()))
        _decay_add(self._context, f, float(idx.size), float(context.sum()))
        xs, ys = [], []
        for mask, n in ((engine, 1), (~engine, max(1, instances))):
            if not mask.any():
                continue
            b, c = decode_samples(
                arrival[mask] + first[mask], arrival[mask] + last[mask], context[mask],
                num_instances=n,
            )  # fmt: skip
            good = np.isfinite(b) & np.isfinite(c) & (tpot[mask] > 0)
            xs.append(np.column_stack([np.ones(good.sum()), b[good], c[good] / _CONTEXT_SCALE]))
            ys.append(tpot[mask][good])
        x = np.concatenate(xs)
        y = np.concatenate(ys)
        self._xtx = f * self._xtx + x.T @ x
        self._xty = f * self._xty + x.T @ y
        self._itl_weight = f * self._itl_weight + y.size
        self.counts["itl"] += int(y.size)

    def params(self) -> LearnedParams:
        """The current estimate (the prior where nothing was observed yet)."""
        p, w = self.prior, self.prior_weight
        # The prior rate weighs as much as ``prior_weight`` × 10 ms of observed prefill.
        seconds, tokens = self._prefill_engine if self._prefill_engine[0] > 0 else self._prefill
        rate = (tokens + w * p.prefill_tokens_per_s * 0.01) / (seconds + w * 0.01)
        handoff = _mean(self._handoff, p.kv_handoff_s, w)
        decode = _mean(self._decode, p.mean_decode_s, w)
        context = _mean(self._context, p.mean_context_tokens, w)
        # Ridge toward the prior, scaled to the features' typical squares.
        scale = np.maximum(np.diag(self._xtx) / max(self._itl_weight, 1.0), 1.0)
        ridge = np.diag(w * scale)
        a, b, c = _nonnegative_slopes(self._xtx + ridge, self._xty + ridge @ self._theta0)
        c /= _CONTEXT_SCALE
        return LearnedParams(
            prefill_tokens_per_s=rate,
            kv_handoff_s=handoff,
            itl_base_s=max(a, 0.1 * p.itl_base_s),
            itl_per_stream_s=b,
            itl_per_context_token_s=c,
            mean_decode_s=max(decode, 1e-3),
            mean_context_tokens=context,
            num_prefill_samples=self.counts["prefill"],
            num_handoff_samples=self.counts["handoff"],
            num_itl_samples=self.counts["itl"],
        )


def _nonnegative_slopes(gram: F64, moment: F64) -> tuple[float, float, float]:
    """Least squares ``gram·θ = moment`` with the two slopes ``θ[1:] >= 0``: the
    unconstrained solution if it is feasible, else the best one with a slope held at 0
    (a 3-parameter problem: the few active sets are tried in turn)."""
    theta = np.linalg.solve(gram, moment)
    if theta[1] >= 0 and theta[2] >= 0:
        return float(theta[0]), float(theta[1]), float(theta[2])
    best: tuple[float, F64] | None = None
    for free in ([0, 1], [0, 2], [0]):
        sub = np.linalg.solve(gram[np.ix_(free, free)], moment[free])
        if (sub[1:] < 0).any():
            continue
        full = np.zeros(3)
        full[free] = sub
        cost = float(full @ gram @ full - 2 * full @ moment)  # the quadratic's value
        if best is None or cost < best[0]:
            best = (cost, full)
    assert best is not None  # the intercept-only set is always feasible
    return float(best[1][0]), float(best[1][1]), float(best[1][2])


class _Intervals(NamedTuple):
    """Disjoint, sorted intervals in microseconds."""

    start_us: I64
    end_us: I64


def _merge(start_us: I64, end_us: I64) -> _Intervals:
    """The union of the intervals ``[start_us, end_us]`` as disjoint sorted intervals."""
    if start_us.size == 0:
        return _Intervals(start_us, end_us)
    order = np.argsort(start_us, kind="stable")
    starts, ends = start_us[order], np.maximum.accumulate(end_us[order])
    first = np.flatnonzero(np.concatenate([[True], starts[1:] > ends[:-1]]))
    last = np.concatenate([first[1:] - 1, [starts.size - 1]])
    return _Intervals(starts[first], ends[last])


def _union_s(start_us: I64, end_us: I64) -> float:
    """Seconds covered by the union of the intervals ``[start_us, end_us]``."""
    merged = _merge(start_us, end_us)
    return float((merged.end_us - merged.start_us).sum()) / 1e6


def _decay_add(acc: list[float], forget: float, weight: float, total: float) -> None:
    acc[0] = forget * acc[0] + weight
    acc[1] = forget * acc[1] + total


def _mean(acc: list[float], prior: float, prior_weight: float) -> float:
    weight, total = acc
    return (total + prior_weight * prior) / (weight + prior_weight)
