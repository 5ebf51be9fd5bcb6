"""Roles, principals and route guards (pure: FastAPI routing, no requests, no database)."""

from __future__ import annotations

import uuid

import pytest
from fastapi import APIRouter, Depends, FastAPI

from controlplane.api.auth import (
    CLI,
    Principal,
    RoleRequirement,
    assert_routes_guarded,
    document_open_routes,
    grants,
    require,
    route_requirements,
)
from controlplane.main import create_app
from controlplane.models import KeyRole
from controlplane.settings import Settings


@pytest.mark.parametrize(
    ("held", "needed", "allowed"),
    [(KeyRole.ADMIN, role, True) for role in KeyRole]
    + [
        (KeyRole.OPERATOR, KeyRole.VIEWER, True),
        (KeyRole.OPERATOR, KeyRole.OPERATOR, True),
        (KeyRole.OPERATOR, KeyRole.ADMIN, False),
        (KeyRole.OPERATOR, KeyRole.INGEST, False),
        (KeyRole.OPERATOR, KeyRole.AGENT, False),
        (KeyRole.VIEWER, KeyRole.OPERATOR, False),
        (KeyRole.VIEWER, KeyRole.INGEST, False),
        (KeyRole.INGEST, KeyRole.VIEWER, False),
        (KeyRole.INGEST, KeyRole.INGEST, True),
        (KeyRole.AGENT, KeyRole.AGENT, True),
        (KeyRole.AGENT, KeyRole.VIEWER, False),
        (KeyRole.AGENT, KeyRole.INGEST, False),
    ],
)
def test_grants(held: KeyRole, needed: KeyRole, allowed: bool) -> None:
    assert grants(held, needed) is allowed


def test_actor_names_the_key_or_the_cli() -> None:
    key_id = uuid.UUID("7c9e6679-7425-40de-944b-e07fc1f90ae7")
    principal = Principal(key_id=key_id, name="deploy-bot", role=KeyRole.OPERATOR)
    assert principal.actor == f"key:{key_id}:deploy-bot"
    assert CLI.actor == "cli"


def test_route_requirements_are_read_back_from_the_dependency_tree() -> None:
    router = APIRouter()
    guard = require(KeyRole.INGEST)

    def nested(_: object = Depends(guard)) -> None:
        return None

    @router.post("/direct")
    def direct(_: object = Depends(require(KeyRole.OPERATOR))) -> None:
        return None

    @router.post("/nested")
    def via_dependency(_: None = Depends(nested)) -> None:
        return None

    app = FastAPI()
    app.include_router(router)
    found = {r.path: route_requirements(r) for r in app.routes if hasattr(r, "dependant")}
    assert [req.role for req in found["/direct"]] == [KeyRole.OPERATOR]
    assert found["/nested"] == [guard]


def test_an_unguarded_route_stops_the_app_from_starting() -> None:
    app = FastAPI()

    @app.get("/oops")
    def oops() -> None:
        return None

    with pytest.raises(
        RuntimeError, match=r"routes without a role requirement: GET /oops; add a dependency"
    ):
        assert_routes_guarded(app)


def test_open_setting_follows_the_settings() -> None:
    requirement = RoleRequirement(KeyRole.VIEWER, open_setting="open_metrics")
    assert requirement.is_open(Settings(open_metrics=True))
    assert not requirement.is_open(Settings(open_metrics=False))
    assert not RoleRequirement(KeyRole.VIEWER).is_open(Settings())


@pytest.mark.parametrize("open_health", [True, False])
def test_open_routes_are_published_without_security(open_health: bool) -> None:
    app = create_app(Settings(database_url="sqlite:///unused.db", open_health=open_health))
    paths = document_open_routes(app, app.openapi())["paths"]
    assert ("security" in paths["/health"]["get"]) is not open_health
    assert "security" in paths["/api/v1/slos"]["get"]
