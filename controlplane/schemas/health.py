"""Wire models of liveness (``/health``) and readiness (``/ready``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

__all__ = ["HealthPublic", "ReadyPublic"]


class HealthPublic(BaseModel):
    status: Literal["ok"]


class ReadyPublic(BaseModel):
    status: Literal["ready"]
    database: str
    schema_revision: str
