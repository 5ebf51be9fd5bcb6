"""Grafana dashboards and Prometheus rules generated from the SLO registry (docs/dashboards.md).

The registry is the one source of truth: :mod:`dashboards.rules` turns SLO definitions into
recording and alert rules, :mod:`dashboards.panels` builds the Grafana dashboards (the
Grafana foundation SDK, Grafana 11.6 target), :mod:`dashboards.export` writes both with the
provisioning files into a folder.
"""

from dashboards.rules import (
    RulesError,
    SLORuleSource,
    encode_rules,
    fleet_rule_group,
    render_rules,
    rules_document,
    slo_rule_group,
)

__all__ = [
    "RulesError",
    "SLORuleSource",
    "encode_rules",
    "fleet_rule_group",
    "render_rules",
    "rules_document",
    "slo_rule_group",
]
