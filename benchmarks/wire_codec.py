"""Benchmark: the binary batch codec against one JSON object per token.

Builds batches of 1,000 requests shaped like the Azure LLM inference trace (conversation):
real arrival times, prompt and output lengths from the CSV; token times from a simple model
(TTFT ~ U(50 ms, 500 ms), ITL ~ lognormal around 5 ms, one token per emission as the
per-token recorder writes them, uuid request ids and a few label values). Measures
``encode_batch`` / ``decode_batch`` throughput in token timestamps and requests per second,
and, in the same run, a baseline that ships each token as ``{"request_id", "t"}`` through
``json.dumps`` / ``json.loads``.

``--compare`` also measures the alternatives weighed in docs/wire.md: the JSON form of the
contract, int64 instead of uint32 deltas, the CRC-32 alone, and Arrow IPC when ``pyarrow``
is importable (it is not a project dependency).

Run from the repo root: ``python benchmarks/wire_codec.py [--quick] [--compare]``. The last
line is one JSON object; ``json_per_token_ratio`` = our decode tokens/s ÷ the baseline's.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import sys
import time
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402
import numpy as np  # noqa: E402

from exporters.records import LABEL_KEYS, NUM_PHASES, LabelColumn, Phase, RecordBatch  # noqa: E402
from exporters.wire import (  # noqa: E402
    batch_from_json,
    batch_to_json,
    decode_batch,
    encode_batch,
)
from serving.traces import load_azure  # noqa: E402

BATCH_RECORDS = 1_000
LABEL_VALUES = {
    "model": ["llama-3.1-8b", "llama-3.1-70b"],
    "tenant": [f"tenant-{k}" for k in range(20)],
    "priority": ["interactive", "batch", "system"],
    "slo": ["chat", "bulk"],
    "route": ["pd"],
}


def make_batch(
    rng: np.random.Generator, arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray
) -> RecordBatch:
    """One batch, built column by column (no per-token Python)."""
    n = arrival_s.shape[0]
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(output, out=starts[1:])
    m = int(starts[-1])
    row = np.repeat(np.arange(n), output)
    steps = rng.lognormal(np.log(5_000), 0.5, m)  # ITL in µs
    firsts = starts[:-1][output > 0]
    steps[firsts] = rng.uniform(50_000, 500_000, firsts.shape[0])  # TTFT in µs
    cum = np.cumsum(np.round(steps).astype(np.int64))
    base = np.zeros(n, dtype=np.int64)
    base[output > 0] = cum[firsts] - np.round(steps[firsts]).astype(np.int64)
    offsets = cum - base[row]
    phases = np.full((n, NUM_PHASES), -1, dtype=np.int64)
    phases[:, Phase.FINISHED] = offsets[starts[1:] - 1] + 100
    batch = RecordBatch(
        request_ids=[str(uuid.UUID(int=int(x))) for x in rng.integers(0, 2**62, n)],
        vantage=np.zeros(n, dtype=np.uint8),
        arrival_time_ns=1_700_000_000 * 10**9 + np.round(arrival_s * 1e9).astype(np.int64),
        labels={
            key: LabelColumn(
                LABEL_VALUES[key],
                rng.integers(0, len(LABEL_VALUES[key]), n).astype(np.uint32),
            )
            for key in LABEL_KEYS
        },
        status=np.ones(n, dtype=np.uint8),
        reason=LabelColumn([""], np.zeros(n, dtype=np.uint32)),
        final=np.ones(n, dtype=np.bool_),
        token_detail=np.zeros(n, dtype=np.uint8),
        phase_offsets_us=phases,
        kv_bytes=prompt.astype(np.int64) * 131_072,  # Llama-3.1-8B: 128 KiB per token
        prompt_tokens=prompt.astype(np.int32),
        cached_tokens=np.zeros(n, dtype=np.int32),
        emission_starts=starts,
        emission_offsets_us=offsets,
        emission_tokens=np.ones(m, dtype=np.int32),
    )
    batch.validate()
    return batch


@dataclass
class Codec:
    """One way to ship a batch; ``prepare`` (untimed) may reshape the batch first."""

    encode: Callable[[RecordBatch], bytes]
    decode: Callable[[bytes], object]
    prepare: Callable[[RecordBatch], RecordBatch] = lambda batch: batch
    max_batches: int | None = None  # memory-hungry baselines run on the first batches only


@dataclass
class Totals:
    encode_s: float = 0.0
    decode_s: float = 0.0
    size: int = 0
    tokens: int = 0
    requests: int = 0


def race(
    repeats: int, fns: dict[tuple[str, str], Callable[[], object]]
) -> dict[tuple[str, str], float]:
    """Best-of-``repeats`` time of each function, the functions taking turns in each round so
    that load from other processes falls on all of them alike."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for key, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[key] = min(best[key], time.perf_counter() - start)
    return best


def run(codecs: dict[str, Codec], batches: list[RecordBatch], repeats: int) -> dict[str, Totals]:
    totals = {name: Totals() for name in codecs}
    for k, batch in enumerate(batches):
        fns: dict[tuple[str, str], Callable[[], object]] = {}
        for name, codec in codecs.items():
            if codec.max_batches is not None and k >= codec.max_batches:
                continue
            shaped = codec.prepare(batch)
            data = codec.encode(shaped)
            total = totals[name]
            total.size += len(data)
            total.tokens += shaped.num_emissions
            total.requests += len(shaped)
            fns[name, "encode"] = functools.partial(codec.encode, shaped)
            fns[name, "decode"] = functools.partial(codec.decode, data)
        for (name, step), seconds in race(repeats, fns).items():
            setattr(totals[name], f"{step}_s", getattr(totals[name], f"{step}_s") + seconds)
    return totals


def per_token_json(batch: RecordBatch) -> bytes:
    """The naive wire: one JSON object per token, absolute µs timestamps."""
    counts = np.diff(batch.emission_starts)
    arrival_us = batch.arrival_time_ns // 1_000
    times = (batch.emission_offsets_us + np.repeat(arrival_us, counts)).tolist()
    ids = np.repeat(np.array(batch.request_ids, dtype=object), counts).tolist()
    objects = [{"request_id": rid, "t": t} for rid, t in zip(ids, times, strict=True)]
    return json.dumps(objects).encode()


def encode_v1(batch: RecordBatch) -> bytes:
    return encode_batch(batch, exporter_id="bench", seq=1, sent_time_ns=0)


def encode_json_form(batch: RecordBatch) -> bytes:
    return json.dumps(batch_to_json(batch, exporter_id="bench", seq=1, sent_time_ns=0)).encode()


def body_only(batch: RecordBatch) -> bytes:
    body: bytes = msgpack.unpackb(encode_v1(batch))["body"]
    return body


def with_wide_gap(batch: RecordBatch) -> RecordBatch:
    """The same batch with one 72-minute gap, which makes the codec send int64 deltas."""
    offsets = batch.emission_offsets_us.copy()
    first_end = int(batch.emission_starts[1])
    offsets[first_end - 1 : first_end] += 2**32
    return dataclasses.replace(batch, emission_offsets_us=offsets)


def arrow_codec() -> Codec:
    """Arrow IPC stream of the same columns (emissions as list<int64>), decoded into a
    RecordBatch and checked like ours, so that the two figures compare like for like."""
    import pyarrow as pa

    from exporters._wire_schema import check_batch

    plain = ("vantage", "status", "token_detail", "final", "arrival_time_ns", "kv_bytes")
    plain += ("prompt_tokens", "cached_tokens")

    def encode(batch: RecordBatch) -> bytes:
        dictionaries = {**batch.labels, "reason": batch.reason}
        columns = {
            "request_id": pa.array(batch.request_ids, pa.string()),
            **{name: pa.array(getattr(batch, name)) for name in plain},
            "phase_offsets_us": pa.FixedSizeListArray.from_arrays(
                pa.array(batch.phase_offsets_us.ravel()), NUM_PHASES
            ),
            "emissions": pa.ListArray.from_arrays(
                pa.array(batch.emission_starts.astype(np.int32)),
                pa.array(batch.emission_offsets_us),
            ),
            **{
                k: pa.DictionaryArray.from_arrays(
                    pa.array(c.codes), pa.array(c.values, pa.string())
                )
                for k, c in dictionaries.items()
            },
        }
        table = pa.table(columns)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return bytes(sink.getvalue())

    def label(column: Any) -> LabelColumn:
        chunk = column.combine_chunks()
        return LabelColumn(chunk.dictionary.to_pylist(), chunk.indices.to_numpy().astype(np.uint32))

    def decode(data: bytes) -> RecordBatch:
        table = pa.ipc.open_stream(data).read_all()
        emissions = table.column("emissions").combine_chunks()
        n = table.num_rows
        batch = RecordBatch(
            request_ids=table.column("request_id").to_pylist(),
            **{name: table.column(name).to_numpy().copy() for name in plain},
            labels={k: label(table.column(k)) for k in LABEL_KEYS},
            reason=label(table.column("reason")),
            phase_offsets_us=table.column("phase_offsets_us")
            .combine_chunks()
            .values.to_numpy()
            .reshape(n, NUM_PHASES)
            .copy(),
            emission_starts=emissions.offsets.to_numpy().astype(np.int64),
            emission_offsets_us=emissions.values.to_numpy().copy(),
            emission_tokens=np.ones(len(emissions.values), dtype=np.int32),
        )
        check_batch(batch)
        return batch

    return Codec(encode, decode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 batches, fewer repeats")
    parser.add_argument("--compare", action="store_true", help="also measure the alternatives")
    args = parser.parse_args()
    trace = load_azure("conv")
    num_batches = 5 if args.quick else len(trace) // BATCH_RECORDS
    repeats = 3 if args.quick else 7
    rng = np.random.default_rng(2023)
    columns = (trace.arrival_s, trace.input_tokens, trace.output_tokens)
    batches = [
        make_batch(rng, *(c[k * BATCH_RECORDS : (k + 1) * BATCH_RECORDS] for c in columns))
        for k in range(num_batches)
    ]
    # A list of per-token dicts costs ~250 B per token: the baseline runs on a few batches.
    codecs = {
        "wire": Codec(encode_v1, decode_batch),
        "baseline": Codec(per_token_json, json.loads, max_batches=1 if args.quick else 3),
    }
    if args.compare:
        codecs["json_form"] = Codec(
            encode_json_form, lambda data: batch_from_json(json.loads(data))
        )
        codecs["i64_deltas"] = Codec(encode_v1, decode_batch, prepare=with_wide_gap)
        codecs["crc32"] = Codec(body_only, zlib.crc32)
        if importlib.util.find_spec("pyarrow") is not None:
            codecs["arrow"] = arrow_codec()
    totals = run(codecs, batches, repeats)

    wire, base = totals["wire"], totals["baseline"]
    result: dict[str, Any] = {
        "encode_tokens_per_s": wire.tokens / wire.encode_s,
        "decode_tokens_per_s": wire.tokens / wire.decode_s,
        "requests_per_s": wire.requests / wire.decode_s,
        "json_per_token_ratio": (wire.tokens / wire.decode_s) / (base.tokens / base.decode_s),
        "bytes_per_token": wire.size / wire.tokens,
        "encode_requests_per_s": wire.requests / wire.encode_s,
        "batches": num_batches,
        "records_per_batch": BATCH_RECORDS,
        "tokens": wire.tokens,
    }
    for name, total in totals.items():
        if name == "wire":
            continue
        if name == "crc32":  # the checksum alone, over the bodies
            result["crc32_tokens_per_s"] = total.tokens / total.decode_s
            continue
        result[f"{name}_encode_tokens_per_s"] = total.tokens / total.encode_s
        result[f"{name}_decode_tokens_per_s"] = total.tokens / total.decode_s
        result[f"{name}_bytes_per_token"] = total.size / total.tokens
    if args.compare and "arrow" not in codecs:
        result["arrow"] = "pyarrow not importable: skipped"
    for key, value in result.items():
        print(f"{key:>34}: {value:,.3f}" if isinstance(value, float) else f"{key:>34}: {value}")
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
