"""``GET /metrics``: the app's Prometheus registry in the text (or OpenMetrics) format.

Open when ``open_metrics`` is true (the default, for Prometheus), else ``viewer``. The
registry belongs to the app (``RegistryDep``, never the process-global one):
the goodput engine's collector (``goodput_requests_total``, ``goodput_burn_rate``, …, see
``controlplane.goodput.collector``), ingest counters (``goodput_ingest_*``), the runtime's
rollup counters and the process/platform collectors. Collection runs in a worker thread:
window gauges are computed at scrape time.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client.exposition import choose_encoder
from starlette.concurrency import run_in_threadpool

from controlplane.api.auth import Principal, require
from controlplane.api.deps import RegistryDep
from controlplane.models import KeyRole
from controlplane.schemas.common import responses

__all__ = ["router"]

router = APIRouter(tags=["metrics"])
MetricsGuard = Annotated[Principal, Depends(require(KeyRole.VIEWER, open_setting="open_metrics"))]


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        **responses(401, 403),
        200: {
            "description": "The Prometheus text format, or OpenMetrics if `Accept` asks for it",
            "content": {"text/plain": {}, "application/openmetrics-text": {}},
        },
    },
)
async def metrics(_: MetricsGuard, registry: RegistryDep, request: Request) -> Response:
    """Every metric of the app's registry, encoded as the scraper's ``Accept`` asks."""
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    body = await run_in_threadpool(encoder, registry)
    return Response(body, media_type=content_type)
