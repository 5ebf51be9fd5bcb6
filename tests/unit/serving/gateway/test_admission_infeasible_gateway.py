"""Infeasible requests through the whole gateway (in-memory upstreams, the default
``PolicyAdmission`` with a pushed policy): the refusal's body and record where the SLO
rejects them, the best-effort admission and its counter where it admits them (one prefill
instance, idle: best effort may use it)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from exporters.admission import AdmissionModel, AdmissionPolicy, ClassPolicy, SLOAdmission
from exporters.records import Status
from serving.gateway import GatewayConfig
from tests.unit.serving.gateway.fake_upstream import FakeUpstreams
from tests.unit.serving.gateway.test_relay import Harness

P1, D1 = "http://p1:8000", "http://d1:8000"
#: About 1,500 prompt tokens by the gateway's estimate: 1.5 s of prefill at 1,000 tokens/s.
LONG = "word " * 1_500


def policy() -> AdmissionPolicy:
    return AdmissionPolicy(
        version=4,
        ttl_s=3_600.0,
        fallback_max_concurrency=64,
        classes={"critical": ClassPolicy(shed_order=1, sheddable=False)},
        slos={
            "strict": SLOAdmission(ttft_s=0.5, infeasible="reject"),
            "lenient": SLOAdmission(ttft_s=0.5),
        },
        model=AdmissionModel(prefill_tokens_per_s=1_000.0, kv_handoff_s=0.01),
    )


@pytest.fixture
async def gw() -> AsyncIterator[Harness]:
    h = Harness(GatewayConfig(prefill=(P1,), decode=(D1,)), FakeUpstreams(P1, D1))
    async with h.app.router.lifespan_context(h.app), h.client:
        h.gateway.admission.apply(policy())
        yield h


async def ask(h: Harness, slo: str, priority: str = "") -> tuple[int, dict[str, object], str]:
    headers = {"x-goodput-slo": slo}
    if priority:
        headers["x-goodput-priority"] = priority
    response = await h.client.post(
        "/v1/completions",
        json={"model": "tiny", "prompt": LONG, "max_tokens": 4},
        headers=headers,
    )
    return response.status_code, response.json(), response.headers.get("retry-after", "")


async def test_an_slo_that_rejects_answers_at_once_with_a_clear_body(gw: Harness) -> None:
    status, body, retry_after = await ask(gw, "strict")
    error = body["error"]
    assert isinstance(error, dict)
    assert retry_after == ""  # retrying cannot help
    assert error["infeasible"] is True
    assert (error["slo"], error["objective"], error["allowed"]) == ("strict", "ttft", 0.5)
    assert isinstance(error["predicted"], float) and error["predicted"] > 1.0
    message = str(error["message"])
    assert message.startswith("slo 'strict': infeasible request: predicted TTFT on an idle")
    assert "> objective 0.5 s" in message and "retrying will not help" in message
    assert gw.upstreams[P1].calls == []  # never queued
    record = gw.record()
    assert record.status == Status.REJECTED and record.labels.slo == "strict"
    assert (
        gw.metric("goodput_gateway_admission_infeasible_total", slo="strict", action="reject")
        == 1.0
    )
    assert (
        gw.metric(  # not load shedding
            "goodput_gateway_admission_rejections_total", priority="other", reason="ttft"
        )
        is None
    )
    assert status == 400


async def test_the_refusal_is_a_400(gw: Harness) -> None:
    status, body, _ = await ask(gw, "strict")
    assert status == 400
    assert body["error"]["type"] == "infeasible_request"  # type: ignore[index]


async def test_an_slo_that_admits_serves_it_and_counts_it_apart(gw: Harness) -> None:
    status, _, _ = await ask(gw, "lenient")
    assert status == 200
    assert (
        gw.metric("goodput_gateway_admission_infeasible_total", slo="lenient", action="admit")
        == 1.0
    )
    assert gw.record().status == Status.OK
    assert gw.gateway.admission.in_flight == 0  # its record finished it


async def test_never_shed_traffic_is_served_even_where_the_slo_rejects(gw: Harness) -> None:
    status, _, _ = await ask(gw, "strict", priority="critical")
    assert status == 200
    assert (
        gw.metric("goodput_gateway_admission_infeasible_total", slo="strict", action="admit") == 1.0
    )
