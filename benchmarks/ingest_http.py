"""Benchmark: ingest over HTTP into the live goodput engine, wire batches against OTLP spans.

Starts the control plane the way a user does (``goodput db upgrade``, ``goodput admin
create-key``, ``goodput slo apply``, ``goodput controlplane serve``: uvicorn, one worker,
SQLite in a temporary folder, three SLOs) as a subprocess. Requests are shaped like the
Azure LLM inference trace (conversation): prompt and output lengths from the CSV, arrivals
squeezed into the last 10 minutes, token times from a simple model (TTFT = 20 ms + 50 µs per
prompt token, ITL ~ gamma(4, 4 ms), one token per emission as the per-token recorder
writes them). A separate client process then, with a few concurrent keep-alive
connections, sends as fast as it can for N seconds:

1. binary wire batches of 512 records (the exporter's default) to ``/api/v1/ingest``,
   pre-encoded; only each batch's ``seq`` is patched per send (and its CRC recomputed) so
   that de-duplication lets every one through;
2. the same requests as OTLP/HTTP protobuf ``llm_request`` spans with one ``token`` event
   per token (512 spans per export, the OpenTelemetry SDK's default) to ``/v1/traces``.

Baseline measured in the same run: the in-process ceiling of the wire path (decode + engine
ingest with the same SLOs, one thread, no HTTP).

Run from the repo root: ``python benchmarks/ingest_http.py [--quick]``. The last line is one
JSON object: ``tokens_per_s`` / ``requests_per_s`` (wire path with durable acknowledgement,
the default: every batch in the fsync'd write-ahead log before its 200, applied as the
server reported), ``durable_ratio`` = that ÷ ``nondurable_tokens_per_s`` (the same server
with ``GOODPUT_DURABLE_INGEST=false``, same run), ``otlp_tokens_per_s`` and ``otlp_ratio`` =
wire tokens/s ÷ OTLP tokens/s, and
``inprocess_tokens_per_s`` / ``inprocess_requests_per_s`` (the baseline), and
``server_cpu_ms_per_batch`` / ``server_cores``: the durable server's CPU (user + system,
from ``/proc``) per wire batch and per second of the durable wire phase. The rates move with
the machine's speed and its other work; the server is one process that uses about one core
(its Python runs under one lock), so 50 k records/s of 512-record batches needs at most about
10 ms of its CPU a batch on any machine.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import msgpack  # noqa: E402
import numpy as np  # noqa: E402

BATCH_RECORDS = 512
SEQ_BASE = 0x5EC0_0000_0000_0000  # >= 2**32: msgpack writes every seq as 0xcf + 8 bytes
SLO_YAML = """\
name: chat
selector: {model: llama-3.1-8b}
objectives:
  - {metric: ttft, threshold_s: 0.5}
  - {metric: itl, threshold_s: 0.05, statistic: p99}
target: 0.99
window_s: 2419200
---
name: chat-tpot
selector: {model: llama-3.1-8b}
objectives:
  - {metric: tpot, threshold_s: 0.03}
target: 0.95
window_s: 86400
---
name: everything
objectives:
  - {metric: e2el, threshold_s: 30}
target: 0.9
window_s: 604800
"""


# -- workload ---------------------------------------------------------------------------


def workload(num_requests: int, now_s: float) -> Any:
    """Columns of ``num_requests`` Azure-conversation requests ending before ``now_s``."""
    from serving.traces import load_trace

    trace = load_trace("azure_conv")
    n = min(num_requests, len(trace))
    rng = np.random.default_rng(7)
    outputs = np.maximum(trace.output_tokens[:n], 1).astype(np.int64)
    inputs = trace.input_tokens[:n].astype(np.int64)
    span_s = max(float(trace.arrival_s[n - 1]), 1.0)
    arrival_ns = ((now_s - 660.0 + trace.arrival_s[:n] * (600.0 / span_s)) * 1e9).astype(np.int64)
    starts = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(outputs, out=starts[1:])
    gaps_us = np.maximum(rng.gamma(4.0, 4_000.0, size=int(starts[-1])), 1).astype(np.int64)
    ttft_us = (20_000 + 50 * inputs).astype(np.int64)
    gaps_us[starts[:-1]] = ttft_us  # each request's first "gap" is its TTFT
    offsets = np.cumsum(gaps_us)
    offsets -= np.repeat(offsets[starts[:-1]] - ttft_us, outputs)
    return {
        "n": n,
        "arrival_ns": arrival_ns,
        "inputs": inputs,
        "outputs": outputs,
        "starts": starts,
        "offsets_us": offsets,
    }


def wire_batches(w: Any) -> list[tuple[bytes, int, int, int]]:
    """``(encoded batch, offset of its seq's 8 bytes, records, tokens)`` per 512 requests."""
    from exporters.records import LABEL_KEYS, NUM_PHASES, LabelColumn, RecordBatch
    from exporters.wire import encode_batch

    out: list[tuple[bytes, int, int, int]] = []
    for lo in range(0, w["n"], BATCH_RECORDS):
        hi = min(lo + BATCH_RECORDS, w["n"])
        m = hi - lo
        a, b = int(w["starts"][lo]), int(w["starts"][hi])
        labels = {key: LabelColumn([""], np.zeros(m, dtype=np.uint32)) for key in LABEL_KEYS}
        labels["model"] = LabelColumn(["llama-3.1-8b"], np.zeros(m, dtype=np.uint32))
        batch = RecordBatch(
            request_ids=[f"req-{k:08d}" for k in range(lo, hi)],
            vantage=np.zeros(m, dtype=np.uint8),
            arrival_time_ns=w["arrival_ns"][lo:hi].copy(),
            labels=labels,
            status=np.ones(m, dtype=np.uint8),
            reason=LabelColumn([""], np.zeros(m, dtype=np.uint32)),
            final=np.ones(m, dtype=np.bool_),
            token_detail=np.zeros(m, dtype=np.uint8),
            phase_offsets_us=np.full((m, NUM_PHASES), -1, dtype=np.int64),
            kv_bytes=np.zeros(m, dtype=np.int64),
            prompt_tokens=w["inputs"][lo:hi].astype(np.int32),
            cached_tokens=np.zeros(m, dtype=np.int32),
            emission_starts=w["starts"][lo : hi + 1] - a,
            emission_offsets_us=w["offsets_us"][a:b].copy(),
            emission_tokens=np.ones(b - a, dtype=np.int32),
        )
        data = encode_batch(batch, exporter_id="bench", seq=SEQ_BASE)
        body = msgpack.unpackb(data)["body"]
        marker = b"\xcf" + SEQ_BASE.to_bytes(8, "big")
        assert body.count(marker) == 1, "the seq marker must be unique in the body"
        out.append((body, body.index(marker) + 1, m, b - a))
    return out


def otlp_requests(w: Any, limit: int) -> list[tuple[bytes, int, int]]:
    """``(ExportTraceServiceRequest protobuf, spans, tokens)`` per 512 requests."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

    out: list[tuple[bytes, int, int]] = []
    for lo in range(0, min(w["n"], limit * BATCH_RECORDS), BATCH_RECORDS):
        hi = min(lo + BATCH_RECORDS, w["n"])
        request = ExportTraceServiceRequest()
        resource = request.resource_spans.add()
        resource.resource.attributes.append(
            KeyValue(key="service.name", value=AnyValue(string_value="llama-3.1-8b"))
        )
        spans = resource.scope_spans.add().spans
        for k in range(lo, hi):
            a, b = int(w["starts"][k]), int(w["starts"][k + 1])
            start = int(w["arrival_ns"][k])
            times = (start + w["offsets_us"][a:b] * 1000).tolist()
            span = spans.add(
                trace_id=k.to_bytes(16, "big"),
                span_id=(k + 1).to_bytes(8, "big"),
                name="llm_request",
                kind=2,
                start_time_unix_nano=start,
                end_time_unix_nano=times[-1],
            )
            span.attributes.extend(
                [
                    KeyValue(key="gen_ai.request.id", value=AnyValue(string_value=f"req-{k}")),
                    KeyValue(
                        key="gen_ai.usage.prompt_tokens",
                        value=AnyValue(int_value=int(w["inputs"][k])),
                    ),
                    KeyValue(key="gen_ai.usage.completion_tokens", value=AnyValue(int_value=b - a)),
                ]
            )
            events = span.events
            for t in times:
                events.add(time_unix_nano=t, name="token")
        out.append((request.SerializeToString(), hi - lo, int(w["starts"][hi] - w["starts"][lo])))
    return out


# -- the client process -----------------------------------------------------------------


def rejected_spans(body: bytes) -> int:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceResponse,
    )

    return int(ExportTraceServiceResponse.FromString(body).partial_success.rejected_spans)


def client_main(spec_path: str) -> None:
    """Send for ``duration_s`` on ``connections`` threads; print totals as JSON."""
    spec = json.loads(Path(spec_path).read_text())
    folder = Path(spec["folder"])
    headers = {"Authorization": f"Bearer {spec['key']}"}
    deadline = time.perf_counter() + spec["duration_s"]
    totals = {"records": 0, "tokens": 0, "requests": 0, "errors": 0}
    lock = threading.Lock()
    if spec["kind"] == "wire":
        meta = json.loads((folder / "wire.json").read_text())
        bodies = [(folder / f"wire-{k}.bin").read_bytes() for k in range(len(meta))]
        counter = iter(range(10**12))

        def next_payload() -> tuple[bytes, int, int]:
            with lock:
                n = next(counter)
            k = n % len(bodies)
            body, pos = bodies[k], meta[k][0]
            patched = body[:pos] + (SEQ_BASE + n).to_bytes(8, "big") + body[pos + 8 :]
            envelope = {"v": 1, "crc32": zlib.crc32(patched), "body": patched}
            return msgpack.packb(envelope, use_bin_type=True), meta[k][1], meta[k][2]

        url = spec["url"] + "/api/v1/ingest"
        content_type = "application/vnd.goodput.batch+msgpack"
    else:
        meta = json.loads((folder / "otlp.json").read_text())
        payloads = [(folder / f"otlp-{k}.bin").read_bytes() for k in range(len(meta))]
        cycle = iter(range(10**12))

        def next_payload() -> tuple[bytes, int, int]:
            with lock:
                k = next(cycle) % len(payloads)
            return payloads[k], meta[k][0], meta[k][1]

        url = spec["url"] + "/v1/traces"
        content_type = "application/x-protobuf"

    def worker() -> None:
        with httpx.Client(headers={**headers, "Content-Type": content_type}, timeout=60) as http:
            while time.perf_counter() < deadline:
                body, records, tokens = next_payload()
                response = http.post(url, content=body)
                with lock:
                    totals["requests"] += 1
                    if response.status_code != 200:
                        totals["errors"] += 1
                        continue
                    if spec["kind"] == "wire":
                        applied = response.json()
                        totals["records"] += applied["num_records"]
                        totals["tokens"] += applied["num_tokens"]
                    elif rejected_spans(response.content):
                        totals["errors"] += 1  # counted only when every span was mapped
                    else:
                        totals["records"] += records
                        totals["tokens"] += tokens

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(spec["connections"])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    totals["elapsed_s"] = time.perf_counter() - started  # type: ignore[assignment]
    print(json.dumps(totals))


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_client(spec: dict[str, Any], folder: Path) -> dict[str, Any]:
    path = folder / f"client-{spec['kind']}{spec.get('name', '')}.json"
    path.write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, __file__, "--client", str(path)],
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# -- the server ---------------------------------------------------------------------------


def goodput(env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "goodput", *args],
        env=env,
        input=stdin,
        check=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    return done.stdout.strip()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_server(
    env: dict[str, str], port: int, launcher: list[str] | None = None
) -> subprocess.Popen[bytes]:
    """``goodput controlplane serve`` on ``port``; ``launcher`` replaces ``python -m`` (a
    wrapper that runs the ``goodput`` module, e.g. the soak's memory tracer)."""
    server = subprocess.Popen(
        [
            *(launcher or [sys.executable, "-m"]),
            "goodput",
            "controlplane",
            "serve",
            "--port",
            str(port),
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.1)
    server.kill()
    raise RuntimeError("the control plane did not start")


# -- the in-process baseline --------------------------------------------------------------


def inprocess_rates(
    batches: list[tuple[bytes, int, int, int]], duration_s: float
) -> tuple[float, float]:
    """(token timestamps/s, requests/s) of decode + engine ingest in this process."""
    import uuid

    from controlplane.goodput import GoodputEngine
    from controlplane.models import SLO
    from controlplane.openslo import parse_documents
    from controlplane.services.slos import to_spec
    from exporters.wire import decode_batch

    engine = GoodputEngine()
    specs = []
    for definition in parse_documents(SLO_YAML):
        row = SLO(
            id=uuid.uuid4(),
            name=definition.name,
            selector=definition.selector.model_dump(exclude_none=True),
            objectives=[o.model_dump() for o in definition.objectives],
            target=definition.target,
            window_s=definition.window_s,
            vantage=definition.vantage,
            availability_target=definition.availability_target,
            version=1,
        )
        specs.append(to_spec(row))
    engine.set_slos(specs)
    tokens, records, n = 0, 0, 0
    started = time.perf_counter()
    while time.perf_counter() - started < duration_s:
        body, pos, num_records, count = batches[n % len(batches)]
        patched = body[:pos] + (SEQ_BASE + n).to_bytes(8, "big") + body[pos + 8 :]
        data = msgpack.packb({"v": 1, "crc32": zlib.crc32(patched), "body": patched})
        _, batch = decode_batch(data)
        engine.ingest(batch, validate=False)
        tokens += count
        records += num_records
        n += 1
    elapsed = time.perf_counter() - started
    return tokens / elapsed, records / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter phases, less data")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        client_main(args.client)
        return
    duration_s, num_requests, otlp_exports = (
        (3.0, 8 * BATCH_RECORDS, 2)
        if args.quick
        else (
            15.0,
            19_000,
            6,
        )
    )
    connections = 4
    with tempfile.TemporaryDirectory(prefix="goodput-bench-") as tmp:
        folder = Path(tmp)
        w = workload(num_requests, time.time())
        batches = wire_batches(w)
        (folder / "wire.json").write_text(json.dumps([[p, r, t] for _, p, r, t in batches]))
        for k, (body, *_rest) in enumerate(batches):
            (folder / f"wire-{k}.bin").write_bytes(body)
        exports = otlp_requests(w, otlp_exports)
        (folder / "otlp.json").write_text(json.dumps([[s, t] for _, s, t in exports]))
        for k, (body, *_rest) in enumerate(exports):
            (folder / f"otlp-{k}.bin").write_bytes(body)
        baseline_tokens, baseline_requests = inprocess_rates(batches, duration_s)

        env = {
            **os.environ,
            "GOODPUT_DATABASE_URL": f"sqlite:///{folder / 'goodput.db'}",
            "GOODPUT_LOG_LEVEL": "WARNING",
        }
        goodput(env, "db", "upgrade")
        key = goodput(env, "admin", "create-key", "--role", "ingest", "--name", "bench")
        (folder / "slos.yaml").write_text(SLO_YAML)
        goodput(env, "slo", "apply", "-f", str(folder / "slos.yaml"))
        common = {"key": key, "folder": str(folder), "duration_s": duration_s,
                  "connections": connections}  # fmt: skip
        # Durable (the default: each batch fsync'd in the write-ahead log before its 200),
        # then the same server without the log, on the same database.
        for durable in ("true", "false"):
            port = free_port()
            server = start_server({**env, "GOODPUT_DURABLE_INGEST": durable}, port)
            try:
                url = {"url": f"http://127.0.0.1:{port}"}
                if durable == "true":
                    cpu_before = cpu_seconds(server.pid)
                    wire = run_client({**common, **url, "kind": "wire"}, folder)
                    server_cpu_s = cpu_seconds(server.pid) - cpu_before
                    otlp = run_client({**common, **url, "kind": "otlp"}, folder)
                else:
                    nondurable = run_client({**common, **url, "kind": "wire"}, folder)
            finally:
                server.terminate()
                server.wait(30)
    tokens_per_s = wire["tokens"] / wire["elapsed_s"]
    nondurable_tokens_per_s = nondurable["tokens"] / nondurable["elapsed_s"]
    otlp_tokens_per_s = otlp["tokens"] / otlp["elapsed_s"]
    print(
        json.dumps(
            {
                "wire": wire,
                "wire_nondurable": nondurable,
                "otlp": otlp,
                "batch_records": BATCH_RECORDS,
                "mean_output_tokens": float(w["outputs"].mean()),
                "connections": connections,
            }
        )
    )
    print(
        json.dumps(
            {
                "tokens_per_s": round(tokens_per_s),
                "requests_per_s": round(wire["records"] / wire["elapsed_s"]),
                "otlp_ratio": round(tokens_per_s / max(otlp_tokens_per_s, 1e-9), 1),
                "otlp_tokens_per_s": round(otlp_tokens_per_s),
                "durable_ratio": round(tokens_per_s / max(nondurable_tokens_per_s, 1e-9), 2),
                "nondurable_tokens_per_s": round(nondurable_tokens_per_s),
                "nondurable_requests_per_s": round(nondurable["records"] / nondurable["elapsed_s"]),
                "inprocess_tokens_per_s": round(baseline_tokens),
                "inprocess_requests_per_s": round(baseline_requests),
                "server_cpu_ms_per_batch": round(1e3 * server_cpu_s / max(wire["requests"], 1), 2),
                "server_cores": round(server_cpu_s / wire["elapsed_s"], 2),
                "quick": args.quick,
            }
        )
    )


if __name__ == "__main__":
    main()
