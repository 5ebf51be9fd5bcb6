"""Prometheus rules and Grafana dashboards generated from the SLO registry (``dashboards/``).

* ``GET /api/v1/slos/{ref}/prometheus-rules``: one SLO's rule file (YAML, with the fleet
  alerts), self-contained (``dashboards.rules``: one group whose rules name the SLO, its
  target and window written in);
* ``GET /api/v1/prometheus/rules``: the rule file for every live SLO (YAML;
  ``dashboards.shared_rules``: rules computed once for all SLOs, targets, windows and
  metadata read from the control plane's ``goodput_slo_*`` gauges), the one to load;
* ``GET /api/v1/dashboards``: the dashboards (uid, title, tags);
* ``GET /api/v1/dashboards/{uid}``: one dashboard's classic JSON.

All need ``viewer``; a tenant-scoped key gets its tenant's SLOs only (the file for all SLOs
then has the groups of its SLOs' compliance windows, whose rules still cover every SLO whose
series the Prometheus holds). The files change with the registry: an update shows in the
annotations' ``slo_version`` (in the file for all SLOs, through the ``goodput_slo_info``
series it joins), a deleted SLO's rules are gone. An SLO whose alerts cannot fire (a window
under the page alert's hour, or a target too loose for a burn-rate threshold below 100 %
errors) gets a 409 from its own file, naming the SLO, the field and the allowed values (the
request is valid; the stored SLO is what cannot be alerted on); the file for all SLOs names
it in a comment at its top and serves the others (one SLO never takes every alert down).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from controlplane.api.deps import SessionDep, Viewer
from controlplane.api.routes._params import Ref
from controlplane.errors import ConflictError, NotFoundError
from controlplane.schemas.common import responses
from controlplane.schemas.dashboards import DashboardsPublic, DashboardSummary
from controlplane.schemas.slo import SLOPublic
from controlplane.services import slos as slo_service
from dashboards.panels import DASHBOARDS, dashboard_json
from dashboards.rules import RulesError, SLORuleSource, render_rules
from dashboards.shared_rules import render_shared_rules

__all__ = ["router"]

router = APIRouter(tags=["dashboards"])

_PAGE = 1000
_YAML: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A Prometheus rule file (`promtool check rules` accepts it)",
        # The schema describes the parsed document (OpenAPI's reading of a YAML body).
        "content": {
            "application/yaml": {
                "schema": {
                    "type": "object",
                    "required": ["groups"],
                    "properties": {
                        "groups": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["name", "rules"],
                                "properties": {
                                    "name": {"type": "string"},
                                    "interval": {"type": "string"},
                                    "rules": {"type": "array", "items": {"type": "object"}},
                                },
                            },
                        }
                    },
                }
            }
        },
    }
}


def _rules_response(slos: list[SLORuleSource], request: Request, *, shared: bool) -> Response:
    render = render_shared_rules if shared else render_rules
    try:
        text = render(slos, base_url=str(request.base_url))
    except RulesError as exc:
        raise ConflictError(str(exc)) from None
    return Response(text, media_type="application/yaml")


@router.get(
    "/slos/{slo_ref}/prometheus-rules",
    response_class=Response,
    responses={**responses(404, 409), **_YAML},
)
async def slo_rules(
    principal: Viewer, session: SessionDep, slo_ref: Ref, request: Request
) -> Response:
    """The SLO's recording and alert rules, with the fleet alerts, in the per-SLO layout: a
    file for this SLO alone, not to be loaded beside ``/prometheus/rules``, which records
    the same names (docs/dashboards.md)."""
    slo = await slo_service.get_slo(session, slo_ref, tenant=principal.tenant)
    return _rules_response([SLOPublic.model_validate(slo)], request, shared=False)


@router.get("/prometheus/rules", response_class=Response, responses=_YAML)
async def all_rules(principal: Viewer, session: SessionDep, request: Request) -> Response:
    """The rules for every live SLO in one file, computed once for all of them (the one to
    load into Prometheus)."""
    slos: list[SLORuleSource] = []
    while True:
        rows, count = await slo_service.list_slos(
            session,
            slo_service.SLOFilter(),
            limit=_PAGE,
            offset=len(slos),
            scope_tenant=principal.tenant,
        )
        slos.extend(SLOPublic.model_validate(r) for r in rows)
        if not rows or len(slos) >= count:
            break
    return _rules_response(slos, request, shared=True)


@router.get("/dashboards")
async def list_dashboards(principal: Viewer) -> DashboardsPublic:
    """The generated Grafana dashboards (their JSON: ``/dashboards/{uid}``)."""
    data = []
    for spec in DASHBOARDS:
        board = dashboard_json(spec)
        data.append(DashboardSummary(uid=spec.uid, title=board["title"], tags=board["tags"]))
    return DashboardsPublic(data=data, count=len(data))


@router.get("/dashboards/{uid}", responses=responses(404))
async def read_dashboard(principal: Viewer, uid: str) -> dict[str, Any]:
    """One dashboard as classic Grafana JSON (schemaVersion 41), ready for provisioning."""
    for spec in DASHBOARDS:
        if spec.uid == uid:
            return dashboard_json(spec)
    known = [spec.uid for spec in DASHBOARDS]
    raise NotFoundError(f"dashboard with uid {uid!r} not found; known: {known}")
