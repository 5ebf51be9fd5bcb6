"""The routing decision: least outstanding work, prefix affinity, exclusions, cool-downs."""

from __future__ import annotations

import pytest

from exporters.fleet import PoolRole
from serving.gateway.routing import (
    AFFINITY_BLOCK_TOKENS,
    AFFINITY_PREFIX_CHARS,
    InstanceState,
    NoInstanceError,
    RouteRequest,
    affinity_key,
    choose,
)

P, D, B = PoolRole.PREFILL, PoolRole.DECODE, PoolRole.BOTH


def inst(name: str, role: PoolRole = B, **kw: object) -> InstanceState:
    return InstanceState(id=name, url=f"http://{name}", role=role, **kw)  # type: ignore[arg-type]


def test_pd_picks_least_loaded_prefill_and_decode() -> None:
    states = [
        inst("p1", P, prefill_tokens=900),
        inst("p2", P, prefill_tokens=100),
        inst("d1", D, decode_streams=3),
        inst("d2", D, decode_streams=1),
    ]
    decision = choose(states, RouteRequest(prompt_tokens=500), 0.0)
    assert decision.prefill is not None
    assert (decision.prefill.id, decision.decode.id) == ("p2", "d2")
    assert not decision.affinity_hit


def test_ties_go_to_the_first_listed() -> None:
    states = [inst("p1", P), inst("p2", P), inst("d1", D), inst("d2", D)]
    decision = choose(states, RouteRequest(), 0.0)
    assert decision.prefill is not None
    assert (decision.prefill.id, decision.decode.id) == ("p1", "d1")


def test_decode_work_counts_streams_and_loading_prompts() -> None:
    # d1: 1 stream x 256 = 256; d2: 0 streams but 1000 prompt tokens loading.
    states = [inst("p", P), inst("d1", D, decode_streams=1), inst("d2", D, prefill_tokens=1000)]
    assert choose(states, RouteRequest(), 0.0).decode.id == "d1"
    assert choose(states, RouteRequest(), 0.0, decode_stream_tokens=2000).decode.id == "d2"


def test_kv_both_instances_never_serve_both_halves_when_another_can_decode() -> None:
    states = [inst("a"), inst("b", decode_streams=5)]
    decision = choose(states, RouteRequest(), 0.0)
    assert decision.prefill is not None
    assert (decision.prefill.id, decision.decode.id) == ("a", "b")
    # With a single instance it serves both halves.
    single = choose([inst("a")], RouteRequest(), 0.0)
    assert single.prefill is not None and single.prefill.id == single.decode.id == "a"


def test_colocated_names_only_an_instance_for_the_whole_request() -> None:
    states = [inst("a", decode_streams=2), inst("b")]
    decision = choose(states, RouteRequest(colocated=True), 0.0)
    assert decision.prefill is None
    assert decision.decode.id == "b"


def test_affinity_returns_to_the_pinned_instances_within_the_slack() -> None:
    states = [
        inst("p1", P, prefill_tokens=1000),
        inst("p2", P),
        inst("d1", D, prefill_tokens=1000),
        inst("d2", D),
    ]
    request = RouteRequest(affinity_key="k", affinity={"k": ("p1", "d1")})
    decision = choose(states, request, 0.0, affinity_slack_tokens=1000)
    assert decision.prefill is not None
    assert (decision.prefill.id, decision.decode.id, decision.affinity_hit) == ("p1", "d1", True)
    # Beyond the slack, the load wins.
    decision = choose(states, request, 0.0, affinity_slack_tokens=999)
    assert decision.prefill is not None
    assert (decision.prefill.id, decision.decode.id) == ("p2", "d2")
    assert not decision.affinity_hit


def test_affinity_to_an_ineligible_instance_is_ignored() -> None:
    states = [inst("p1", P), inst("d1", D, healthy=False), inst("d2", D)]
    request = RouteRequest(affinity_key="k", affinity={"k": ("p1", "d1")})
    decision = choose(states, request, 0.0)
    assert decision.decode.id == "d2"
    assert not decision.affinity_hit


def test_excluded_cooling_and_unhealthy_instances_are_skipped() -> None:
    states = [
        inst("p1", P, down_until_s=10.0),
        inst("p2", P),
        inst("p3", P),
        inst("d1", D, healthy=False),
        inst("d2", D),
    ]
    decision = choose(states, RouteRequest(exclude=frozenset({"p2"})), 5.0)
    assert decision.prefill is not None
    assert (decision.prefill.id, decision.decode.id) == ("p3", "d2")
    # Once the cool-down has passed, p1 is back.
    decision = choose(states, RouteRequest(), 10.0)
    assert decision.prefill is not None and decision.prefill.id == "p1"


def test_no_instance_names_the_pool_and_each_reason() -> None:
    states = [inst("p1", P, healthy=False), inst("p2", P, down_until_s=7.5), inst("d", D)]
    with pytest.raises(NoInstanceError) as info:
        choose(states, RouteRequest(exclude=frozenset()), 5.0)
    assert str(info.value) == (
        "no eligible prefill instance (p1: unhealthy; p2: cooling down for 2.5 s)"
    )
    with pytest.raises(NoInstanceError) as info:
        choose([inst("p", P)], RouteRequest(), 0.0)
    assert str(info.value) == "no decode instance is configured (instances: ['p'])"
    with pytest.raises(NoInstanceError) as info:
        choose([inst("a")], RouteRequest(exclude=frozenset({"a"})), 0.0)
    assert str(info.value) == "no eligible prefill instance (a: already failed this request)"


def test_choose_is_pure() -> None:
    states = [inst("p", P), inst("d", D)]
    request = RouteRequest(affinity_key="k", affinity={})
    assert choose(states, request, 1.0) == choose(states, request, 1.0)
    assert request.affinity == {}


def test_affinity_key_of_text_uses_the_leading_characters() -> None:
    short = "x" * (AFFINITY_PREFIX_CHARS - 1)
    assert affinity_key(short) is None
    a = "s" * AFFINITY_PREFIX_CHARS + " question one"
    b = "s" * AFFINITY_PREFIX_CHARS + " another question"
    assert affinity_key(a) == affinity_key(b)
    assert affinity_key(a) != affinity_key("t" * AFFINITY_PREFIX_CHARS)


def test_affinity_key_of_token_ids_needs_a_whole_block() -> None:
    assert affinity_key(list(range(AFFINITY_BLOCK_TOKENS - 1))) is None
    first = list(range(AFFINITY_BLOCK_TOKENS))
    assert affinity_key([*first, 1, 2]) == affinity_key([*first, 3])
    assert affinity_key([*first, 1]) != affinity_key([7, *first])
    assert affinity_key([["nested"]]) is None
    assert affinity_key(42) is None
