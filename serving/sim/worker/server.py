"""The sim worker's OpenAI-compatible HTTP server (what vLLM's ``api_server`` serves).

Routes: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (streaming or not, in
vLLM's response and chunk formats, ``stream_options.include_usage`` and
``continuous_usage_stats`` honoured), ``GET /v1/models``, ``GET /health``, ``GET /metrics``
(:mod:`serving.sim.worker.metrics`) and ``GET /sim`` (profile, batching, role, state,
load). A request becomes a job on the :class:`~serving.sim.worker.engine.SimEngine`; its
tokens are written the moment the engine commits the iteration that made them, several
at once in one write when the loop was late. A streaming client that disconnects aborts
its request (it leaves the batch at the next iteration); a non-streaming one runs to the
end, as its answer is one body.

Bad input is a 400 naming the field and what it accepts (a 404 for an unknown model), in
vLLM's error shape ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from serving.sim.worker.control import SimWorkerControl
from serving.sim.worker.engine import SimEngine, SimRequest, TooLongError
from serving.sim.worker.handoff import HandoffError, KVHandoff, LegPlan
from serving.sim.worker.metrics import EngineCollector
from serving.sim.worker.prompts import (
    PromptError,
    PromptInfo,
    answer_length,
    filler_text,
    parse_chat_prompt,
    parse_completion_prompt,
)

__all__ = ["ServerSettings", "create_app"]

_DONE = b"data: [DONE]\n\n"


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """What the server says about itself: the served model name, the longest context
    (prompt + ``max_tokens``) it accepts, and the profile it models."""

    served_model_name: str
    max_model_len: int
    profile: str


class RequestError(ValueError):
    def __init__(self, message: str, param: str, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


def error_response(message: str, param: str | None, status: int) -> JSONResponse:
    kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status)


@dataclass(frozen=True, slots=True)
class ParsedBody:
    prompt: PromptInfo
    max_tokens: int
    output_tokens: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    kv_params: Any


def _int(body: dict[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise RequestError(f"{name}: expected an integer >= {minimum}, got {value!r}", name)
    return value


def _bool(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f"{name}: expected true or false, got {value!r}", name)
    return value


def parse_body(
    body: dict[str, Any], *, chat: bool, settings: ServerSettings, block_tokens: int
) -> ParsedBody:
    """Validate an OpenAI request body for the sim engine (raises :class:`RequestError`)."""
    model = body.get("model")
    if model is not None and model != settings.served_model_name:
        raise RequestError(
            f"model: {model!r} is not served here; allowed: [{settings.served_model_name!r}]",
            "model",
            404,
        )
    try:
        if chat:
            prompt = parse_chat_prompt(body, block_tokens=block_tokens)
        else:
            prompt = parse_completion_prompt(body, block_tokens=block_tokens)
    except PromptError as exc:
        raise RequestError(str(exc), str(exc).split(":", 1)[0]) from None
    n = body.get("n", 1)
    if n != 1:
        raise RequestError(f"n: only 1 completion per request is supported, got {n!r}", "n")
    max_tokens = _int(body, "max_completion_tokens", 1) if chat else None
    name = "max_completion_tokens" if max_tokens is not None else "max_tokens"
    max_tokens = max_tokens if max_tokens is not None else _int(body, "max_tokens", 1)
    room = settings.max_model_len - prompt.tokens
    if max_tokens is None:
        if room < 1:
            raise RequestError(
                f"prompt: {prompt.tokens} tokens leave no room for output in the maximum "
                f"context length of {settings.max_model_len} tokens",
                "prompt",
            )
        max_tokens = room
    elif max_tokens > room:
        raise RequestError(
            f"{name}: this model's maximum context length is {settings.max_model_len} tokens; "
            f"the request asks for {prompt.tokens + max_tokens} ({prompt.tokens} in the "
            f"prompt, {max_tokens} in the completion)",
            name,
        )
    min_tokens = _int(body, "min_tokens", 0) or 0
    if min_tokens > max_tokens:
        raise RequestError(
            f"min_tokens: must be <= {name} ({max_tokens}), got {min_tokens}", "min_tokens"
        )
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError("stream_options: expected an object or null", "stream_options")
    if options and not stream:
        raise RequestError("stream_options: only allowed when stream is true", "stream_options")
    options = options or {}
    return ParsedBody(
        prompt=prompt,
        max_tokens=max_tokens,
        output_tokens=answer_length(
            prompt,
            max_tokens=max_tokens,
            min_tokens=min_tokens,
            ignore_eos=_bool(body, "ignore_eos"),
        ),
        stream=stream,
        include_usage=_bool(options, "include_usage"),
        continuous_usage=_bool(options, "continuous_usage_stats"),
        kv_params=body.get("kv_transfer_params"),
    )


def _usage(request: SimRequest, completion_tokens: int) -> dict[str, Any]:
    prompt = request.prompt.tokens
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": {"cached_tokens": request.cached_tokens},
    }


class _Formatter:
    """vLLM's completion / chat response objects and stream chunks for one request."""

    def __init__(self, request: SimRequest, *, chat: bool, model: str) -> None:
        self.request = request
        self.chat = chat
        self.model = model
        prefix = "chatcmpl-" if chat else "cmpl-"
        self.id = prefix + request.request_id
        self.created = int(time.time())
        self.object = "chat.completion.chunk" if chat else "text_completion"

    def _chunk(self, choices: list[dict[str, Any]], usage: dict[str, Any] | None) -> bytes:
        chunk: dict[str, Any] = {
            "id": self.id, "object": self.object, "created": self.created,
            "model": self.model, "choices": choices,
        }  # fmt: skip
        if usage is not None:
            chunk["usage"] = usage
        return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"

    def role_chunk(self, usage: bool) -> bytes:
        choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                  "finish_reason": None}  # fmt: skip
        return self._chunk([choice], _usage(self.request, 0) if usage else None)

    def token_chunk(self, index: int, finish: str | None, usage: bool) -> bytes:
        text = filler_text(self.request.prompt, index, 1) if index >= 0 else ""
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "delta": {"content": text} if text else {},
                                      "logprobs": None, "finish_reason": finish}  # fmt: skip
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                      "stop_reason": None}  # fmt: skip
        tokens = index + 1 if index >= 0 else self.request.sent
        return self._chunk([choice], _usage(self.request, tokens) if usage else None)

    def usage_chunk(self) -> bytes:
        return self._chunk([], _usage(self.request, self.request.sent))

    def response(self, kv_params: dict[str, Any] | None) -> dict[str, Any]:
        request = self.request
        text = filler_text(request.prompt, 0, request.seen)
        if self.chat:
            choice: dict[str, Any] = {
                "index": 0, "message": {"role": "assistant", "content": text},
                "logprobs": None, "finish_reason": request.finish_reason, "stop_reason": None,
            }  # fmt: skip
        else:
            choice = {"index": 0, "text": text, "logprobs": None,
                      "finish_reason": request.finish_reason, "stop_reason": None,
                      "prompt_logprobs": None}  # fmt: skip
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": _usage(request, request.seen),
            "kv_transfer_params": kv_params,
        }


async def _wait(request: SimRequest) -> None:
    """Until the engine has finished ``request``."""
    while not request.done:
        request.event.clear()
        await request.event.wait()


def create_app(
    engine: SimEngine,
    settings: ServerSettings,
    handoff: KVHandoff,
    control: SimWorkerControl,
    *,
    on_start: Callable[[], None] | None = None,
    on_stop: Callable[[], None] | None = None,
    extra_info: Callable[[], dict[str, Any]] | None = None,
    registry: CollectorRegistry | None = None,
) -> Starlette:
    """The sim worker's app; ``on_start``/``on_stop`` run in its lifespan (the agent),
    which also marks ``control`` serving after the engine starts and stopped before it closes;
    ``extra_info`` adds entries to ``GET /sim`` (the record exporter's counters);
    ``registry``: what ``/metrics`` serves besides the engine's families (a new one when
    absent)."""
    if registry is None:
        registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine, settings.served_model_name))
    block_tokens = engine.config.prefix_block_tokens

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        engine.start()
        control.mark_serving()
        if on_start is not None:
            on_start()
        try:
            yield
        finally:
            control.mark_stopped()
            if on_stop is not None:
                on_stop()
            engine.close()

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def models(request: Request) -> Response:
        card = {"id": settings.served_model_name, "object": "model", "created": 0,
                "owned_by": "goodput-sim", "root": settings.profile, "parent": None,
                "max_model_len": settings.max_model_len}  # fmt: skip
        return JSONResponse({"object": "list", "data": [card]})

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    async def info(request: Request) -> Response:
        config = engine.config
        return JSONResponse({
            "profile": settings.profile, "served_model_name": settings.served_model_name,
            "strategy": config.strategy.value, "max_num_seqs": config.max_num_seqs,
            "max_num_batched_tokens": config.max_num_batched_tokens,
            "kv_capacity_tokens": engine.max_context_tokens,
            "max_model_len": settings.max_model_len, "link": engine.link.name,
            "kv_dir": None if handoff.folder is None else str(handoff.folder),
            "role": control.role.value, "state": control.state.value,
            "load": engine.load.as_report(),
            **(extra_info() if extra_info is not None else {}),
        })  # fmt: skip

    async def serve(request: Request, chat: bool) -> Response:
        try:
            body = json.loads(await request.body())
        except ValueError:
            return error_response("body: expected a JSON object", None, 400)
        if not isinstance(body, dict):
            return error_response("body: expected a JSON object", None, 400)
        try:
            parsed = parse_body(body, chat=chat, settings=settings, block_tokens=block_tokens)
            plan = handoff.plan(parsed.prompt, parsed.kv_params, parsed.max_tokens)
        except RequestError as exc:
            return error_response(str(exc), exc.param, exc.status)
        except HandoffError as exc:
            return error_response(str(exc), "kv_transfer_params", 400)
        if plan.queried:
            engine.note_transfer_query(parsed.prompt.tokens, plan.remote)
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        try:
            job = engine.submit(
                request_id,
                parsed.prompt,
                max_tokens=parsed.max_tokens,
                output_tokens=parsed.output_tokens,
                remote_kv=plan.remote,
            )
        except TooLongError as exc:
            return error_response(str(exc), "prompt", 400)
        fmt = _Formatter(job, chat=chat, model=settings.served_model_name)
        headers = {"x-request-id": request_id}
        if parsed.stream:
            return StreamingResponse(
                _stream(engine, job, fmt, parsed=parsed, plan=plan, handoff=handoff),
                media_type="text/event-stream",
                headers={**headers, "cache-control": "no-cache"},
            )
        try:
            await _wait(job)
        finally:
            if not job.done:
                engine.abort(job)
        if plan.publish:
            handoff.publish(parsed.prompt)
        params = handoff.response_params(parsed.prompt) if plan.params_requested else None
        return JSONResponse(fmt.response(params), headers=headers)

    async def completions(request: Request) -> Response:
        return await serve(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await serve(request, chat=True)

    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/sim", info, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


async def _stream(
    engine: SimEngine,
    request: SimRequest,
    fmt: _Formatter,
    *,
    parsed: ParsedBody,
    plan: LegPlan,
    handoff: KVHandoff,
) -> AsyncIterator[bytes]:
    """The SSE stream of one request: tokens as the engine makes them, then the finish,
    the usage chunk when asked for, and ``[DONE]``."""
    usage = parsed.continuous_usage
    try:
        if fmt.chat:
            yield fmt.role_chunk(usage)
        finished = False
        while True:
            request.event.clear()
            seen = request.seen
            if seen > request.sent:
                out = []
                for index in range(request.sent, seen):
                    last = request.done and index == seen - 1
                    if last and plan.publish:
                        handoff.publish(parsed.prompt)
                    out.append(fmt.token_chunk(index, request.finish_reason if last else None,
                                               usage))  # fmt: skip
                    finished = last
                request.sent = seen
                yield b"".join(out)
            if request.done:
                break
            await request.event.wait()
        if not finished:  # ended without a new token (aborted while queued)
            yield fmt.token_chunk(-1, request.finish_reason, usage)
        tail = fmt.usage_chunk() if parsed.include_usage else b""
        yield tail + _DONE
    finally:
        if not request.done:
            engine.abort(request)
