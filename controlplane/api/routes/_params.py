"""Query and path parameter types shared by the routers (bounded, so a request can never
reach the database with an absurd value)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

__all__ = ["FilterText", "Limit", "Offset", "Ref"]

Limit = Annotated[int, Query(ge=1, le=500, description="page size")]
Offset = Annotated[int, Query(ge=0, le=1_000_000, description="rows to skip")]
FilterText = Annotated[str, Query(min_length=1, max_length=200, pattern=r"^[^\x00]*$")]
Ref = Annotated[
    str,
    Path(
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        description="the SLO's id (UUID) or its name",
    ),
]
