"""Engine priorities (``--engine-priority``): a request's class as vLLM's ``priority`` on both
legs, and the admission rule's prediction under that order (docs/admission.md, "Engine
priorities")."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from exporters.admission import AdmissionModel, AdmissionPolicy, ClassPolicy, SLOAdmission
from exporters.fleet import PoolRole
from serving.gateway import GatewayConfig, create_app
from serving.gateway.admission import RequestInfo
from serving.gateway.admission_load import LoadTracker
from serving.gateway.admission_policy import PolicyAdmission
from serving.gateway.config import GatewayConfigError
from serving.gateway.engine_priority import EnginePriority, class_ranks, with_priority
from serving.gateway.routing import InstanceState
from tests.unit.serving.gateway.fake_upstream import FakeUpstreams
from tests.unit.serving.gateway.test_relay import Harness

P1, D1 = "http://p1:8000", "http://d1:8000"
# The control plane's default classes (controlplane/policies/admission.py).
CLASSES = {
    "critical": ClassPolicy(shed_order=2, sheddable=False),
    "standard": ClassPolicy(shed_order=1),
    "sheddable": ClassPolicy(shed_order=0, headroom_ratio=0.7),
}
MODEL = AdmissionModel(prefill_tokens_per_s=10_000.0, kv_handoff_s=0.01)
POLICY = AdmissionPolicy(
    version=1,
    ttl_s=1e9,
    fallback_max_concurrency=8,
    classes=CLASSES,
    slos={"chat": SLOAdmission(ttft_s=1.0)},
    model=MODEL,
)


# -- the setting ---------------------------------------------------------------------------


def test_off_policy_and_a_map_are_read_and_described() -> None:
    assert not EnginePriority.parse("off").enabled and not EnginePriority.parse("").enabled
    assert EnginePriority.parse(" policy ").describe() == "policy"
    mapped = EnginePriority.parse("critical=0, standard=1,sheddable=2,*=5")
    assert (mapped.mode, mapped.mapping, mapped.default) == (
        "map", {"critical": 0, "standard": 1, "sheddable": 2}, 5)  # fmt: skip
    assert EnginePriority.parse(mapped.describe()) == mapped
    assert EnginePriority.parse("batch=-3").mapping == {"batch": -3}  # vLLM takes any int


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("critical", "CLASS=N pairs"),
        ("critical=high", "the part 'critical=high'"),
        ("critical=0,,standard=1", "the part ''"),
        ("critical=0,critical=1", "'critical' is given twice"),
        ("*=1,*=2", "'\\*' is given twice"),
        ("critical=99999999999", "out of range"),
    ],
)
def test_a_bad_setting_is_refused_naming_the_part(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        EnginePriority.parse(text)
    with pytest.raises(GatewayConfigError, match="--engine-priority"):
        GatewayConfig(prefill=(P1,), decode=(D1,), engine_priority=text)


def test_the_default_classes_rank_critical_standard_sheddable() -> None:
    ranks, default = class_ranks(CLASSES)
    assert ranks == {"critical": 0, "standard": 1, "sheddable": 2}
    assert default == 2  # an unlisted class is judged as ClassPolicy(): sheddable, order 0


def test_equal_classes_share_a_number_and_an_unlisted_class_takes_the_default_place() -> None:
    classes = {
        "gold": ClassPolicy(sheddable=False),
        "platinum": ClassPolicy(shed_order=7, sheddable=False),
        "silver": ClassPolicy(shed_order=3),
        "bronze": ClassPolicy(shed_order=3, headroom_ratio=0.5),
    }
    ranks, default = class_ranks(classes)
    assert ranks == {"platinum": 0, "gold": 1, "silver": 2, "bronze": 2}
    assert default == 3  # after every listed class (none is sheddable with order 0)
    assert class_ranks({}) == ({}, 0)


@given(
    st.dictionaries(
        st.text("abcdefgh", min_size=1, max_size=4),
        st.builds(ClassPolicy, shed_order=st.integers(0, 5), sheddable=st.booleans()),
        max_size=8,
    )
)
def test_ranks_put_never_shed_first_then_the_higher_shed_order_without_gaps(
    classes: dict[str, ClassPolicy],
) -> None:
    ranks, default = class_ranks(classes)
    assert sorted(set(ranks.values())) == list(range(len(set(ranks.values()))))
    for a, b in ((a, b) for a in classes for b in classes):
        ka = (classes[a].sheddable, -classes[a].shed_order)
        kb = (classes[b].sheddable, -classes[b].shed_order)
        assert (ranks[a] < ranks[b]) == (ka < kb) and (ranks[a] == ranks[b]) == (ka == kb)
    assert default <= len(set(ranks.values()))
    for name, rules in classes.items():  # the default sits where ClassPolicy() would
        key = (rules.sheddable, -rules.shed_order)
        assert (ranks[name] < default) == (key < (True, 0))


def test_a_request_gets_its_number_from_the_map_or_the_policy_in_force() -> None:
    mapped = EnginePriority.parse("critical=0,standard=1")
    assert (mapped.of("critical", None), mapped.of("standard", POLICY)) == (0, 1)
    assert mapped.of("other", POLICY) is None  # no "*": sent with none
    assert EnginePriority.parse("critical=0,*=9").of("other", None) == 9
    ordered = EnginePriority.parse("policy")
    assert ordered.of("critical", None) is None  # before the first policy: none
    assert [ordered.of(c, POLICY) for c in ("critical", "standard", "sheddable", "")] == [
        0, 1, 2, 2]  # fmt: skip
    flipped = AdmissionPolicy(
        version=2, ttl_s=1e9, fallback_max_concurrency=8,
        classes={"standard": ClassPolicy(sheddable=False), "critical": ClassPolicy()},
    )  # fmt: skip
    assert (ordered.of("standard", flipped), ordered.of("critical", flipped)) == (0, 1)
    assert EnginePriority.parse("off").of("critical", POLICY) is None


def test_the_body_carries_the_gateways_number_never_the_clients() -> None:
    body = {"prompt": "x", "priority": -100}
    assert with_priority(body, 2) == {"prompt": "x", "priority": 2}
    assert with_priority(body, None) == {"prompt": "x"}
    assert body == {"prompt": "x", "priority": -100}  # a copy


# -- the relay -----------------------------------------------------------------------------


async def _send(h: Harness, priority: str | None, body: dict[str, Any] | None = None) -> None:
    headers = {"x-goodput-slo": "chat"}
    if priority is not None:
        headers["x-goodput-priority"] = priority
    response = await h.client.post(
        "/v1/completions",
        json={"model": "tiny", "prompt": "word " * 40, "max_tokens": 3, "stream": True,
              **(body or {})},
        headers=headers,
    )  # fmt: skip
    assert response.status_code == 200, response.text


def _priorities(h: Harness, url: str) -> list[Any]:
    return [call["body"].get("priority", "none") for call in h.upstreams[url].calls]


@pytest.fixture
async def mapped() -> AsyncIterator[Harness]:
    config = GatewayConfig(prefill=(P1,), decode=(D1,), engine_priority="critical=0,standard=1")
    h = Harness(config, FakeUpstreams(P1, D1))
    async with h.app.router.lifespan_context(h.app), h.client:
        yield h


async def test_both_legs_carry_the_class_number_and_replace_the_clients(mapped: Harness) -> None:
    await _send(mapped, "standard")
    await _send(mapped, "critical", {"priority": 7})
    await _send(mapped, "batch", {"priority": -7})  # not in the map: sent with none
    await _send(mapped, None)
    assert _priorities(mapped, P1) == [1, 0, "none", "none"]
    assert _priorities(mapped, D1) == [1, 0, "none", "none"]
    (prefill, *_) = mapped.upstreams[P1].calls
    assert prefill["body"]["max_tokens"] == 1 and prefill["body"]["stream"] is False
    health = (await mapped.client.get("/health")).json()
    assert health["engine_priority"] == "critical=0,standard=1"


async def test_off_relays_the_body_as_the_client_sent_it() -> None:
    h = Harness(GatewayConfig(prefill=(P1,), decode=(D1,)), FakeUpstreams(P1, D1))
    async with h.app.router.lifespan_context(h.app), h.client:
        await _send(h, "critical")
        await _send(h, "critical", {"priority": 3})
        assert (await h.client.get("/health")).json()["engine_priority"] == "off"
    assert _priorities(h, P1) == ["none", 3] and _priorities(h, D1) == ["none", 3]


async def test_policy_numbers_follow_the_applied_policy_and_the_colocated_leg() -> None:
    h = Harness(GatewayConfig(colocated=(D1,), engine_priority="policy"), FakeUpstreams(D1))
    async with h.app.router.lifespan_context(h.app), h.client:
        await _send(h, "critical")  # no policy yet: none
        h.gateway.admission.apply(
            AdmissionPolicy(version=1, ttl_s=1e9, fallback_max_concurrency=8, classes=CLASSES)
        )
        for priority in ("sheddable", "critical", "standard", "unknown"):
            await _send(h, priority)
    assert _priorities(h, D1) == ["none", 2, 0, 1, 2]


class Probed(FakeUpstreams):
    """Fake upstreams that look at the gateway's load view as each call arrives."""

    def __init__(self, *urls: str) -> None:
        super().__init__(*urls)
        self.seen: list[tuple[str, list[int]]] = []
        self.load: LoadTracker | None = None

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if self.load is not None and request.url.path.startswith("/v1/"):
            ahead = [self.load.tokens_ahead(p) for p in (None, 0, 1)]
            self.seen.append((request.url.host, ahead))
        return await super().handle(request)


async def test_the_prefill_load_is_counted_under_the_requests_number() -> None:
    upstreams = Probed(P1, D1)
    config = GatewayConfig(prefill=(P1,), decode=(D1,), engine_priority="critical=0,standard=1")
    h = Harness(config, upstreams)
    async with h.app.router.lifespan_context(h.app), h.client:
        upstreams.load = h.gateway.load
        await _send(h, "standard")
    # 40 words: 200 characters ÷ 4 + 1 = 51 tokens, queued at number 1 while it prefills
    assert upstreams.seen == [("p1", [51, 0, 51]), ("d1", [0, 0, 0])]


# -- the prediction under the engines' order ------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_rule() -> tuple[PolicyAdmission, LoadTracker, Clock]:
    tracker = LoadTracker()
    tracker.sync(
        [InstanceState("p", "p", PoolRole.PREFILL), InstanceState("d", "d", PoolRole.DECODE)]
    )
    clock = Clock()
    rule = PolicyAdmission(tracker, clock_s=clock, registry=CollectorRegistry())
    rule.apply(POLICY)
    return rule, tracker, clock


def req(priority: str, engine_priority: int | None, prompt: int = 1000) -> RequestInfo:
    return RequestInfo("r", "m", "t", "chat", priority, prompt, 8, True, 0.0, engine_priority)


def test_tokens_ahead_are_those_at_the_same_or_a_lower_number() -> None:
    t = LoadTracker()
    t.sync([InstanceState("p", "p", PoolRole.PREFILL)])
    t.add("p", prefill_tokens=100, engine_priority=0)
    t.add("p", prefill_tokens=200, engine_priority=1)
    t.add("p", prefill_tokens=400, engine_priority=2)
    assert [t.tokens_ahead(p) for p in (None, -1, 0, 1, 2, 9)] == [700, 0, 100, 300, 700, 700]
    t.add("p", prefill_tokens=-200, engine_priority=1)
    assert (t.tokens_ahead(1), t.min_prefill_tokens, t.prefill_requests) == (100, 500, 2)
    t.add("gone", prefill_tokens=50, engine_priority=0)  # not in the pool: not ahead
    assert t.tokens_ahead(0) == 100


def test_a_class_waits_only_for_the_queued_tokens_of_its_number_and_lower() -> None:
    rule, tracker, _ = make_rule()
    tracker.add("p", prefill_tokens=9500, engine_priority=2)  # queued sheddable work
    refused = rule.decide(req("standard", None))  # arrival order: it waits for all of it
    assert not refused.admit and refused.predicted == pytest.approx(1.06)
    assert rule.decide(req("standard", 1)).admit  # served before the sheddable work
    assert rule._predicted["r"][1] == pytest.approx(1000 / 10_000 + 0.01)
    tracker.add("p", prefill_tokens=9500, engine_priority=1)  # queued standard work
    refused = rule.decide(req("standard", 1))
    assert not refused.admit and refused.predicted == pytest.approx(1.06)
    assert rule.decide(req("critical", 0)).admit  # never shed; served before both
    assert rule._predicted["r"][1] == pytest.approx(0.11)


def test_the_room_kept_is_for_what_passes_the_request_or_queues_behind_it() -> None:
    rule, _, clock = make_rule()
    for _ in range(20):  # admitted standard traffic: 2,000 tokens/s at number 1
        assert rule.decide(req("standard", 1, prompt=1000)).admit
        clock.now += 0.5
    # A sheddable request (number 2) keeps room for the standard tokens that will pass
    # it within the 1 s objective (≈ 2,000 tokens: 0.2 s at 10,000 tokens/s).
    room = rule._reserve_s(MODEL, 1.0, clock.now, 2)
    assert room == pytest.approx(0.2, rel=0.15)
    # A standard one keeps none: nothing is admitted at a lower number, and no never-shed
    # traffic shares its number; in arrival order only never-shed traffic counts (none).
    assert rule._reserve_s(MODEL, 1.0, clock.now, 1) == 0.0
    assert rule._reserve_s(MODEL, 1.0, clock.now, None) == 0.0
    shed = rule.decide(req("sheddable", 2, prompt=6000))  # 0.61 s > 0.7 x 1.0 − 0.2
    assert not shed.admit
    assert "s kept for never-shed and higher-priority traffic" in shed.reason
    assert rule.decide(req("sheddable", None, prompt=6000)).admit  # no room in arrival order


def test_never_shed_traffic_at_the_same_number_is_room_as_in_arrival_order() -> None:
    rule, _, clock = make_rule()
    for _ in range(20):  # critical traffic sent at number 1, as standard (a map may)
        assert rule.decide(req("critical", 1, prompt=1000)).admit
        clock.now += 0.5
    fcfs = rule._reserve_s(MODEL, 1.0, clock.now, None)
    assert fcfs == pytest.approx(0.2, rel=0.15)
    assert rule._reserve_s(MODEL, 1.0, clock.now, 1) == pytest.approx(fcfs)  # queues behind
    assert rule._reserve_s(MODEL, 1.0, clock.now, 2) == pytest.approx(fcfs)  # passes it
    assert rule._reserve_s(MODEL, 1.0, clock.now, 0) == 0.0  # neither


@given(
    queued=st.lists(st.tuples(st.integers(0, 3), st.integers(1, 5_000)), max_size=12),
    prompt=st.integers(1, 4_000),
    number=st.integers(0, 3),
)
def test_one_number_for_everything_predicts_as_arrival_order(
    queued: list[tuple[int, int]], prompt: int, number: int
) -> None:
    """With every request at one number the engine serves them in arrival order: the
    prediction is the one without engine priorities."""
    rule, tracker, _ = make_rule()
    for _, tokens in queued:
        tracker.add("p", prefill_tokens=tokens, engine_priority=number)
    assert rule._ttft_s(MODEL, req("standard", number, prompt)) == pytest.approx(
        rule._ttft_s(MODEL, req("standard", None, prompt))
    )
    # and a number never predicts a longer wait than arrival order
    mixed, t2, _ = make_rule()
    for p, tokens in queued:
        t2.add("p", prefill_tokens=tokens, engine_priority=p)
    assert (
        mixed._ttft_s(MODEL, req("standard", number, prompt))
        <= mixed._ttft_s(MODEL, req("standard", None, prompt)) + 1e-12
    )


def test_create_app_reads_the_setting() -> None:
    app = create_app(
        GatewayConfig(prefill=(P1,), decode=(D1,), engine_priority="policy"), link=False
    )
    assert app.state.gateway.engine_priority.mode == "policy"


# -- the engines' side: the workers' launch flags -------------------------------------------


def test_workers_start_vllm_with_the_priority_policy_and_whole_prompts_when_asked() -> None:
    from pathlib import Path

    from serving.workers.config import SpecError, VllmSpec, build_launch

    def argv(**kw: Any) -> list[str]:
        spec = VllmSpec(model=Path("/m"), port=8100, **kw)
        return build_launch(spec, run_dir=Path("/run"), base_env={}).argv

    plain = argv()
    assert "--scheduling-policy" not in plain and not any("chunked" in a for a in plain)
    ordered = argv(scheduling_policy="priority", chunked_prefill=False)
    at = ordered.index("--scheduling-policy")
    assert ordered[at + 1] == "priority" and "--no-enable-chunked-prefill" in ordered
    assert "--enable-chunked-prefill" in argv(chunked_prefill=True)
    with pytest.raises(SpecError, match="scheduling_policy must be one of fcfs, priority"):
        VllmSpec(model=Path("/m"), port=8100, scheduling_policy="lifo")


def test_goodput_worker_passes_the_flags_to_vllm(tmp_path: Any) -> None:
    import json

    from typer.testing import CliRunner

    from goodput.cli import app

    args = ["worker", "--port", "8100", "--model", str(tmp_path), "--scheduling-policy",
            "priority", "--no-chunked-prefill", "--print-plan"]  # fmt: skip
    out = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    argv = json.loads(out.stdout)["argv"]
    assert "--no-enable-chunked-prefill" in argv
    assert argv[argv.index("--scheduling-policy") + 1] == "priority"
    bad = CliRunner().invoke(app, [*args[:-2], "--scheduling-policy", "lifo", "--print-plan"])
    assert bad.exit_code == 2 and "scheduling_policy must be one of" in bad.output


def test_goodput_gateway_refuses_a_bad_engine_priority() -> None:
    from typer.testing import CliRunner

    from goodput.cli import app

    args = ["gateway", "--prefill", P1, "--decode", D1, "--engine-priority", "critical=first"]
    out = CliRunner().invoke(app, args, env={"COLUMNS": "200"})
    assert out.exit_code == 2 and "--engine-priority" in out.output
