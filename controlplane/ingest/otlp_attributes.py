"""The OTLP span shape the receiver maps to request records: names, attributes, values.

vLLM (``--otlp-traces-endpoint``) emits one ``llm_request`` span per finished request with
start time = the request's arrival and these attributes (seconds as doubles, counts as
ints): ``gen_ai.latency.time_to_first_token``, ``gen_ai.latency.e2e``,
``gen_ai.latency.time_in_queue``, ``gen_ai.latency.time_in_model_prefill``,
``gen_ai.latency.time_in_model_decode``, ``gen_ai.usage.prompt_tokens``,
``gen_ai.usage.completion_tokens``, ``gen_ai.request.id`` and, depending on the version,
``gen_ai.request.model`` / ``gen_ai.response.model``. It emits no per-token events, so a
vLLM span gives TTFT, TPOT and E2EL but no ITL.

A span that also carries one event per emission (name :data:`TOKEN_EVENT`, time = when the
emission left) gives full detail, per-emission ITL included. Each event is one token unless
the span's ``gen_ai.usage.completion_tokens`` differs from the number of events; then each
event's int attribute :data:`ATTR_EVENT_TOKENS` says how many it carried (default 1).
The ``goodput.*`` attributes
let a producer that knows more say so; each is optional.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from exporters.records import Status, Vantage

__all__ = [
    "ATTR_COMPLETION_TOKENS",
    "ATTR_DECODE",
    "ATTR_E2E",
    "ATTR_EVENT_TOKENS",
    "ATTR_PREFILL",
    "ATTR_PROMPT_TOKENS",
    "ATTR_QUEUE",
    "ATTR_REQUEST_ID",
    "ATTR_REQUEST_MODEL",
    "ATTR_RESPONSE_MODEL",
    "ATTR_STATUS",
    "ATTR_TTFT",
    "ATTR_VANTAGE",
    "LABEL_ATTRIBUTES",
    "LLM_SPAN_NAME",
    "SERVICE_NAME",
    "STATUS_NAMES",
    "TOKEN_EVENT",
    "VANTAGE_NAMES",
    "client_request_id",
    "number",
    "text",
    "value_of",
]

LLM_SPAN_NAME = "llm_request"
TOKEN_EVENT = "token"
ATTR_EVENT_TOKENS = "goodput.tokens"

ATTR_TTFT = "gen_ai.latency.time_to_first_token"
ATTR_E2E = "gen_ai.latency.e2e"
ATTR_QUEUE = "gen_ai.latency.time_in_queue"
ATTR_PREFILL = "gen_ai.latency.time_in_model_prefill"
ATTR_DECODE = "gen_ai.latency.time_in_model_decode"
ATTR_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
ATTR_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
ATTR_REQUEST_ID = "gen_ai.request.id"
ATTR_REQUEST_MODEL = "gen_ai.request.model"
ATTR_RESPONSE_MODEL = "gen_ai.response.model"
SERVICE_NAME = "service.name"

#: Optional attributes of a producer that knows more than vLLM does.
ATTR_STATUS = "goodput.status"  # ok | error | aborted | rejected
ATTR_VANTAGE = "goodput.vantage"  # gateway | engine (default engine: a vLLM span)
LABEL_ATTRIBUTES: Mapping[str, str] = {
    "tenant": "goodput.tenant",
    "priority": "goodput.priority",
    "slo": "goodput.slo",
    "route": "goodput.route",
}
STATUS_NAMES: Mapping[str, Status] = {
    s.name.lower(): s for s in (Status.OK, Status.ERROR, Status.ABORTED, Status.REJECTED)
}
VANTAGE_NAMES: Mapping[str, Vantage] = {v.name.lower(): v for v in Vantage}
MAX_LABEL_CHARS = 200
#: The endpoint prefixes of vLLM's OpenAI server's request ids.
_VLLM_ID_PREFIXES = ("chatcmpl-", "cmpl-")


def value_of(any_value: Any) -> object:
    """The Python value of an OTLP ``AnyValue`` (``None`` when unset or a composite)."""
    kind = any_value.WhichOneof("value")
    if kind in ("string_value", "bool_value", "int_value", "double_value"):
        value: object = getattr(any_value, kind)
        return value
    return None


def number(attributes: Mapping[str, Any], key: str) -> float | None:
    """A numeric attribute (int or double; a bool is not a number), ``None`` when absent.

    Raises ``ValueError`` naming the attribute for a non-numeric or non-finite value.
    """
    raw = attributes.get(key)
    if raw is None:
        return None
    value = value_of(raw)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{key} must be finite, got {value!r}")
    return float(value)


def text(attributes: Mapping[str, Any], key: str) -> str:
    """A string attribute cut to a label's length, ``""`` when absent or not a string."""
    raw = attributes.get(key)
    if raw is None:
        return ""
    value = value_of(raw)
    return value[:MAX_LABEL_CHARS] if isinstance(value, str) else ""


def client_request_id(engine_request_id: str) -> str:
    """The client's ``X-Request-Id`` behind a vLLM request id (``gen_ai.request.id``).

    vLLM's OpenAI server names a request ``cmpl-<X-Request-Id>-<prompt index>`` on
    ``/v1/completions`` and ``chatcmpl-<X-Request-Id>`` on ``/v1/chat/completions``, and its
    span carries that name. The prefix and the completions prompt index 0 are removed (as
    the stat-logger plugin does for its records), so an engine record joins the gateway's
    record of the same request: ``cmpl-gw-1-0`` → ``gw-1``; other indices stay
    (``cmpl-gw-1-2`` → ``gw-1-2``); ids of other shapes are returned unchanged.
    """
    for prefix in _VLLM_ID_PREFIXES:
        if engine_request_id.startswith(prefix):
            rest = engine_request_id[len(prefix) :]
            if prefix == "cmpl-" and rest.endswith("-0"):
                rest = rest[:-2]
            return rest or engine_request_id
    return engine_request_id
