"""Wire models of the generated Grafana dashboards' list (``/api/v1/dashboards``)."""

from __future__ import annotations

from pydantic import BaseModel

__all__ = ["DashboardSummary", "DashboardsPublic"]


class DashboardSummary(BaseModel):
    uid: str
    title: str
    tags: list[str]


class DashboardsPublic(BaseModel):
    data: list[DashboardSummary]
    count: int
