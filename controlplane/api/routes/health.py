"""Liveness (``/health``: the process answers, whatever the database does) and readiness
(``/ready``: the database answers, its schema is the one this code expects, and the live
goodput engine has loaded the SLO set — it retries on its own after a start without a
database; ``/ready`` also tries at once). ``/ready`` names the kind of a failure, never the
driver's message (which names hosts and ports): that goes to the log. Both are open unless
``GOODPUT_OPEN_HEALTH=false``, in which case they need a viewer key."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import sqlalchemy as sa
from fastapi import APIRouter, Depends
from sqlalchemy.ext.asyncio import AsyncEngine

from controlplane.api.auth import Principal, require
from controlplane.api.deps import DatabaseDep, LiveRuntimeDep, SettingsDep
from controlplane.errors import UnavailableError, describe_error
from controlplane.models import SCHEMA_REVISION, KeyRole
from controlplane.schemas.common import ErrorPublic, responses
from controlplane.schemas.health import HealthPublic, ReadyPublic

__all__ = ["router"]

logger = logging.getLogger(__name__)
router = APIRouter(tags=["health"])


def _kind(reason: str) -> str:
    """The error's kind (``OperationalError``), without the driver's message, which can
    name hosts and ports: ``/ready`` answers without a key."""
    return reason.split(":", 1)[0]


HealthGuard = Annotated[Principal, Depends(require(KeyRole.VIEWER, open_setting="open_health"))]


@router.get("/health", responses=responses(401, 403))
async def health(_: HealthGuard) -> HealthPublic:
    return HealthPublic(status="ok")


async def _schema_revision(database: AsyncEngine) -> str | None:
    async with database.connect() as conn:
        try:
            revision = await conn.scalar(sa.text("SELECT version_num FROM alembic_version"))
            return None if revision is None else str(revision)
        except sa.exc.DBAPIError as exc:
            # Reachable but not migrated (no alembic_version table) vs. unreachable.
            if isinstance(exc, sa.exc.OperationalError) and "alembic_version" not in str(exc):
                raise
            return None


@router.get(
    "/ready",
    responses={**responses(401, 403), 503: {"model": ErrorPublic, "description": "Not ready"}},
)
async def ready(
    _: HealthGuard, settings: SettingsDep, database: DatabaseDep, live: LiveRuntimeDep
) -> ReadyPublic:
    dialect = database.dialect.name
    try:
        revision = await asyncio.wait_for(_schema_revision(database), settings.ready_timeout_s)
    except TimeoutError:
        raise UnavailableError(
            f"not ready: database did not answer within {settings.ready_timeout_s} s"
        ) from None
    except sa.exc.DBAPIError as exc:
        # Open to anyone: the kind of failure only, never the driver's text (addresses).
        logger.warning("not ready: database unreachable (%s)", describe_error(exc))
        raise UnavailableError(
            f"not ready: database unreachable ({_kind(describe_error(exc))})"
        ) from None
    if revision != SCHEMA_REVISION:
        raise UnavailableError(
            f"not ready: database schema is at revision {revision!r}, this control plane "
            f"needs {SCHEMA_REVISION!r}; run `goodput db upgrade`"
        )
    try:  # the attempt goes on if the probe gives up waiting (ensure_loaded shields it)
        loaded = await asyncio.wait_for(live.ensure_loaded(), settings.ready_timeout_s)
    except TimeoutError:
        raise UnavailableError(
            f"not ready: the goodput engine is still loading the SLO set "
            f"(more than {settings.ready_timeout_s} s)"
        ) from None
    if not loaded:
        raise UnavailableError(
            "not ready: the goodput engine has not loaded the SLO set "
            f"({_kind(live.load_error or 'unknown')})"
        )
    return ReadyPublic(status="ready", database=dialect, schema_revision=revision)
