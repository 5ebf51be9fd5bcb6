"""Query and path parameter types shared by the routers (bounded, so a request can never
reach the database with an absurd value)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import Path, Query
from pydantic import AfterValidator, BeforeValidator

__all__ = ["FilterText", "Limit", "Offset", "Ref", "Timestamp"]


def _aware(value: datetime) -> datetime:
    """``value`` in UTC: a time zone is required, and the instant must exist in UTC (the
    database compares in UTC; ``0001-01-01T00:00:00+14:00`` is before year 1 there)."""
    if value.tzinfo is None:
        raise ValueError("must have a time zone, e.g. 2026-01-31T12:00:00Z")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError(
            "must lie between 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z once in UTC"
        ) from None


def _iso_8601(value: object) -> object:
    # pydantic would also read "1700000000" as a Unix time; the schema promises date-time.
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value)
        except ValueError:
            raise ValueError("must be an ISO 8601 date-time, e.g. 2026-01-31T12:00:00Z") from None
    return value


Limit = Annotated[int, Query(ge=1, le=500, description="page size")]
Offset = Annotated[int, Query(ge=0, le=1_000_000, description="rows to skip")]
FilterText = Annotated[str, Query(min_length=1, max_length=200, pattern=r"^[^\x00]*$")]
Timestamp = Annotated[datetime, BeforeValidator(_iso_8601), AfterValidator(_aware)]
Ref = Annotated[
    str,
    Path(
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="the SLO's id (UUID) or its name",
    ),
]
