"""A parsed client request and the small pure helpers of the relay (bodies, errors)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from exporters.records import Labels

__all__ = [
    "REMOTE_DECODE_PARAMS",
    "ParsedRequest",
    "describe",
    "max_tokens_of",
    "prefill_body",
    "prefill_kv_params",
    "response_json",
]

# What a prefill leg asks a NixlConnector instance for, as vLLM's disaggregated proxies
# send it: compute the prompt, keep its blocks for a remote decode, answer with where they are.
REMOTE_DECODE_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A client request the gateway accepted for relaying."""

    request_id: str
    path: str  # "/v1/completions" or "/v1/chat/completions"
    body: dict[str, Any]
    labels: Labels
    prompt_tokens: int  # an estimate for text
    affinity_key: str | None
    arrival_ns: int  # perf_counter_ns when the request reached the gateway

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


def prefill_body(body: dict[str, Any], *, remote_decode: bool = False) -> dict[str, Any]:
    """The request the prefill instance gets: one token, not streamed, no minimum; with
    ``remote_decode`` (the ``params`` hand-off) it also carries
    :data:`REMOTE_DECODE_PARAMS` in place of any ``kv_transfer_params`` the client sent."""
    out = {k: v for k, v in body.items() if k not in ("stream_options", "min_tokens")}
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    if remote_decode:
        out["kv_transfer_params"] = dict(REMOTE_DECODE_PARAMS)
    return out


def prefill_kv_params(payload: dict[str, Any]) -> dict[str, Any] | None:
    """The ``kv_transfer_params`` object of a prefill response, or ``None`` when it has
    none (absent, ``null`` or not an object: an instance without NixlConnector)."""
    params = payload.get("kv_transfer_params")
    return params if isinstance(params, dict) and params else None


def max_tokens_of(body: dict[str, Any]) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    return value if isinstance(value, int) else None


def response_json(response: httpx.Response) -> dict[str, Any]:
    try:
        payload = response.json()
    except ValueError:
        return {}
    return payload if isinstance(payload, dict) else {}


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
