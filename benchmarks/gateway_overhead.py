"""What the gateway adds to TTFT and ITL, against the same vLLM instance reached directly.

Starts one vLLM server (the tiny model, no KV connector) and one gateway process in
colocated mode in front of it (``goodput gateway --colocated URL``), warms both paths, then
sends the same kind of request alternately direct and through the gateway, one at a time
(interleaved, the order flipped every pair, so drift and noise hit both paths alike).
Each request has a prompt of its own (no prefix-cache hit favours either path) of
``--prompt-words`` words and asks for ``--output-tokens`` tokens with ``ignore_eos``.
TTFT and ITL gaps come from client-side records (the bench's ``stream_request``, the
exporters' metric core). The added latency is the gateway path's percentile minus the
direct path's, per metric.

vLLM runs at niceness ``--engine-nice`` (default 10, as in the e2e tests and the demo): on
a 2-core machine a busy engine otherwise delays the gateway and this client, and the
difference measured is then the scheduler's, not the gateway's (docs/serving.md). With
``--placement split`` (the default on two cores or more) vLLM also runs on the last core
alone and the gateway and this client on the first, as a deployment gives its gateways
hosts of their own (the cross-check's placement, docs/gateway.md); ``shared`` lets all
three float.

``--upstream stub`` replaces vLLM with a stub OpenAI server (this file run with
``--serve-stub PORT``: a 30 ms "prefill", then one token every 3 ms), which isolates what the
gateway adds from the engine's own noise on a busy machine.

Last line: ``{"ttft_added_ms_p50", "ttft_added_ms_p99", "itl_added_ms_p50",
"itl_added_ms_p99", ...}`` (plus both paths' own percentiles and the sample sizes).
Goal (issue 4): ≤ 2 ms TTFT and ≤ 0.3 ms ITL at p50.

    python benchmarks/gateway_overhead.py [--quick] [--upstream vllm|stub] [--engine-nice N]
                                          [--placement split|shared]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from exporters.latency import itl_gaps_s, request_latencies  # noqa: E402
from exporters.recorder import RequestRecorder  # noqa: E402
from exporters.records import Labels, RecordBatch, RequestRecord, Status, Vantage  # noqa: E402
from exporters.sinks import InMemorySink  # noqa: E402
from serving.bench.runner import stream_request  # noqa: E402
from serving.workers.priority import pin_group  # noqa: E402

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_http(url: str, timeout_s: float, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: process exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not ready within {timeout_s:g} s")


async def measure(
    direct: str, gateway: str, model: str, pairs: int, prompt_words: int, output_tokens: int
) -> dict[str, list[RequestRecord]]:
    recorder = RequestRecorder(Vantage.GATEWAY, InMemorySink())
    rng = np.random.default_rng(0)
    out: dict[str, list[RequestRecord]] = {"direct": [], "gateway": []}
    timeout = httpx.Timeout(60.0)
    async with (
        httpx.AsyncClient(base_url=direct, timeout=timeout) as to_direct,
        httpx.AsyncClient(base_url=gateway, timeout=timeout) as to_gateway,
    ):
        clients = {"direct": to_direct, "gateway": to_gateway}

        async def one(path: str, i: int, keep: bool) -> None:
            words = rng.choice(WORDS, size=prompt_words).tolist()
            body = {
                "model": model,
                "prompt": f"{path} {i} " + " ".join(words),
                "max_tokens": output_tokens,
                "ignore_eos": True,
                "stream": True,
            }
            record = await stream_request(
                clients[path], recorder, f"{path}-{i}", Labels(model=model), body
            )
            if record.status != Status.OK:
                raise RuntimeError(f"{path} request {i} failed: {record.reason}")
            if keep:
                out[path].append(record)

        for i in range(4):  # warm both paths (connections, compile caches)
            await one("direct", -1 - i, keep=False)
            await one("gateway", -1 - i, keep=False)
        for i in range(pairs):
            order = ("direct", "gateway") if i % 2 == 0 else ("gateway", "direct")
            for path in order:
                await one(path, i, keep=True)
    return out


async def stub_app(
    scope: dict[str, Any],
    receive: Callable[[], Awaitable[dict[str, Any]]],
    send: Callable[[dict[str, Any]], Awaitable[None]],
) -> None:
    """A minimal OpenAI completions server: 30 ms to the first token, then one every 3 ms."""
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            kind = message["type"].replace("lifespan.", "")
            await send({"type": f"lifespan.{kind}.complete"})
            if kind == "shutdown":
                return
    if scope["path"] == "/health":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    request = json.loads(body)
    n = int(request.get("max_tokens") or 16)
    continuous = (request.get("stream_options") or {}).get("continuous_usage_stats")
    headers = [(b"content-type", b"text/event-stream")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await asyncio.sleep(0.03)
    for i in range(n):
        choice = {"index": 0, "text": " tok", "logprobs": None,
                  "finish_reason": "length" if i == n - 1 else None}  # fmt: skip
        chunk: dict[str, Any] = {"id": "cmpl-stub", "model": "tiny", "choices": [choice]}
        if continuous:
            chunk["usage"] = {"prompt_tokens": 10, "completion_tokens": i + 1,
                              "total_tokens": 11 + i}  # fmt: skip
        data = b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"
        await send({"type": "http.response.body", "body": data, "more_body": True})
        await asyncio.sleep(0.003)
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def percentiles(records: list[RequestRecord]) -> dict[str, float]:
    batch = RecordBatch.from_records(records)
    ttft_ms = request_latencies(batch).ttft_s * 1e3
    itl_ms = itl_gaps_s(batch)[0] * 1e3
    return {
        "ttft_ms_p50": float(np.percentile(ttft_ms, 50)),
        "ttft_ms_p99": float(np.percentile(ttft_ms, 99)),
        "itl_ms_p50": float(np.percentile(itl_ms, 50)),
        "itl_ms_p99": float(np.percentile(itl_ms, 99)),
        "num_gaps": int(itl_ms.shape[0]),
    }


def start_upstream(
    kind: str, tmp: Path, nice: int = 0, cpus: set[int] | None = None
) -> tuple[str, Callable[[], None]]:
    """Start the upstream (vLLM with the tiny model, or the stub), on ``cpus`` when given;
    its URL and its stop."""
    port = free_port()
    if kind == "stub":
        stub = subprocess.Popen([sys.executable, __file__, "--serve-stub", str(port)])
        url = f"http://127.0.0.1:{port}"
        wait_http(url + "/health", 30.0, stub)

        def stop_stub() -> None:
            stub.terminate()
            stub.wait(10)

        return url, stop_stub
    from serving.model import build_tiny_model, default_model_dir
    from serving.workers import VllmServer, VllmSpec

    spec = VllmSpec(
        model=build_tiny_model(default_model_dir()),
        port=port,
        cpu=min(cpus) if cpus else 0,
        served_model_name="tiny",
        nice=nice,
    )
    server = VllmServer(spec, run_dir=tmp / "vllm")
    server.start()
    try:
        server.wait_ready(timeout_s=300)
        if cpus and server.pid is not None:
            pin_group(server.pid, cpus)
    except BaseException:
        server.stop()
        raise
    return spec.url, server.stop


def split_cores(placement: str) -> tuple[set[int] | None, set[int] | None]:
    """(front, back): the first core for the gateway and this client, the last for the
    engine; (None, None) to let everything float."""
    cpus = sorted(os.sched_getaffinity(0))
    if placement == "shared" or len(cpus) < 2:
        return None, None
    return {cpus[0]}, {cpus[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests (CI)")
    parser.add_argument("--pairs", type=int, default=None)
    parser.add_argument("--prompt-words", type=int, default=150)
    parser.add_argument("--output-tokens", type=int, default=None)
    parser.add_argument("--upstream", choices=("vllm", "stub"), default="vllm")
    parser.add_argument("--engine-nice", type=int, default=10, choices=range(20), metavar="0..19")
    parser.add_argument("--placement", choices=("split", "shared"), default="split")
    parser.add_argument("--serve-stub", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_stub:
        import uvicorn

        uvicorn.run(stub_app, host="127.0.0.1", port=args.serve_stub, log_level="warning")
        return
    pairs = args.pairs or (20 if args.quick else 100)
    output_tokens = args.output_tokens or (32 if args.quick else 64)

    front, back = split_cores(args.placement)
    with tempfile.TemporaryDirectory(prefix="goodput-gw-bench-") as tmp:
        upstream_url, stop_upstream = start_upstream(
            args.upstream, Path(tmp), args.engine_nice, back
        )
        gateway_port = free_port()
        gateway: subprocess.Popen[bytes] | None = None
        try:
            gateway = subprocess.Popen(
                [sys.executable, "-m", "goodput", "gateway", "--port", str(gateway_port),
                 "--colocated", upstream_url, "--log-level", "WARNING"],
                cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True,
            )  # fmt: skip
            gateway_url = f"http://127.0.0.1:{gateway_port}"
            wait_http(gateway_url + "/health", 60.0, gateway)
            if front:
                pin_group(gateway.pid, front)
                for task in Path("/proc/self/task").iterdir():  # this client's threads
                    os.sched_setaffinity(int(task.name), front)
            records = asyncio.run(
                measure(upstream_url, gateway_url, "tiny", pairs, args.prompt_words, output_tokens)
            )
        finally:
            if gateway is not None:
                gateway.terminate()
                gateway.wait(10)
            stop_upstream()
    direct, through = percentiles(records["direct"]), percentiles(records["gateway"])
    result = {
        "ttft_added_ms_p50": through["ttft_ms_p50"] - direct["ttft_ms_p50"],
        "ttft_added_ms_p99": through["ttft_ms_p99"] - direct["ttft_ms_p99"],
        "itl_added_ms_p50": through["itl_ms_p50"] - direct["itl_ms_p50"],
        "itl_added_ms_p99": through["itl_ms_p99"] - direct["itl_ms_p99"],
        "direct": direct,
        "gateway": through,
        "pairs": pairs,
        "output_tokens": output_tokens,
        "upstream": args.upstream,
        "engine_nice": args.engine_nice if args.upstream == "vllm" else None,
        "placement": "split" if front else "shared",
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
