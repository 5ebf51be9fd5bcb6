"""Which fleet members a key reaches (``controlplane.services.fleet``): a cluster key every
member, a tenant key its tenant's; a refusal names why without naming the other tenant."""

from __future__ import annotations

import pytest

from controlplane.errors import ForbiddenError
from controlplane.models import FleetMember
from controlplane.services.fleet import check_acts_on, visible


def member(tenant: str | None) -> FleetMember:
    return FleetMember(id="w-0", tenant=tenant)


@pytest.mark.parametrize(
    ("owner", "key", "reached"),
    [
        (None, None, True),
        ("acme", None, True),
        ("acme", "acme", True),
        (None, "acme", False),
        ("beta", "acme", False),
    ],
)
def test_a_key_reaches_its_tenants_members(
    owner: str | None, key: str | None, reached: bool
) -> None:
    assert visible(member(owner), key) is reached
    if reached:
        check_acts_on(member(owner), tenant=key, key="k")


@pytest.mark.parametrize(
    ("owner", "whose"),
    [(None, "the cluster's (shared, registered without a tenant)"), ("beta", "another tenant's")],
)
def test_a_refusal_says_why(owner: str | None, whose: str) -> None:
    with pytest.raises(ForbiddenError) as refused:
        check_acts_on(member(owner), tenant="acme", key="k")
    assert str(refused.value) == (
        f"fleet member 'w-0' is {whose}; key 'k' is scoped to tenant 'acme' and acts only on "
        "that tenant's members"
    )
    assert "beta" not in str(refused.value)
