"""SLOs as the registry publishes them (``SLOPublic``), built without a database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from controlplane.schemas.slo import SLOPublic

EPOCH = datetime(2025, 1, 1, tzinfo=UTC)
TTFT = {"metric": "ttft", "threshold_s": 0.2, "statistic": "max"}


def make_slo(name: str, **fields: Any) -> SLOPublic:
    data: dict[str, Any] = {
        "id": uuid.uuid5(uuid.NAMESPACE_URL, name),
        "name": name,
        "description": "",
        "selector": {},
        "objectives": [TTFT],
        "target": 0.99,
        "window_s": 30 * 86_400,
        "vantage": "gateway",
        "availability_target": None,
        "version": 1,
        "created_at": EPOCH,
        "updated_at": EPOCH,
        "deleted_at": None,
    }
    data.update(fields)
    data["objectives"] = [{"statistic": "max", **o} for o in data["objectives"]]
    return SLOPublic.model_validate(data)
