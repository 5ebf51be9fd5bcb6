"""``pod_members``: the worker pods → the pool members ``InstancePool.apply_fleet`` takes.

A pod is a member of the pool its ``goodput.dev/role`` label names while it is Ready, has
an IP and is not terminating; its URL is ``http://POD_IP:PORT``. Properties: the answer
does not depend on the order of the pods, and a pool fed any sequence of pod lists holds
exactly the members of the last one (no member outlives the pod state that made it).
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from exporters.fleet import FleetKind, FleetState, PoolRole
from serving.gateway import InstancePool
from serving.gateway.kubernetes import pod_members
from tests.unit.serving.gateway.fake_kubernetes import pod


def test_a_ready_pod_is_a_member_of_its_labels_pool() -> None:
    found = pod_members([pod("w-0", "prefill", ip="10.1.2.3"), pod("w-1", "decode")], port=8000)
    first, second = found.members
    assert (first.id, first.endpoint, first.role) == (
        "w-0",
        "http://10.1.2.3:8000",
        PoolRole.PREFILL,
    )
    assert first.kind is FleetKind.WORKER and first.state is FleetState.READY
    assert not first.stale
    assert (second.id, second.role) == ("w-1", PoolRole.DECODE)
    assert found.unknown_roles == {}


def test_the_port_is_the_configured_one_and_ipv6_is_bracketed() -> None:
    (member,) = pod_members([pod("w", "both", ip="fd00::7")], port=9000).members
    assert member.endpoint == "http://[fd00::7]:9000"
    assert member.role is PoolRole.BOTH


def test_pods_not_ready_terminating_or_without_ip_are_left_out() -> None:
    no_conditions = pod("c", "decode")
    del no_conditions["status"]["conditions"]
    pods = [
        pod("a", "prefill", ready=False),
        pod("b", "prefill", terminating=True),
        pod("d", "prefill", ip=None),
        no_conditions,
    ]
    found = pod_members(pods, port=8000)
    assert found.members == ()
    assert found.unknown_roles == {}


def test_a_pod_with_an_unknown_or_missing_role_is_left_out_and_named() -> None:
    found = pod_members([pod("odd", "sidecar"), pod("none", None), pod("ok", "decode")], port=1)
    assert [m.id for m in found.members] == ["ok"]
    assert found.unknown_roles == {"odd": "sidecar", "none": ""}


def test_objects_not_shaped_like_pods_are_ignored() -> None:
    junk: list[Any] = [
        None,
        3,
        "pod",
        {},
        {"metadata": {}},
        {"metadata": {"name": "x"}},
        {"metadata": [], "status": {}},
        {"metadata": {"name": 5}, "status": {}},
    ]
    assert pod_members(junk, port=8000).members == ()


ROLES = st.sampled_from(["prefill", "decode", "both", "sidecar", None])


@st.composite
def pods_strategy(draw: st.DrawFn, index: int) -> dict[str, Any]:
    """Pod ``w-INDEX`` (IP ``10.0.0.INDEX``, when it has one) in a drawn state."""
    return pod(
        f"w-{index}",
        draw(ROLES),
        ip=f"10.0.0.{index}" if draw(st.booleans()) else None,
        ready=draw(st.booleans()),
        terminating=draw(st.booleans()),
    )


# A pod list as one relist shows it: each pod at most once.
LISTS = st.lists(st.integers(0, 5), max_size=6, unique=True).flatmap(
    lambda indexes: st.tuples(*(pods_strategy(i) for i in indexes)).map(list)
)


@given(LISTS, st.randoms())
def test_membership_does_not_depend_on_the_order_of_the_pods(
    pods: list[dict[str, Any]], rng: Any
) -> None:
    shuffled = list(pods)
    rng.shuffle(shuffled)
    assert pod_members(pods, port=8000) == pod_members(shuffled, port=8000)


@given(st.lists(LISTS, min_size=1, max_size=5))
def test_a_pool_holds_exactly_the_members_of_the_last_pod_list(
    history: list[list[dict[str, Any]]],
) -> None:
    pool = InstancePool()
    for pods in history:
        pool.apply_fleet(pod_members(pods, port=8000).members)
    want = {
        f"http://{p['status']['podIP']}:8000": PoolRole(p["metadata"]["labels"]["goodput.dev/role"])
        for p in history[-1]
        if p["metadata"]["labels"].get("goodput.dev/role") in {"prefill", "decode", "both"}
        and p["status"].get("podIP")
        and "deletionTimestamp" not in p["metadata"]
        and {"type": "Ready", "status": "True"} in p["status"]["conditions"]
    }
    assert {s.url: s.role for s in pool.states()} == want
