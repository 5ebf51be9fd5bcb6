"""Dependency aliases for route signatures: the request's session and the caller's role.

``SessionDep`` is one transaction per request: committed when the handler returns, rolled
back when it raises. Its scope is ``"function"`` so the commit happens *before* the response
is sent; a failing commit is then an error response, never a 2xx for a lost write.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from types import UnionType
from typing import Annotated, Union, get_args, get_origin

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.api.auth import Principal, require
from controlplane.errors import InvalidInputError
from controlplane.models import Role
from controlplane.settings import Settings

__all__ = [
    "Admin",
    "Agent",
    "Ingest",
    "Operator",
    "SessionDep",
    "SettingsDep",
    "Viewer",
    "get_session",
    "get_settings",
    "single_valued_query",
]


def _is_sequence(annotation: object) -> bool:
    origin = get_origin(annotation)
    if origin in (list, tuple, set, frozenset, Sequence):
        return True
    if origin in (Union, UnionType, Annotated):
        return any(_is_sequence(arg) for arg in get_args(annotation))
    return False


async def single_valued_query(request: Request) -> None:
    """Refuse a query parameter given several times where the route takes one value
    (FastAPI would silently keep the last): ``?model=a&model=b`` is a 422, not a guess."""
    route = request.scope.get("route")
    dependant = getattr(route, "dependant", None)
    multi = {
        field.alias
        for field in (dependant.query_params if dependant is not None else ())
        if _is_sequence(field.field_info.annotation)
    }
    for key in dict.fromkeys(request.query_params.keys()):
        values = request.query_params.getlist(key)
        if len(values) > 1 and key not in multi:
            raise InvalidInputError(
                f"{key} must be given once, got {len(values)} values", loc=("query", key)
            )


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    async with request.app.state.sessions() as session, session.begin():
        yield session


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


SessionDep = Annotated[AsyncSession, Depends(get_session, scope="function")]
SettingsDep = Annotated[Settings, Depends(get_settings)]

Viewer = Annotated[Principal, Depends(require(Role.VIEWER))]
Operator = Annotated[Principal, Depends(require(Role.OPERATOR))]
Admin = Annotated[Principal, Depends(require(Role.ADMIN))]
Ingest = Annotated[Principal, Depends(require(Role.INGEST))]
Agent = Annotated[Principal, Depends(require(Role.AGENT))]
