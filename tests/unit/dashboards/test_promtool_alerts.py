"""``promtool test rules``: synthetic counters drive each burn-rate alert across its
threshold (fires just above, stays silent just below) and back (resolves)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards.rules import render_rules
from tests.unit.dashboards.slos import make_slo

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (make install: Debian package prometheus)"
)

PER_MIN = 1000  # judged requests per minute
# 99 % over 30 d: thresholds 0.144 (1h/5m), 0.06 (6h/30m), 0.03 (1d/2h), 0.01 (3d/6h).
PAIRS = (
    ("page", "1h", "5m", 0.144),
    ("page", "6h", "30m", 0.06),
    ("ticket", "1d", "2h", 0.03),
    ("ticket", "3d", "6h", 0.01),
)
STEADY = {
    "above-page": 0.15,
    "below-page": 0.13,
    "below-fast-ticket": 0.05,
    "below-ticket": 0.02,
    "within-budget": 0.005,
}


def _series(slo: str, bad: str, good: str) -> list[dict[str, str]]:
    metric = 'goodput_requests_total{{slo="{}",result="{}"}}'
    return [
        {"series": metric.format(slo, "bad"), "values": bad},
        {"series": metric.format(slo, "good"), "values": good},
    ]


def _burn(slo: str, pairs: list[tuple[str, str, str, float]]) -> list[dict[str, Any]]:
    sloth = {"sloth_id": f"{slo}-goodput", "sloth_service": slo, "sloth_slo": "goodput"}
    return [
        {
            "exp_labels": {
                "slo": slo,
                "sli": "goodput",
                "severity": s,
                "long": long_w,
                "short": short_w,
                "sloth_window": long_w,
                **sloth,
            }
        }
        for s, long_w, short_w, _ in pairs
    ]


def _burn_test(at: str, exp_alerts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": "GoodputErrorBudgetBurn", "exp_alerts": exp_alerts}


def _steady() -> dict[str, Any]:
    """Each SLO at a constant error ratio for 7 h: every pair whose threshold is below it
    fires, the others stay silent."""
    series: list[dict[str, str]] = []
    expected: list[dict[str, Any]] = []
    minutes = 7 * 60
    for slo, ratio in STEADY.items():
        bad = round(PER_MIN * ratio)
        series += _series(slo, f"0+{bad}x{minutes}", f"0+{PER_MIN - bad}x{minutes}")
        expected += _burn(slo, [p for p in PAIRS if ratio > p[3]])
    return {
        "interval": "1m",
        "input_series": series,
        "alert_rule_test": [_burn_test(f"{minutes}m", expected)],
    }


def _recovery() -> dict[str, Any]:
    """20 % bad for an hour, then all good: the 1h/5m page resolves once the 5m window is
    clean, the 6h/30m page once the 30m window is; the tickets stay."""
    series = _series("recovers", "0+200x60 12000+0x120", "0+800x60 48000+1000x120")
    tests = [
        _burn_test(f"{at}m", _burn("recovers", list(pairs)))
        for at, pairs in ((60, PAIRS), (70, PAIRS[1:]), (100, PAIRS[2:]))
    ]
    return {"interval": "1m", "input_series": series, "alert_rule_test": tests}


def _silence_and_fleet() -> dict[str, Any]:
    """No judged request for 10 minutes after an hour of traffic; an exporter dropping
    records; a gateway on its fallback cap."""
    series = _series("quiet", "0+1x60 _x20", "0+99x60 _x20")
    series += [
        {
            "series": 'goodput_exporter_dropped_records_total{job="gw",instance="a"}',
            "values": "0x10 0+5x20",
        },
        {
            "series": 'goodput_gateway_admission_mode{job="gw",instance="a",mode="fallback"}',
            "values": "0x10 1x20",
        },
    ]
    no_data = {
        "slo": "quiet",
        "sli": "goodput",
        "severity": "ticket",
        "sloth_window": "1h",
        "sloth_id": "quiet-goodput",
        "sloth_service": "quiet",
        "sloth_slo": "goodput",
    }
    fleet = {"job": "gw", "instance": "a", "severity": "ticket"}
    tests = [
        {"eval_time": "62m", "alertname": "GoodputSLONoData", "exp_alerts": []},
        {
            "eval_time": "72m",
            "alertname": "GoodputSLONoData",
            "exp_alerts": [{"exp_labels": no_data}],
        },
        {"eval_time": "9m", "alertname": "GoodputExporterDroppingRecords", "exp_alerts": []},
        {
            "eval_time": "14m",
            "alertname": "GoodputExporterDroppingRecords",
            "exp_alerts": [{"exp_labels": fleet}],
        },
        {"eval_time": "10m", "alertname": "GoodputGatewayAdmissionFallback", "exp_alerts": []},
        {
            "eval_time": "13m",
            "alertname": "GoodputGatewayAdmissionFallback",
            "exp_alerts": [{"exp_labels": fleet}],
        },
    ]
    return {"interval": "1m", "input_series": series, "alert_rule_test": tests}


def _test_file(rules: Path) -> dict[str, Any]:
    return {
        "rule_files": [str(rules)],
        "evaluation_interval": "1m",
        "tests": [_steady(), _recovery(), _silence_and_fleet()],
    }


def test_alerts_fire_at_their_burn_rate_and_resolve(tmp_path: Path) -> None:
    names = [*STEADY, "recovers", "quiet"]
    rules = tmp_path / "rules.yaml"
    document = yaml.safe_load(render_rules([make_slo(n) for n in names], base_url="http://cp:8000"))
    for group in document["groups"]:  # promtool compares annotations too; tested elsewhere
        for rule in group["rules"]:
            rule.pop("annotations", None)
    rules.write_text(yaml.safe_dump(document, sort_keys=False))
    test = tmp_path / "test.yaml"
    test.write_text(yaml.safe_dump(_test_file(rules), sort_keys=False))
    assert PROMTOOL is not None
    result = subprocess.run(
        [PROMTOOL, "test", "rules", str(test)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
