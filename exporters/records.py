"""Request records: what one component saw of one request, and columnar batches of them.

A :class:`RequestRecord` is the per-request unit every exporter produces and the control
plane consumes. Token timings are kept as *emissions*: each streamed chunk is one emission
with its time (µs after arrival) and the number of tokens it carried. A per-token recorder
emits one token per emission; a component that sees only a summary (vLLM's finished-request
stats, an OTLP span) records ``token_detail=SUMMARY`` with two emissions, the first token and
the last, so TTFT, TPOT and E2EL follow from the same code while ITL is left undefined.

A :class:`RecordBatch` holds N records as columns (numpy arrays, CSR-packed emissions) — the
form the wire codec ships and the metric core computes on. Converting to and from records is
per-request Python work, never per-token.

Example::

    rec = RequestRecord(
        request_id="r1", vantage=Vantage.GATEWAY, labels=Labels(model="llama"),
        arrival_time_ns=1_700_000_000_000_000_000,
        emission_offsets_us=np.array([120_000, 150_000, 185_000]),
    )
    batch = RecordBatch.from_records([rec])
    assert batch.output_tokens().tolist() == [3]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from enum import IntEnum

import numpy as np
import numpy.typing as npt

__all__ = [
    "LABEL_KEYS",
    "NUM_PHASES",
    "LabelColumn",
    "Labels",
    "Phase",
    "RecordBatch",
    "RecordError",
    "RequestRecord",
    "Status",
    "TokenDetail",
    "Vantage",
]

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
U8 = npt.NDArray[np.uint8]
U32 = npt.NDArray[np.uint32]
B = npt.NDArray[np.bool_]


class RecordError(ValueError):
    """A record or batch that breaks the contract; the message names the field and why."""


class Vantage(IntEnum):
    """Where the timings were measured: as the client sees them, or inside the engine."""

    GATEWAY = 0
    ENGINE = 1


class Status(IntEnum):
    """How the request ended (``IN_FLIGHT`` for a partial update of a running request)."""

    IN_FLIGHT = 0
    OK = 1
    ERROR = 2  # failed on the server: admitted and bad
    ABORTED = 3  # cancelled by the client: counted apart
    REJECTED = 4  # shed by admission control: counts against availability


class TokenDetail(IntEnum):
    """How complete the emission times are."""

    FULL = 0  # every emission (chunk) is present: ITL is defined
    SUMMARY = 1  # only the first and the last emission: TTFT, TPOT, E2EL but no ITL


class Phase(IntEnum):
    """Optional phase timestamps, µs after arrival (``-1`` when absent)."""

    QUEUED = 0
    PREFILL_START = 1
    PREFILL_END = 2
    KV_HANDOFF_START = 3
    KV_HANDOFF_END = 4
    FINISHED = 5


NUM_PHASES = len(Phase)
LABEL_KEYS: tuple[str, ...] = ("model", "tenant", "priority", "slo", "route")


@dataclass(frozen=True, slots=True)
class Labels:
    """Bounded request labels. ``slo`` is a hint (header ``x-goodput-slo``), not a verdict."""

    model: str = ""
    tenant: str = ""
    priority: str = ""
    slo: str = ""
    route: str = ""

    def as_tuple(self) -> tuple[str, ...]:
        return (self.model, self.tenant, self.priority, self.slo, self.route)


def _no_phases() -> I64:
    return np.full(NUM_PHASES, -1, dtype=np.int64)


def _empty_i64() -> I64:
    return np.zeros(0, dtype=np.int64)


@dataclass(slots=True)
class RequestRecord:
    """What one vantage point saw of one request.

    ``emission_offsets_us[i]`` is when emission *i* left (µs after arrival, non-decreasing);
    ``emission_tokens[i]`` how many tokens it carried (``None`` means one each). Output tokens
    are their sum. ``final`` is false for a partial update of an in-flight request; each
    update carries the whole state so far, so a later one simply replaces an earlier one.
    """

    request_id: str
    vantage: Vantage
    arrival_time_ns: int
    labels: Labels = field(default_factory=Labels)
    emission_offsets_us: I64 = field(default_factory=_empty_i64)
    emission_tokens: I32 | None = None
    token_detail: TokenDetail = TokenDetail.FULL
    phase_offsets_us: I64 = field(default_factory=_no_phases)
    kv_bytes: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    status: Status = Status.OK
    reason: str = ""
    final: bool = True

    @property
    def output_tokens(self) -> int:
        if self.emission_tokens is None:
            return int(self.emission_offsets_us.shape[0])
        return int(self.emission_tokens.sum())

    def tokens_per_emission(self) -> I32:
        if self.emission_tokens is None:
            return np.ones(self.emission_offsets_us.shape[0], dtype=np.int32)
        return self.emission_tokens


@dataclass(slots=True)
class LabelColumn:
    """A dictionary-encoded string column: ``values[codes[i]]`` is row *i*'s string."""

    values: list[str]
    codes: U32

    @classmethod
    def encode(cls, strings: Sequence[str]) -> LabelColumn:
        index: dict[str, int] = {}
        codes = np.fromiter(
            (index.setdefault(s, len(index)) for s in strings), dtype=np.uint32, count=len(strings)
        )
        return cls(list(index), codes)

    def decode(self) -> list[str]:
        values = self.values
        return [values[c] for c in self.codes.tolist()]

    def mask(self, value: str) -> B:
        """Rows equal to ``value`` (one dictionary lookup, then a vectorised compare)."""
        try:
            code = self.values.index(value)
        except ValueError:
            return np.zeros(self.codes.shape[0], dtype=np.bool_)
        mask: B = self.codes == code
        return mask


@dataclass(slots=True)
class RecordBatch:
    """N request records as columns. Emissions are CSR-packed: request *i* owns
    ``emission_offsets_us[emission_starts[i]:emission_starts[i + 1]]``.
    """

    request_ids: list[str]
    vantage: U8
    arrival_time_ns: I64
    labels: dict[str, LabelColumn]
    status: U8
    reason: LabelColumn
    final: B
    token_detail: U8
    phase_offsets_us: I64  # shape (N, NUM_PHASES)
    kv_bytes: I64
    prompt_tokens: I32
    cached_tokens: I32
    emission_starts: I64  # shape (N + 1,)
    emission_offsets_us: I64  # shape (M,)
    emission_tokens: I32  # shape (M,)

    def __len__(self) -> int:
        return len(self.request_ids)

    @property
    def num_emissions(self) -> int:
        return int(self.emission_offsets_us.shape[0])

    def emissions_per_request(self) -> I64:
        return np.diff(self.emission_starts)

    def output_tokens(self) -> I64:
        """Output tokens per request (sum of its emissions' token counts)."""
        # One reduceat over the non-empty rows, in int32 when no row's sum can pass it: no
        # array the size of the emissions (a cumulative sum, or reduceat's int64 copy of the
        # column), each a fresh mmap under the start-up allocator setting
        # (controlplane/allocator.py).
        starts = self.emission_starts
        counts: I64 = np.zeros(len(self), dtype=np.int64)
        lengths = np.diff(starts)
        has = lengths > 0
        if has.any():
            tokens = self.emission_tokens
            bound = max(int(tokens.max()), -int(tokens.min()))
            fits = bound * int(lengths.max()) <= np.iinfo(np.int32).max
            dtype = tokens.dtype if fits and tokens.dtype == np.int32 else np.int64
            counts[has] = np.add.reduceat(tokens, starts[:-1][has], dtype=dtype)
        return counts

    @classmethod
    def empty(cls) -> RecordBatch:
        return cls.from_records([])

    @classmethod
    def from_records(cls, records: Sequence[RequestRecord]) -> RecordBatch:
        n = len(records)
        lengths = np.fromiter(
            (r.emission_offsets_us.shape[0] for r in records), dtype=np.int64, count=n
        )
        starts = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        if n:
            offsets = np.concatenate([r.emission_offsets_us for r in records]).astype(
                np.int64, copy=False
            )
            tokens = np.concatenate([r.tokens_per_emission() for r in records]).astype(
                np.int32, copy=False
            )
            phases = np.stack([r.phase_offsets_us for r in records]).astype(np.int64, copy=False)
        else:
            offsets = _empty_i64()
            tokens = np.zeros(0, dtype=np.int32)
            phases = np.zeros((0, NUM_PHASES), dtype=np.int64)
        label_rows = [r.labels.as_tuple() for r in records]
        labels = {
            key: LabelColumn.encode([row[k] for row in label_rows])
            for k, key in enumerate(LABEL_KEYS)
        }

        def col(attr: str, dtype: type[np.generic]) -> npt.NDArray[np.generic]:
            return np.fromiter((getattr(r, attr) for r in records), dtype=dtype, count=n)

        return cls(
            request_ids=[r.request_id for r in records],
            vantage=col("vantage", np.uint8).astype(np.uint8),
            arrival_time_ns=col("arrival_time_ns", np.int64).astype(np.int64),
            labels=labels,
            status=col("status", np.uint8).astype(np.uint8),
            reason=LabelColumn.encode([r.reason for r in records]),
            final=col("final", np.bool_).astype(np.bool_),
            token_detail=col("token_detail", np.uint8).astype(np.uint8),
            phase_offsets_us=phases,
            kv_bytes=col("kv_bytes", np.int64).astype(np.int64),
            prompt_tokens=col("prompt_tokens", np.int32).astype(np.int32),
            cached_tokens=col("cached_tokens", np.int32).astype(np.int32),
            emission_starts=starts,
            emission_offsets_us=offsets,
            emission_tokens=tokens,
        )

    def records(self) -> Iterator[RequestRecord]:
        """The rows back as records (per-request work; for tests, debugging and JSON)."""
        label_lists = {key: col.decode() for key, col in self.labels.items()}
        reasons = self.reason.decode()
        starts = self.emission_starts.tolist()
        for i, request_id in enumerate(self.request_ids):
            lo, hi = starts[i], starts[i + 1]
            tokens = self.emission_tokens[lo:hi].copy()
            yield RequestRecord(
                request_id=request_id,
                vantage=Vantage(int(self.vantage[i])),
                arrival_time_ns=int(self.arrival_time_ns[i]),
                labels=Labels(*(label_lists[key][i] for key in LABEL_KEYS)),
                emission_offsets_us=self.emission_offsets_us[lo:hi].copy(),
                emission_tokens=None if bool((tokens == 1).all()) else tokens,
                token_detail=TokenDetail(int(self.token_detail[i])),
                phase_offsets_us=self.phase_offsets_us[i].copy(),
                kv_bytes=int(self.kv_bytes[i]),
                prompt_tokens=int(self.prompt_tokens[i]),
                cached_tokens=int(self.cached_tokens[i]),
                status=Status(int(self.status[i])),
                reason=reasons[i],
                final=bool(self.final[i]),
            )

    def take(self, rows: npt.NDArray[np.bool_] | npt.NDArray[np.integer]) -> RecordBatch:
        """A new batch of the selected rows (boolean mask or integer indices), vectorised."""
        idx = np.flatnonzero(rows) if rows.dtype == np.bool_ else np.asarray(rows, np.int64)
        lengths = self.emissions_per_request()[idx]
        starts = np.zeros(idx.shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        # Gather emission positions of the chosen rows without a Python loop per row.
        emission_idx = np.repeat(self.emission_starts[idx] - starts[:-1], lengths) + np.arange(
            int(starts[-1]), dtype=np.int64
        )
        return RecordBatch(
            request_ids=[self.request_ids[i] for i in idx.tolist()],
            vantage=self.vantage[idx],
            arrival_time_ns=self.arrival_time_ns[idx],
            labels={k: LabelColumn(c.values, c.codes[idx]) for k, c in self.labels.items()},
            status=self.status[idx],
            reason=LabelColumn(self.reason.values, self.reason.codes[idx]),
            final=self.final[idx],
            token_detail=self.token_detail[idx],
            phase_offsets_us=self.phase_offsets_us[idx],
            kv_bytes=self.kv_bytes[idx],
            prompt_tokens=self.prompt_tokens[idx],
            cached_tokens=self.cached_tokens[idx],
            emission_starts=starts,
            emission_offsets_us=self.emission_offsets_us[emission_idx],
            emission_tokens=self.emission_tokens[emission_idx],
        )

    @classmethod
    def concat(cls, batches: Iterable[RecordBatch]) -> RecordBatch:
        """One batch of all rows, in order (label dictionaries re-encoded)."""
        parts = [b for b in batches if len(b)]
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        records: list[RequestRecord] = []
        for b in parts:
            records.extend(b.records())
        return cls.from_records(records)

    def validate(self) -> None:
        """Check the invariants the metric core relies on; raise :class:`RecordError`."""
        n, m = len(self), self.num_emissions
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("labels", "request_ids", "reason"):
                continue
            expected = (
                n + 1 if f.name == "emission_starts" else m if f.name.startswith("emission_") else n
            )
            if value.shape[0] != expected:
                raise RecordError(f"{f.name}: expected {expected} rows, got {value.shape[0]}")
        for key in LABEL_KEYS:
            if key not in self.labels:
                raise RecordError(f"labels.{key}: missing label column")
        for name, column in (*self.labels.items(), ("reason", self.reason)):
            if column.codes.shape[0] != n:
                raise RecordError(f"labels.{name}: expected {n} rows, got {column.codes.shape[0]}")
            if n and int(column.codes.max()) >= len(column.values):
                raise RecordError(f"labels.{name}: code out of range of {len(column.values)}")
        if self.phase_offsets_us.shape != (n, NUM_PHASES):
            raise RecordError(
                f"phase_offsets_us: expected shape ({n}, {NUM_PHASES}), "
                f"got {self.phase_offsets_us.shape}"
            )
        if self.emission_starts[0] != 0 or self.emission_starts[-1] != m:
            raise RecordError(f"emission_starts: must run from 0 to {m}")
        if (np.diff(self.emission_starts) < 0).any():
            raise RecordError("emission_starts: must be non-decreasing")
        # Over the emissions, reductions (min) rather than boolean masks: no temporary the
        # size of the emissions but the steps themselves.
        if m:
            if int(self.emission_offsets_us.min()) < 0:
                raise RecordError("emission_offsets_us: offsets must be >= 0 (after arrival)")
            steps = np.diff(self.emission_offsets_us)
            # A step may go backwards only where a new request begins: step j leads to
            # emission j + 1, so the steps into each request's first emission are cleared.
            inner = self.emission_starts[1:-1]
            steps[inner[(inner > 0) & (inner < m)] - 1] = 0
            if m > 1 and int(steps.min()) < 0:
                pos = int(np.flatnonzero(steps < 0)[0]) + 1
                row = int(np.searchsorted(self.emission_starts, pos, side="right")) - 1
                raise RecordError(
                    f"emission_offsets_us: non-monotonic token times in request "
                    f"{self.request_ids[row]!r} at emission {pos - int(self.emission_starts[row])}"
                )
            if int(self.emission_tokens.min()) < 1:
                raise RecordError("emission_tokens: every emission carries >= 1 token")
        if ((self.status > max(Status)) | (self.vantage > max(Vantage))).any():
            raise RecordError(
                f"status/vantage: allowed values are {[s.name for s in Status]} / "
                f"{[v.name for v in Vantage]}"
            )
        if (self.token_detail > max(TokenDetail)).any():
            raise RecordError(f"token_detail: allowed values are {[d.name for d in TokenDetail]}")
