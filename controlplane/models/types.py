"""Column types shared by the tables."""

from __future__ import annotations

from sqlalchemy import JSON
from sqlalchemy.dialects.postgresql import JSONB

__all__ = ["JSONDoc"]

# JSONB on PostgreSQL (compact, indexable), JSON text on SQLite.
JSONDoc = JSON().with_variant(JSONB(), "postgresql")
