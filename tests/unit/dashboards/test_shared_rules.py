"""The rules for all SLOs (``dashboards.shared_rules``): groups per compliance window, constant
factors, Sloth's names, refusals, and ``promtool check rules`` on every SLO shape."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards.rules import RulesError, render_rules
from dashboards.shared_rules import render_shared_rules, shared_rules_document, unalertable
from tests.unit.dashboards.slos import make_slo
from tests.unit.dashboards.test_rules import BASE, PROMTOOL, _shapes, needs_promtool


def _groups(*slos: Any) -> dict[str, list[dict[str, Any]]]:
    document = shared_rules_document(slos, base_url=BASE)
    return {g["name"]: g["rules"] for g in document["groups"]}


def test_one_group_per_compliance_window_whatever_the_number_of_slos() -> None:
    few = _groups(make_slo("a"), make_slo("b", window_s=28 * 86_400))
    many = _groups(*(make_slo(f"s{i}", window_s=(28 + i % 2 * 2) * 86_400) for i in range(50)))
    assert list(few) == list(many) == ["goodput-fleet", "goodput-slos", "goodput-slos-28d",
                                       "goodput-slos-30d"]  # fmt: skip
    assert few == many  # the rules name no SLO


def test_sloth_names_and_no_slo_written_in() -> None:
    groups = _groups(make_slo("chat", window_s=28 * 86_400, availability_target=0.999))
    records = [r["record"] for r in groups["goodput-slos"] if "record" in r]
    windows = ("5m", "30m", "1h", "2h", "6h", "1d", "3d")
    assert records == [
        *(f"slo:sli_error:ratio_rate{w}" for w in windows),  # goodput
        *(f"slo:sli_error:ratio_rate{w}" for w in windows),  # availability
        "slo:objective:ratio",
        "slo:error_budget:ratio",
        "slo:time_period:days",
        "slo:current_burn_rate:ratio",
        "slo:period_error_budget_remaining:ratio",
        "sloth_slo_info",
    ]
    period = [r.get("record") for r in groups["goodput-slos-28d"]]
    assert period[:3] == [
        "slo:sli_error:ratio_rate28d",
        "slo:sli_error:ratio_rate28d",
        "slo:period_burn_rate:ratio",
    ]
    first = groups["goodput-slos"][0]
    assert first["labels"] == {"sli": "goodput", "sloth_slo": "goodput", "sloth_window": "5m"}
    assert 'sum by (slo) (rate(goodput_requests_total{result="bad"}[5m]))' in first["expr"]
    assert "chat" not in yaml.safe_dump(groups)


def test_factors_are_constants_of_the_window_group() -> None:
    groups = _groups(make_slo("month"), make_slo("hourly", window_s=3_600))
    burns = {
        name: [r for r in rules if r.get("alert") == "GoodputErrorBudgetBurn"]
        for name, rules in groups.items()
    }
    assert [(a["labels"]["long"], a["labels"]["short"]) for a in burns["goodput-slos-1h"]] == [
        ("1h", "5m")
    ]
    assert "(0.02 * slo:error_budget:ratio)" in burns["goodput-slos-1h"][0]["expr"]
    month = burns["goodput-slos-30d"]
    assert [a["labels"]["severity"] for a in month] == ["page", "page", "ticket", "ticket"]
    for alert, factor in zip(month, ("14.4", "6", "3", "1"), strict=True):
        assert f"({factor} * slo:error_budget:ratio)" in alert["expr"]
        assert "max by (slo) (goodput_slo_window_seconds) == 2592000" in alert["expr"]
        assert "group_left (slo_id, slo_version, objective)" in alert["expr"]
        assert alert["labels"]["slo_window"] == "30d"
    annotations = month[0]["annotations"]
    assert annotations["slo_version"] == "{{ $labels.slo_version }}"
    assert annotations["runbook_url"] == (
        f"{BASE}/api/v1/slos/{{{{ $labels.slo_id }}}}/goodput?window=1h"
    )


def test_an_slo_that_cannot_be_paged_on_is_named_and_keeps_the_others_file() -> None:
    text = render_shared_rules(
        [make_slo("fine"), make_slo("loose", target=0.9), make_slo("short", window_s=1_800)],
        base_url=BASE,
    )
    head = text.splitlines()[:4]
    assert head[1].startswith("# not alerted on: slo 'loose': target 0.9 with window_s")
    assert head[2].startswith("# not alerted on: slo 'short': window_s must be >= 3600")
    assert head[3] == "groups:"
    names = [g["name"] for g in yaml.safe_load(text)["groups"]]
    assert names == ["goodput-fleet", "goodput-slos", "goodput-slos-30m", "goodput-slos-30d"]
    assert unalertable([make_slo("fine")]) == []
    with pytest.raises(RulesError, match="slo 'loose'"):  # the per-SLO file refuses it
        render_rules([make_slo("loose", target=0.9)], base_url=BASE)


def test_no_slo_leaves_the_fleet_group() -> None:
    assert list(_groups()) == ["goodput-fleet"]


@needs_promtool
def test_promtool_checks_every_shape(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(render_shared_rules(_shapes(), base_url=BASE))  # type: ignore[arg-type]
    assert PROMTOOL is not None
    result = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
