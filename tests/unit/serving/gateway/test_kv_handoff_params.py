"""The gateway's two KV hand-off modes against sim workers on loopback (real HTTP, no vLLM).

``kv_handoff=params`` (NixlConnector's protocol): the prefill leg asks for
``do_remote_decode``, the decode leg carries the ``kv_transfer_params`` the prefill worker
answered with, and the decode worker counts the prompt as an external KV transfer. A
prefill answer without them is a 502 naming the instance, never a decode that recomputes.
``kv_handoff=folder`` (ExampleConnector's, the default) is unchanged: no parameters, the
decode worker finds the prompt's KV in the shared folder.
"""

from __future__ import annotations

import json
import math
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from exporters.fleet import PoolRole
from exporters.records import RequestRecord, Status
from exporters.sinks import InMemorySink
from serving.gateway import GatewayConfig, GatewayConfigError, create_app
from serving.gateway._request import REMOTE_DECODE_PARAMS
from serving.gateway.config import KVHandoff
from serving.sim.worker.cli import SimWorkerSpec, build_worker
from serving.sim.worker.prompts import word_prompt
from serving.sim.worker.server import create_app as create_sim_app
from serving.workers.load import metric_sum

pytestmark = pytest.mark.integration

MODEL = "llama-3.1-8b"
BLOCK_TOKENS = 16  # the sim worker's KV block


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Servers:
    """uvicorn servers on loopback, each in its own thread, stopped at the end."""

    def __init__(self) -> None:
        self._running: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(self, app: Any, port: int | None = None) -> str:
        port = port or free_port()
        server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline, "a server did not start"
            time.sleep(0.02)
        self._running.append((server, thread))
        return f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        for server, thread in reversed(self._running):
            server.should_exit = True
            thread.join(10)


class RecordingTransport(httpx.AsyncHTTPTransport):
    """The gateway's real network transport, keeping each upstream call's body and, for
    non-streaming calls, the JSON it was answered with."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict[str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(await request.aread() or b"null")
        call: dict[str, Any] = {"url": str(request.url), "body": body, "answer": None}
        self.calls.append(call)
        response = await super().handle_async_request(request)
        if isinstance(body, dict) and not body.get("stream"):
            content = await response.aread()
            call["answer"] = json.loads(content) if response.status_code == 200 else None
            response = httpx.Response(
                response.status_code, headers=response.headers, content=content
            )
        return response

    def legs(self, base: str) -> list[dict[str, Any]]:
        return [c for c in self.calls if c["url"].startswith(base)]


@dataclass
class Gateway:
    url: str
    client: httpx.Client
    sink: InMemorySink
    transport: RecordingTransport

    def record(self, request_id: str) -> RequestRecord:
        deadline = time.monotonic() + 5
        while True:  # the record is finished just after the reply is sent
            found = [r for r in self.sink.records if r.request_id == request_id]
            if found or time.monotonic() > deadline:
                assert found, f"no record for {request_id}"
                return found[0]
            time.sleep(0.01)


@dataclass
class Stack:
    prefill: str
    decode: str
    servers: Servers
    gateways: dict[KVHandoff, Gateway] = field(default_factory=dict)

    def gateway(self, mode: KVHandoff, prefill: str | None = None) -> Gateway:
        """A gateway in ``mode`` in front of the sim workers (or another prefill URL)."""
        transport = RecordingTransport()
        sink = InMemorySink()
        config = GatewayConfig(
            prefill=(prefill or self.prefill,), decode=(self.decode,), kv_handoff=mode
        )
        app = create_app(
            config, sink=sink, registry=CollectorRegistry(), transport=transport, link=False
        )
        url = self.servers.start(app)
        return Gateway(url, httpx.Client(base_url=url, timeout=30), sink, transport)

    def decode_metric(self, name: str, **labels: str) -> float:
        return metric_sum(httpx.get(f"{self.decode}/metrics").text, name, **labels)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    servers = Servers()
    kv_dir = tmp_path_factory.mktemp("kv")  # the folder hand-off's shared folder
    urls = []
    for role in (PoolRole.PREFILL, PoolRole.DECODE):
        spec = SimWorkerSpec(port=free_port(), role=role, sim_config="jitter=0", kv_dir=kv_dir)
        urls.append(servers.start(create_sim_app(*build_worker(spec)), spec.port))
    stack = Stack(urls[0], urls[1], servers)
    try:
        stack.gateways = {mode: stack.gateway(mode) for mode in KVHandoff}
        yield stack
    finally:
        for gw in stack.gateways.values():
            gw.client.close()
        servers.stop()


def request_body(path: str, prompt: str, *, stream: bool, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True,
                            "stream": stream}  # fmt: skip
    if path.endswith("/chat/completions"):
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def send(gw: Gateway, path: str, body: dict[str, Any], request_id: str) -> dict[str, Any]:
    """The usage the client was answered with (a stream's last chunk)."""
    response = gw.client.post(path, json=body, headers={"x-request-id": request_id})
    assert response.status_code == 200, response.text
    if not body["stream"]:
        answer: dict[str, Any] = response.json()["usage"]
        return answer
    events = [e[6:] for e in response.text.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    usage: dict[str, Any] = json.loads(events[-2])["usage"]
    return usage


ENDPOINTS = [("/v1/completions", False), ("/v1/completions", True),
             ("/v1/chat/completions", False), ("/v1/chat/completions", True)]  # fmt: skip


@pytest.mark.parametrize(("path", "stream"), ENDPOINTS)
def test_params_mode_hands_the_prefills_kv_transfer_params_to_the_decode_leg(
    stack: Stack, path: str, stream: bool
) -> None:
    gw = stack.gateways[KVHandoff.PARAMS]
    key = 10_000 + ENDPOINTS.index((path, stream))  # a prompt of its own
    request_id = f"params-{key}"
    body = request_body(path, word_prompt(700, key), stream=stream, max_tokens=6)
    body["kv_transfer_params"] = {"do_remote_prefill": True}  # a client's own is replaced
    external = stack.decode_metric(
        "vllm:prompt_tokens_by_source_total", source="external_kv_transfer"
    )
    local = stack.decode_metric("vllm:prompt_tokens_by_source_total", source="local_compute")

    usage = send(gw, path, body, request_id)

    (prefill,) = gw.transport.legs(stack.prefill)[-1:]
    assert prefill["body"]["kv_transfer_params"] == REMOTE_DECODE_PARAMS
    assert prefill["body"]["max_tokens"] == 1 and prefill["body"]["stream"] is False
    params = prefill["answer"]["kv_transfer_params"]
    prompt_tokens = prefill["answer"]["usage"]["prompt_tokens"]
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_port"] == int(stack.prefill.rsplit(":", 1)[1])
    assert params["remote_block_ids"] == list(range(math.ceil(prompt_tokens / BLOCK_TOKENS)))
    (decode,) = gw.transport.legs(stack.decode)[-1:]
    assert decode["body"]["kv_transfer_params"] == params  # the prefill's answer, as is
    assert decode["body"]["max_tokens"] == 6 and decode["body"]["stream"] is stream
    # The decode worker loaded the prompt's KV from the prefill worker instead of computing it.
    assert usage["completion_tokens"] == 6
    assert usage["prompt_tokens_details"]["cached_tokens"] == prompt_tokens
    assert (
        stack.decode_metric("vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
        == external + prompt_tokens
    )
    assert (
        stack.decode_metric("vllm:prompt_tokens_by_source_total", source="local_compute") == local
    )
    assert gw.record(request_id).status is Status.OK


@pytest.mark.parametrize("stream", [False, True])
def test_folder_mode_sends_no_params_and_the_decode_finds_the_kv_in_the_folder(
    stack: Stack, stream: bool
) -> None:
    gw = stack.gateways[KVHandoff.FOLDER]
    request_id = f"folder-{int(stream)}"
    body = request_body("/v1/completions", word_prompt(500, 20_000 + stream), stream=stream,
                        max_tokens=4)  # fmt: skip

    usage = send(gw, "/v1/completions", body, request_id)

    (prefill,) = gw.transport.legs(stack.prefill)[-1:]
    assert "kv_transfer_params" not in prefill["body"]
    assert prefill["answer"]["kv_transfer_params"] is None
    (decode,) = gw.transport.legs(stack.decode)[-1:]
    assert "kv_transfer_params" not in decode["body"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == 500  # found in the folder
    assert gw.record(request_id).status is Status.OK


async def _no_params_completion(request: Request) -> JSONResponse:
    """A prefill instance without NixlConnector: vLLM answers ``kv_transfer_params: null``."""
    body = await request.json()
    usage = {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}
    return JSONResponse({"id": "cmpl-x", "object": "text_completion", "model": body["model"],
                         "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
                         "usage": usage, "kv_transfer_params": None})  # fmt: skip


@pytest.mark.parametrize(("path", "stream"), ENDPOINTS)
def test_params_mode_refuses_a_prefill_answer_without_params(
    stack: Stack, path: str, stream: bool
) -> None:
    routes = [Route(p, _no_params_completion, methods=["POST"])
              for p in ("/v1/completions", "/v1/chat/completions")]  # fmt: skip
    plain = stack.servers.start(Starlette(routes=routes))
    gw = stack.gateway(KVHandoff.PARAMS, prefill=plain)
    try:
        key = 30_000 + ENDPOINTS.index((path, stream))
        request_id = f"no-params-{key}"
        body = request_body(path, word_prompt(300, key), stream=stream, max_tokens=4)
        response = gw.client.post(path, json=body, headers={"x-request-id": request_id})
        assert response.status_code == 502
        error = response.json()["error"]
        assert error["type"] == "upstream_error"
        assert error["message"].startswith(
            f"prefill on {plain} answered without kv_transfer_params"
        )
        assert gw.transport.legs(stack.decode) == []  # never a decode that recomputes
        record = gw.record(request_id)
        assert record.status is Status.ERROR and "kv_transfer_params" in record.reason
    finally:
        gw.client.close()


def test_health_reports_the_mode_and_the_config_checks_it(stack: Stack) -> None:
    for mode, gw in stack.gateways.items():
        assert gw.client.get("/health").json()["kv_handoff"] == mode.value
    pools: dict[str, Any] = {"prefill": ("http://p:1",), "decode": ("http://d:1",)}
    assert GatewayConfig(**pools).kv_handoff is KVHandoff.FOLDER  # the default
    as_text: Any = "params"  # as a YAML file or a program would give it
    assert GatewayConfig(**pools, kv_handoff=as_text).kv_handoff is KVHandoff.PARAMS
    unknown: Any = "nixl"
    with pytest.raises(GatewayConfigError, match="kv_handoff must be one of 'folder', 'params'"):
        GatewayConfig(**pools, kv_handoff=unknown)
