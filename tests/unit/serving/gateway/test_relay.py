"""The gateway end to end against in-memory vLLM-like upstreams (no sockets)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from exporters.records import Phase, RequestRecord, Status
from exporters.sinks import InMemorySink
from serving.gateway import Decision, GatewayConfig, RequestInfo, create_app
from serving.gateway.relay import RelayResponse
from tests.unit.serving.gateway.fake_upstream import FakeUpstreams

P1, P2, D1, D2 = "http://p1:8000", "http://p2:8000", "http://d1:8000", "http://d2:8000"
PROMPT = "word " * 300


class Harness:
    def __init__(self, config: GatewayConfig, upstreams: FakeUpstreams, **kw: Any) -> None:
        self.sink = InMemorySink()
        self.registry = CollectorRegistry()
        self.upstreams = upstreams
        self.app = create_app(
            config, sink=self.sink, registry=self.registry, transport=upstreams.transport, **kw
        )
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(self.app), base_url="http://gw"
        )

    @property
    def gateway(self) -> Any:
        return self.app.state.gateway

    def record(self) -> RequestRecord:
        (record,) = self.sink.records
        return record

    def metric(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


@pytest.fixture
async def pd() -> AsyncIterator[Harness]:
    harness = Harness(
        GatewayConfig(prefill=(P1, P2), decode=(D1, D2)), FakeUpstreams(P1, P2, D1, D2)
    )
    async with harness.app.router.lifespan_context(harness.app), harness.client:
        yield harness


def sse_events(text: str) -> list[Any]:
    return [json.loads(line[6:]) if line != "data: [DONE]" else "[DONE]"
            for line in text.split("\n\n") if line]  # fmt: skip


async def test_pd_stream_prefills_then_decodes_and_records_every_chunk(pd: Harness) -> None:
    response = await pd.client.post(
        "/v1/completions",
        json={"model": "tiny", "prompt": PROMPT, "max_tokens": 5, "stream": True,
              "min_tokens": 5},
        headers={"x-request-id": "req-1", "x-goodput-slo": "chat", "x-goodput-priority": "hi"},
    )  # fmt: skip
    assert response.status_code == 200
    assert response.headers["x-request-id"] == "req-1"
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    assert [e["choices"][0]["text"] for e in events[:-1]] == ["t"] * 5
    assert all("usage" not in e for e in events[:-1])  # usage the client did not ask for
    (prefill,) = pd.upstreams[P1].calls
    assert prefill["request_id"] == "req-1-prefill"
    assert prefill["body"] == {"model": "tiny", "prompt": PROMPT, "max_tokens": 1, "stream": False}
    (decode,) = pd.upstreams[D1].calls
    assert decode["request_id"] == "req-1"
    assert decode["body"]["stream_options"] == {
        "include_usage": True,
        "continuous_usage_stats": True,
    }
    record = pd.record()
    assert (record.request_id, record.status, record.output_tokens) == ("req-1", Status.OK, 5)
    assert (record.labels.model, record.labels.slo, record.labels.priority) == (
        "tiny",
        "chat",
        "hi",
    )
    assert record.labels.route == "pd"
    assert (record.prompt_tokens, record.cached_tokens) == (200, 128)
    phases = record.phase_offsets_us
    order = [Phase.PREFILL_START, Phase.PREFILL_END, Phase.KV_HANDOFF_START,
             Phase.KV_HANDOFF_END, Phase.FINISHED]  # fmt: skip
    assert (np.diff(phases[order]) >= 0).all() and phases[Phase.PREFILL_START] >= 0
    assert phases[Phase.KV_HANDOFF_END] <= record.emission_offsets_us[0]
    assert pd.metric("goodput_gateway_upstream_requests_total", pool="prefill", outcome="ok") == 1
    assert pd.metric("goodput_gateway_upstream_requests_total", pool="decode", outcome="ok") == 1
    assert (
        pd.metric(
            "goodput_requests_total", model="tiny", vantage="gateway", slo="chat", status="ok"
        )
        == 1
    )
    state = {s.id: s for s in pd.gateway.pool.states()}
    assert all(s.prefill_tokens == 0 and s.decode_streams == 0 for s in state.values())


async def test_usage_asked_by_the_client_is_kept(pd: Harness) -> None:
    response = await pd.client.post("/v1/completions", json={
        "model": "tiny", "prompt": "hi", "max_tokens": 2, "stream": True,
        "stream_options": {"include_usage": True}})  # fmt: skip
    events = sse_events(response.text)
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 2
    assert "usage" not in events[0]


async def test_non_streaming_request_is_one_emission_of_all_its_tokens(pd: Harness) -> None:
    response = await pd.client.post(
        "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 7}
    )
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] == 7
    record = pd.record()
    assert record.status == Status.OK
    assert record.emission_tokens is not None and record.emission_tokens.tolist() == [7]


async def test_chat_completions_are_relayed(pd: Harness) -> None:
    response = await pd.client.post("/v1/chat/completions", json={
        "model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
        "stream": True})  # fmt: skip
    events = sse_events(response.text)
    assert [e["choices"][0]["delta"].get("content") for e in events[:-1]] == ["", "t", "t", "t"]
    assert pd.record().output_tokens == 3  # the role chunk carries none
    assert pd.upstreams[P1].calls[0]["path"] == "/v1/chat/completions"


async def test_dead_prefill_instance_is_retried_elsewhere_and_cooled_down(pd: Harness) -> None:
    pd.upstreams[P1].down = True
    response = await pd.client.post(
        "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2, "stream": True}
    )
    assert response.status_code == 200
    assert len(pd.upstreams[P2].calls) == 1
    assert pd.record().status == Status.OK
    assert pd.metric("goodput_gateway_retries_total", pool="prefill") == 1
    assert (
        pd.metric("goodput_gateway_upstream_requests_total", pool="prefill", outcome="error") == 1
    )
    state = pd.gateway.pool.get(P1)
    assert state.down_until_s > pd.gateway.clock_s()


async def test_prefill_failing_twice_is_a_502_and_an_error_record(pd: Harness) -> None:
    pd.upstreams[P1].status = 503
    pd.upstreams[P2].down = True
    response = await pd.client.post(
        "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2}
    )
    assert response.status_code == 502
    assert response.json()["error"]["type"] == "upstream_error"
    assert "prefill on http://p2:8000 failed: ConnectError" in response.json()["error"]["message"]
    record = pd.record()
    assert record.status == Status.ERROR and record.reason.startswith("prefill on http://p2:8000")
    assert pd.upstreams[D1].calls == [] and pd.upstreams[D2].calls == []


async def test_a_4xx_is_relayed_as_is_without_retry(pd: Harness) -> None:
    pd.upstreams[P1].status = 400
    response = await pd.client.post(
        "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2}
    )
    assert response.status_code == 400
    assert response.json() == {"error": {"message": "boom"}}
    assert pd.upstreams[P2].calls == []
    assert pd.record().reason == "prefill on http://p1:8000: HTTP 400"


async def test_decode_breaking_mid_stream_ends_with_an_sse_error(pd: Harness) -> None:
    pd.upstreams[D1].break_after = 3
    response = await pd.client.post(
        "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 8, "stream": True}
    )
    assert response.status_code == 200
    events = sse_events(response.text)
    assert len(events) == 5 and events[-1] == "[DONE]"
    assert events[-2]["error"]["code"] == 502
    assert events[-2]["error"]["message"].startswith("decode stream from http://d1:8000 broke")
    record = pd.record()
    assert (record.status, record.output_tokens) == (Status.ERROR, 3)
    assert pd.gateway.pool.get(D1).down_until_s > 0
    assert pd.metric("goodput_gateway_upstream_requests_total", pool="decode", outcome="error") == 1
    # The gateway serves on: the next request goes to the other decode instance.
    again = await pd.client.post(
        "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2, "stream": True}
    )
    assert sse_events(again.text)[-1] == "[DONE]" and len(pd.upstreams[D2].calls) == 1


async def test_an_upstream_error_event_is_relayed_and_recorded(pd: Harness) -> None:
    pd.upstreams[D1].error_after = 2
    response = await pd.client.post(
        "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 8, "stream": True}
    )
    events = sse_events(response.text)
    assert events[-2] == {"error": {"message": "engine dead", "type": "InternalServerError",
                                    "code": 500}}  # fmt: skip
    record = pd.record()
    assert (record.status, record.reason) == (Status.ERROR, "decode on http://d1:8000: engine dead")


async def test_dead_decode_before_the_stream_is_retried(pd: Harness) -> None:
    pd.upstreams[D1].down = True
    response = await pd.client.post(
        "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2, "stream": True}
    )
    assert sse_events(response.text)[-1] == "[DONE]"
    assert len(pd.upstreams[D2].calls) == 1 and len(pd.upstreams[P1].calls) == 1
    assert pd.metric("goodput_gateway_retries_total", pool="decode") == 1


async def test_colocated_mode_sends_the_request_once() -> None:
    h = Harness(GatewayConfig(colocated=(D1,)), FakeUpstreams(D1))
    async with h.app.router.lifespan_context(h.app), h.client:
        response = await h.client.post(
            "/v1/completions",
            json={"model": "tiny", "prompt": "hi", "max_tokens": 3, "stream": True},
        )
        assert sse_events(response.text)[-1] == "[DONE]"
    (call,) = h.upstreams[D1].calls
    assert call["body"]["max_tokens"] == 3
    record = h.record()
    assert record.labels.route == "colocated" and record.output_tokens == 3
    assert (record.phase_offsets_us[: Phase.FINISHED] == -1).all()


async def test_admission_rejection_is_a_429_and_a_rejected_record() -> None:
    class Shed:
        def decide(self, info: RequestInfo) -> Decision:
            assert info.stream and info.max_tokens == 4 and info.tenant == "acme"
            return Decision(admit=False, reason="shedding batch", retry_after_s=2.4)

    config = GatewayConfig(prefill=(P1,), decode=(D1,), api_keys={"sk-1": "acme"})
    h = Harness(config, FakeUpstreams(P1, D1), admission=Shed())
    async with h.app.router.lifespan_context(h.app), h.client:
        unauthorised = await h.client.post("/v1/completions", json={"prompt": "x"})
        assert unauthorised.status_code == 401
        response = await h.client.post(
            "/v1/completions",
            json={"model": "tiny", "prompt": "hi", "max_tokens": 4, "stream": True},
            headers={"authorization": "Bearer sk-1"},
        )
    assert response.status_code == 429 and response.headers["retry-after"] == "2"
    assert response.json()["error"]["message"] == "shedding batch"
    record = h.record()
    assert (record.status, record.labels.tenant, record.labels.slo) == (
        Status.REJECTED, "acme", "acme")  # fmt: skip
    assert h.upstreams[P1].calls == []


async def test_bad_requests_are_refused_with_the_field_named(pd: Harness) -> None:
    cases = [
        (b"[1]", "body must be a JSON object, got list"),
        (b"{", "body must be a JSON object: Expecting property name"),
        (json.dumps({"model": "m"}).encode(), "prompt must be a non-empty string or list"),
    ]
    for body, message in cases:
        response = await pd.client.post("/v1/completions", content=body)
        assert response.status_code == 400
        assert response.json()["error"]["message"].startswith(message)
    chat = await pd.client.post("/v1/chat/completions", json={"model": "m", "messages": []})
    assert chat.json()["error"]["message"] == "messages must be a non-empty list"
    assert pd.sink.records == []


async def test_no_eligible_instance_is_a_503(pd: Harness) -> None:
    for url in (D1, D2):
        pd.gateway.pool.mark_down(url, pd.gateway.clock_s())
    response = await pd.client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
    assert response.status_code == 503
    assert response.json()["error"]["message"].startswith("no eligible decode instance")
    assert pd.record().status == Status.ERROR


async def test_models_health_and_metrics(pd: Harness) -> None:
    models = await pd.client.get("/v1/models")
    assert models.json()["data"][0]["id"] == "tiny"
    health = (await pd.client.get("/health")).json()
    assert health["status"] == "ok" and health["mode"] == "pd"
    assert [i["role"] for i in health["instances"]] == ["prefill", "prefill", "decode", "decode"]
    text = (await pd.client.get("/metrics")).text
    assert 'goodput_gateway_instances{role="decode",state="eligible"} 2.0' in text
    assert "# TYPE goodput_request_ttft_seconds histogram" in text


async def test_client_disconnect_aborts_upstream_and_records_aborted(pd: Harness) -> None:
    pd.upstreams[D1].delay_s = 0.01
    request = pd.gateway.parse(
        _FakeRequest("/v1/completions"),
        json.dumps({"model": "m", "prompt": "hi", "max_tokens": 500, "stream": True}).encode(),
        0,
    )
    sent: list[dict[str, Any]] = []
    disconnect = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await disconnect.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if sum(1 for m in sent if m.get("body")) == 3:
            disconnect.set()

    await RelayResponse(pd.gateway, request)({"type": "http"}, receive, send)
    record = pd.record()
    assert record.status == Status.ABORTED and record.reason == "client disconnected"
    assert 2 <= record.output_tokens < 500
    assert pd.upstreams[D1].closed_streams == 1
    assert pd.gateway.pool.get(D1).decode_streams == 0
    assert (
        pd.metric("goodput_gateway_upstream_requests_total", pool="decode", outcome="aborted") == 1
    )


async def test_disconnect_during_prefill_aborts_it(pd: Harness) -> None:
    pd.upstreams[P1].hang = True
    request = pd.gateway.parse(
        _FakeRequest("/v1/completions"),
        json.dumps({"model": "m", "prompt": "hi", "stream": True}).encode(),
        0,
    )

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(0.05)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        raise AssertionError(f"nothing must be sent, got {message}")

    await RelayResponse(pd.gateway, request)({"type": "http"}, receive, send)
    assert pd.record().status == Status.ABORTED
    assert pd.gateway.pool.get(P1).prefill_tokens == 0
    assert pd.upstreams[D1].calls == []


class _FakeRequest:
    """What Gateway.parse reads of a Starlette request."""

    def __init__(self, path: str) -> None:
        self.headers: dict[str, str] = {}
        self.url = httpx.URL(f"http://gw{path}")


async def test_a_non_streaming_answer_that_breaks_is_a_502(pd: Harness) -> None:
    async def broken(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content).get("max_tokens") == 1:  # the prefill answers
            return await pd.upstreams.handle(request)

        async def body() -> AsyncIterator[bytes]:
            yield b'{"id": '
            raise httpx.ReadError("connection reset")

        return httpx.Response(200, content=body())

    pd.gateway._transport = httpx.MockTransport(broken)
    pd.gateway._clients.clear()
    response = await pd.client.post(
        "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 3}
    )
    assert response.status_code == 502
    assert response.json()["error"]["message"].startswith(
        "decode answer from http://d1:8000 broke: ReadError"
    )
    assert pd.record().status == Status.ERROR


async def stream_slowly(
    harness: Harness, max_tokens: int, *, write_s: float = 0.0, body_delay_s: float = 0.0
) -> httpx.Response:
    """One streamed completion through ``harness``'s app over a slow connection: each body
    write to the client takes ``write_s``; the request's body arrives ``body_delay_s`` after
    its headers."""
    app = harness.app

    async def slow_connection(scope: Any, receive: Any, send: Any) -> None:
        async def late_receive() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                await asyncio.sleep(body_delay_s)
            return message

        async def slow_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                await asyncio.sleep(write_s)
            await send(message)

        await app(scope, late_receive, slow_send)

    transport = httpx.ASGITransport(slow_connection)
    client = httpx.AsyncClient(transport=transport, base_url="http://gw")
    async with app.router.lifespan_context(app), client:
        return await client.post("/v1/completions", json={
            "model": "m", "prompt": "hi", "max_tokens": max_tokens, "stream": True})  # fmt: skip


async def test_tokens_are_recorded_when_written_to_the_client() -> None:
    # A client connection that takes 20 ms per write: a token's time is when it left for
    # the client (what a client's TTFT and ITL are made of), not when the upstream sent it.
    harness = Harness(GatewayConfig(colocated=(D1,)), FakeUpstreams(D1))
    write_s = 0.02

    response = await stream_slowly(harness, 4, write_s=write_s)

    assert response.status_code == 200
    record = harness.record()
    assert record.output_tokens == 4
    offsets_s = record.emission_offsets_us / 1e6
    assert offsets_s[0] >= write_s
    assert (np.diff(offsets_s) >= write_s * 0.9).all(), offsets_s


async def test_a_request_arrives_when_its_headers_do_not_when_its_body_is_read() -> None:
    # A body that trickles in 30 ms after the headers: the client's clock already runs, so
    # the gateway's TTFT counts that wait too.
    harness = Harness(GatewayConfig(colocated=(D1,)), FakeUpstreams(D1))
    body_delay_s = 0.03

    response = await stream_slowly(harness, 2, body_delay_s=body_delay_s)

    assert response.status_code == 200
    assert harness.record().emission_offsets_us[0] / 1e6 >= body_delay_s
