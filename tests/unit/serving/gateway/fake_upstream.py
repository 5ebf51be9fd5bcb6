"""A vLLM-like upstream on an in-memory httpx transport, for the gateway's unit tests.

Each instance (by base URL) answers ``/v1/completions`` and ``/v1/chat/completions``: a
non-streaming call returns one JSON body with usage; a streaming call yields one SSE chunk
per token with continuous usage when asked (as vLLM does), then the usage chunk and
``[DONE]``. Faults are set per instance: ``down`` (connection refused), ``status`` (an
HTTP error), ``break_after`` (the stream breaks after N tokens), ``error_after`` (an SSE
error event after N tokens), ``hang`` (never answers).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Instance:
    down: bool = False
    status: int = 200
    break_after: int | None = None
    error_after: int | None = None
    hang: bool = False
    delay_s: float = 0.0
    calls: list[dict[str, Any]] = field(default_factory=list)
    closed_streams: int = 0


class FakeUpstreams:
    def __init__(self, *urls: str) -> None:
        self.instances = {url: Instance() for url in urls}
        self.transport = httpx.MockTransport(self.handle)

    def __getitem__(self, url: str) -> Instance:
        return self.instances[url]

    async def handle(self, request: httpx.Request) -> httpx.Response:
        base = f"{request.url.scheme}://{request.url.host}:{request.url.port}"
        inst = self.instances[base]
        if inst.down:
            raise httpx.ConnectError("connection refused", request=request)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "tiny"}]})
        body = json.loads(request.content)
        inst.calls.append(
            {
                "path": request.url.path,
                "body": body,
                "request_id": request.headers.get("x-request-id"),
            }
        )
        if inst.hang:
            await asyncio.sleep(3600)
        if inst.status != 200:
            return httpx.Response(inst.status, json={"error": {"message": "boom"}})
        n = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        prompt_tokens = 200
        chat = request.url.path.endswith("/chat/completions")
        if not body.get("stream"):
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": n,
                "total_tokens": prompt_tokens + n,
            }
            return httpx.Response(
                200,
                json={
                    "id": "cmpl-1",
                    "choices": [{"index": 0, "text": "x" * n, "finish_reason": "length"}],
                    "usage": usage,
                },
            )
        options = body.get("stream_options") or {}
        return httpx.Response(
            200,
            headers={"content-type": "text/event-stream"},
            content=self._stream(inst, n, prompt_tokens, chat, options),
        )

    async def _stream(
        self, inst: Instance, n: int, prompt_tokens: int, chat: bool, options: dict[str, Any]
    ) -> AsyncIterator[bytes]:
        continuous = options.get("continuous_usage_stats")
        try:
            if chat:
                role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
                if continuous:
                    role["usage"] = {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": 0,
                        "total_tokens": prompt_tokens,
                    }
                yield b"data: " + json.dumps(role).encode() + b"\n\n"
            for i in range(n):
                if inst.delay_s:
                    await asyncio.sleep(inst.delay_s)
                if inst.break_after is not None and i == inst.break_after:
                    raise httpx.ReadError("connection reset")
                if inst.error_after is not None and i == inst.error_after:
                    err = {
                        "error": {
                            "message": "engine dead",
                            "type": "InternalServerError",
                            "code": 500,
                        }
                    }
                    yield b"data: " + json.dumps(err).encode() + b"\n\n"
                    yield b"data: [DONE]\n\n"
                    return
                finish = "length" if i == n - 1 else None
                choice: dict[str, Any] = (
                    {"index": 0, "delta": {"content": "t"}, "finish_reason": finish}
                    if chat
                    else {"index": 0, "text": "t", "finish_reason": finish}
                )
                chunk: dict[str, Any] = {"id": "cmpl-1", "choices": [choice]}
                if continuous:
                    chunk["usage"] = {
                        "prompt_tokens": prompt_tokens,
                        "completion_tokens": i + 1,
                        "total_tokens": prompt_tokens + i + 1,
                    }
                # Split each event in two writes: the gateway must reassemble it.
                data = b"data: " + json.dumps(chunk).encode() + b"\n\n"
                yield data[:10]
                yield data[10:]
            if options.get("include_usage"):
                usage = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": n,
                    "total_tokens": prompt_tokens + n,
                    "prompt_tokens_details": {"cached_tokens": 128},
                }
                yield (
                    b"data: "
                    + json.dumps({"id": "cmpl-1", "choices": [], "usage": usage}).encode()
                    + b"\n\n"
                )
            yield b"data: [DONE]\n\n"
        finally:
            inst.closed_streams += 1
