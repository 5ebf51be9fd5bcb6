"""Engine-side request records from vLLM's per-iteration stats (pure: no vLLM import).

vLLM hands a stat logger, per engine iteration, an ``IterationStats`` with the iteration's
wall-clock ``iteration_timestamp``, the TTFTs of the requests that got their first token in
it (``time_to_first_tokens_iter``, each ``iteration_timestamp − arrival_time``), the prompt
tokens of those requests by source (``prompt_token_stats``), and ``finished_requests``
(``FinishedRequestStats``: ``e2e_latency`` = finishing iteration − arrival, engine-core
``queued_time``/``prefill_time``/``decode_time``, token counts, finish reason). None of the
per-iteration lists names its requests, so :class:`EngineRecordBuilder` joins them:

* **TTFT.** ``arrival = iteration_timestamp − ttft`` of the first-token iteration and
  ``arrival = finishing iteration_timestamp − e2e_latency`` are the same float (the
  frontend's ``arrival_time``) up to rounding; the builder indexes first tokens by arrival
  in microseconds and looks the finished request up (±1 µs). When it is not found
  (a plugin started mid-request, an evicted entry), TTFT falls back to
  ``e2e_latency − decode_time`` (engine-core clock), counted in ``num_ttft_fallbacks``.
* **Externally transferred prompt tokens.** vLLM counts them per request
  (``EngineCoreOutput.prefill_stats``) but gives stat loggers only the iteration's sum
  (``prompt_token_stats.external_kv_transfer``). The builder attributes the sum exactly when
  it is unambiguous — one first token in the iteration, or a zero sum — and otherwise
  leaves the requests' ``kv_bytes`` at 0 and counts the tokens in
  ``num_unattributed_kv_tokens``. ``kv_bytes = external tokens × kv_bytes_per_token``.

Each record: vantage ENGINE, token_detail SUMMARY with emissions at TTFT (1 token) and at
E2E (n − 1 tokens), phases QUEUED / PREFILL_START / PREFILL_END / FINISHED (µs after
arrival, clamped into order), ``prompt_tokens``, ``cached_tokens`` (local prefix cache plus
KV transfer), status from the finish reason, and the gateway's request id
(:func:`gateway_request_id`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from exporters.records import NUM_PHASES, Labels, Phase, RequestRecord, Status, TokenDetail, Vantage

__all__ = [
    "BuilderStats",
    "EngineRecordBuilder",
    "FinishedStats",
    "gateway_request_id",
    "status_of",
]

_PREFIXES = ("chatcmpl-", "cmpl-")
_STATUS = {"stop": Status.OK, "length": Status.OK, "repetition": Status.OK}
_STATUS |= {"abort": Status.ABORTED, "error": Status.ERROR}


class FinishedStats(Protocol):
    """The fields of vLLM's ``FinishedRequestStats`` the builder reads."""

    @property
    def request_id(self) -> str | None: ...
    @property
    def finish_reason(self) -> object: ...
    @property
    def e2e_latency(self) -> float: ...
    @property
    def queued_time(self) -> float: ...
    @property
    def prefill_time(self) -> float: ...
    @property
    def decode_time(self) -> float: ...
    @property
    def num_prompt_tokens(self) -> int: ...
    @property
    def num_generation_tokens(self) -> int: ...
    @property
    def num_cached_tokens(self) -> int: ...


def gateway_request_id(engine_request_id: str) -> str:
    """The client's ``X-Request-Id`` behind a vLLM request id.

    vLLM's OpenAI server names a request ``cmpl-<X-Request-Id>-<prompt index>`` on
    ``/v1/completions`` and ``chatcmpl-<X-Request-Id>`` on ``/v1/chat/completions`` (a random
    id replaces the header when there is none). The endpoint prefix and the completions
    prompt index 0 are removed; other indices stay (``gw-1-2`` for the third prompt of a
    batch). Ids of other shapes are returned unchanged.
    """
    for prefix in _PREFIXES:
        if engine_request_id.startswith(prefix):
            rest = engine_request_id[len(prefix) :]
            if prefix == "cmpl-" and rest.endswith("-0"):
                rest = rest[:-2]
            return rest or engine_request_id
    return engine_request_id


def status_of(finish_reason: object) -> tuple[Status, str]:
    """The record status and reason for a vLLM finish reason (``str()`` of its enum)."""
    reason = str(finish_reason).lower()
    return _STATUS.get(reason, Status.ERROR), reason


@dataclass(frozen=True, slots=True)
class BuilderStats:
    num_records: int
    num_ttft_fallbacks: int
    num_unattributed_kv_tokens: int
    num_evicted: int
    num_pending: int


@dataclass(slots=True)
class _FirstToken:
    ttft_s: float
    external_tokens: int | None  # None: not attributable


class EngineRecordBuilder:
    """Joins first tokens and finished requests into engine records (see the module doc).

    ``max_pending`` bounds the first tokens remembered for requests not finished yet (the
    oldest are evicted and counted). Not thread-safe: one per engine, fed in order.
    """

    def __init__(self, *, model: str, kv_bytes_per_token: int, max_pending: int = 65_536) -> None:
        if kv_bytes_per_token < 0:
            raise ValueError(f"kv_bytes_per_token must be >= 0, got {kv_bytes_per_token}")
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.labels = Labels(model=model)
        self.kv_bytes_per_token = kv_bytes_per_token
        self.max_pending = max_pending
        self._first: OrderedDict[int, _FirstToken] = OrderedDict()
        self._num_records = 0
        self._num_fallbacks = 0
        self._num_unattributed = 0
        self._num_evicted = 0

    def stats(self) -> BuilderStats:
        return BuilderStats(
            num_records=self._num_records,
            num_ttft_fallbacks=self._num_fallbacks,
            num_unattributed_kv_tokens=self._num_unattributed,
            num_evicted=self._num_evicted,
            num_pending=len(self._first),
        )

    def observe_first_tokens(
        self, iteration_time: float, ttfts_s: Sequence[float], external_tokens: int
    ) -> None:
        """Note the first tokens of one iteration and its externally transferred tokens."""
        if not ttfts_s:
            return
        if len(ttfts_s) == 1 or external_tokens == 0:
            share: int | None = external_tokens if len(ttfts_s) == 1 else 0
        else:
            share = None
            self._num_unattributed += external_tokens
        for ttft in ttfts_s:
            key = round((iteration_time - ttft) * 1e6)
            self._first[key] = _FirstToken(ttft, share)
            self._first.move_to_end(key)
        while len(self._first) > self.max_pending:
            self._first.popitem(last=False)
            self._num_evicted += 1

    def build(self, finished: FinishedStats, iteration_time: float) -> RequestRecord:
        """The engine record of a request that finished in the iteration at
        ``iteration_time`` (wall-clock seconds)."""
        e2e = max(0.0, float(finished.e2e_latency))
        arrival = iteration_time - e2e
        first = self._pop_first(arrival)
        n = int(finished.num_generation_tokens)
        if first is not None:
            ttft = first.ttft_s
        else:
            ttft = e2e - max(0.0, float(finished.decode_time))
            if n:
                self._num_fallbacks += 1
        ttft = min(max(ttft, 0.0), e2e)
        e2e_us, ttft_us = round(e2e * 1e6), round(ttft * 1e6)

        if n >= 2:
            offsets = np.array([ttft_us, e2e_us], dtype=np.int64)
            tokens: np.ndarray | None = np.array([1, n - 1], dtype=np.int32)
        elif n == 1:
            offsets, tokens = np.array([ttft_us], dtype=np.int64), None
        else:
            offsets, tokens = np.zeros(0, dtype=np.int64), None

        phases = np.full(NUM_PHASES, -1, dtype=np.int64)
        phases[Phase.FINISHED] = e2e_us
        if n:
            prefill_s, queued_s = float(finished.prefill_time), float(finished.queued_time)
            phases[Phase.PREFILL_END] = ttft_us
            if 0.0 <= prefill_s <= ttft:
                start = ttft - prefill_s
                phases[Phase.PREFILL_START] = round(start * 1e6)
                if queued_s >= 0.0:
                    phases[Phase.QUEUED] = round(max(0.0, start - queued_s) * 1e6)

        external = first.external_tokens if first is not None else None
        status, reason = status_of(finished.finish_reason)
        self._num_records += 1
        return RequestRecord(
            request_id=gateway_request_id(finished.request_id or "unknown"),
            vantage=Vantage.ENGINE,
            arrival_time_ns=round(arrival * 1e9),
            labels=self.labels,
            emission_offsets_us=offsets,
            emission_tokens=tokens,
            token_detail=TokenDetail.SUMMARY,
            phase_offsets_us=phases,
            kv_bytes=(external or 0) * self.kv_bytes_per_token,
            prompt_tokens=int(finished.num_prompt_tokens),
            cached_tokens=min(int(finished.num_cached_tokens), int(finished.num_prompt_tokens)),
            status=status,
            reason=reason,
        )

    def _pop_first(self, arrival: float) -> _FirstToken | None:
        key = round(arrival * 1e6)
        for candidate in (key, key - 1, key + 1):
            found = self._first.pop(candidate, None)
            if found is not None:
                return found
        return None
