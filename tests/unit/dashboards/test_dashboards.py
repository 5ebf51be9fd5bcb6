"""Generated dashboards: stable uids, SDK round trip, links, variables, and the committed
example output (``python -m dashboards --check``)."""

from __future__ import annotations

import json
import re

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

from controlplane import openslo
from dashboards.__main__ import main as regenerate
from dashboards.export import (
    EXAMPLE_BASE_URL,
    EXAMPLE_DIR,
    EXAMPLE_SLO_FILE,
    example_slos,
    generated_files,
)
from dashboards.panels import DASHBOARDS, dashboard_json, panel_queries
from dashboards.rules import fleet_rule_group, slo_rule_group
from dashboards.shared_rules import shared_rules_document
from tests.unit.dashboards.slos import make_slo

UIDS = [
    "goodput-overview",
    "goodput-slo",
    "goodput-pd-fleet",
    "goodput-control-loops",
    "goodput-exporters",
]


def test_uids_are_stable_and_boards_identical_across_runs() -> None:
    assert [spec.uid for spec in DASHBOARDS] == UIDS
    for spec in DASHBOARDS:
        assert dashboard_json(spec) == dashboard_json(spec)
        assert dashboard_json(spec)["uid"] == spec.uid


def test_round_trip_through_the_sdk_models() -> None:
    for spec in DASHBOARDS:
        data = dashboard_json(spec)
        again = json.loads(json.dumps(Dashboard.from_json(data), cls=JSONEncoder))
        assert again == data, spec.uid


def test_classic_json_shape() -> None:
    for spec in DASHBOARDS:
        data = dashboard_json(spec)
        assert data["schemaVersion"] == 41
        assert data["tags"] == ["goodput"]
        assert data["templating"]["list"][0]["type"] == "datasource"
        link = data["links"][0]
        assert (link["type"], link["tags"], link["keepTime"], link["includeVars"]) == (
            "dashboards",
            ["goodput"],
            True,
            True,
        )
        ids = [p["id"] for p in data["panels"]]
        assert len(ids) == len(set(ids))
        for panel in data["panels"]:
            if panel["type"] != "row":
                assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_recorded_names_a_panel_reads_are_generated() -> None:
    """A panel reading ``slo:…`` or ``goodput:…`` must read a rule this package records, in
    either layout (per SLO, and for all SLOs)."""
    slo = make_slo("x", window_s=28 * 86_400)
    shared = shared_rules_document([slo], base_url="")["groups"]
    for groups in ([slo_rule_group(slo, base_url=""), fleet_rule_group()], shared):
        recorded = {
            rule["record"] for group in groups for rule in group["rules"] if "record" in rule
        }
        _panels_read_only(recorded)


def _panels_read_only(recorded: set[str]) -> None:
    for spec in DASHBOARDS:
        for title, expr in panel_queries(dashboard_json(spec)):
            for name in re.findall(r"\b(?:slo|goodput):[a-z_:0-9]+", expr):
                assert name in recorded, f"{spec.uid} / {title}: {name} is not recorded"


def test_committed_example_is_up_to_date() -> None:
    """``dashboards/generated/`` is what the generator makes for the demo SLO."""
    slos = example_slos(openslo.parse_documents(EXAMPLE_SLO_FILE.read_text()))
    for name, text in generated_files(slos, base_url=EXAMPLE_BASE_URL).items():
        assert (EXAMPLE_DIR / name).read_text() == text, f"stale {name}: run python -m dashboards"
    assert regenerate(["--check"]) == 0
