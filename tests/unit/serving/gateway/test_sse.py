"""SSE splitting and token accounting of relayed streams."""

from __future__ import annotations

import json
from typing import Any

from serving.gateway.sse import DONE_EVENT, EventSplitter, StreamAccounting, error_event


def data(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def test_splitter_returns_whole_events_only() -> None:
    splitter = EventSplitter()
    assert splitter.feed(b'data: {"a"') == []
    assert splitter.pending == b'data: {"a"'
    assert splitter.feed(b":1}\n\ndata: [DO") == [b'data: {"a":1}\n\n']
    assert splitter.feed(b"NE]\n\n") == [DONE_EVENT]
    assert splitter.pending == b""


def test_splitter_handles_crlf_and_several_events_per_read() -> None:
    splitter = EventSplitter()
    events = splitter.feed(b"data: 1\r\n\r\ndata: 2\n\ndata: 3\r\n\r\n")
    assert events == [b"data: 1\r\n\r\n", b"data: 2\n\n", b"data: 3\r\n\r\n"]


def chunk(i: int, text: str = "t", usage: bool = True, finish: str | None = None) -> bytes:
    body: dict[str, Any] = {
        "id": "c",
        "choices": [{"index": 0, "text": text, "finish_reason": finish}],
    }
    if usage:
        body["usage"] = {"prompt_tokens": 10, "completion_tokens": i, "total_tokens": 10 + i}
    return data(body)


def test_continuous_usage_gives_exact_counts_and_is_removed_for_the_client() -> None:
    acct = StreamAccounting()
    out, k = acct.process(chunk(1))
    assert k == 1
    assert out == data({"id": "c", "choices": [{"index": 0, "text": "t", "finish_reason": None}]})
    # A chunk of three tokens (speculative decoding) and one whose text was held back.
    assert acct.process(chunk(4))[1] == 3
    assert acct.process(chunk(5, text=""))[1] == 1
    final = data({"id": "c", "choices": [], "usage": {
        "prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 8}}})  # fmt: skip
    assert acct.process(final) == (None, 0)  # the client did not ask for usage
    assert acct.process(DONE_EVENT) == (DONE_EVENT, 0)
    assert (acct.completion_tokens, acct.prompt_tokens, acct.cached_tokens) == (5, 10, 8)
    assert acct.done and acct.error is None


def test_usage_the_client_asked_for_is_relayed_untouched() -> None:
    acct = StreamAccounting(client_usage=True, client_continuous=True)
    event = chunk(1)
    assert acct.process(event) == (event, 1)
    final = data({"id": "c", "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 1}})
    assert acct.process(final) == (final, 0)
    only_final = StreamAccounting(client_usage=True)
    assert only_final.process(final) == (final, 0)  # a usage chunk is no emission
    assert only_final.completion_tokens == 1


def test_chat_role_chunk_carries_no_token() -> None:
    acct = StreamAccounting()
    role = data({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
                 "usage": {"prompt_tokens": 3, "completion_tokens": 0}})  # fmt: skip
    assert acct.process(role)[1] == 0
    token = data({"choices": [{"index": 0, "delta": {"content": "hi"}}],
                  "usage": {"prompt_tokens": 3, "completion_tokens": 1}})  # fmt: skip
    assert acct.process(token)[1] == 1


def test_without_usage_a_choice_counts_its_token_ids_or_one_token() -> None:
    acct = StreamAccounting()
    assert acct.process(chunk(0, usage=False)) == (chunk(0, usage=False), 1)
    with_ids = data({"choices": [{"index": 0, "text": "ab", "token_ids": [5, 6]}]})
    assert acct.process(with_ids)[1] == 2
    empty = data({"choices": [{"index": 0, "text": "", "finish_reason": None}]})
    assert acct.process(empty)[1] == 0
    last = data({"choices": [{"index": 0, "text": "", "finish_reason": "stop"}]})
    assert acct.process(last)[1] == 1
    assert acct.completion_tokens == 4
    assert acct.finish_reason == "stop"


def test_error_events_are_relayed_and_remembered() -> None:
    acct = StreamAccounting()
    event = data({"error": {"message": "engine dead", "code": 500}})
    assert acct.process(event) == (event, 0)
    assert acct.error == "engine dead"


def test_other_events_pass_through() -> None:
    acct = StreamAccounting()
    for event in (b": keep-alive\n\n", b"data: not json\n\n", b"data: [1, 2]\n\n"):
        assert acct.process(event) == (event, 0)


def test_error_event_is_openai_shaped() -> None:
    event = error_event("decode broke", code=502)
    assert event == data({"error": {"message": "decode broke", "type": "upstream_error",
                                    "code": 502}})  # fmt: skip
