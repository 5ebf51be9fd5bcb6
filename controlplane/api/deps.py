"""Dependency aliases for route signatures: the request's session and the caller's role.

``SessionDep`` is one transaction per request: committed when the handler returns, rolled
back when it raises. Its scope is ``"function"`` so the commit happens *before* the response
is sent; a failing commit is then an error response, never a 2xx for a lost write.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane.api.auth import Principal, require
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
]


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
