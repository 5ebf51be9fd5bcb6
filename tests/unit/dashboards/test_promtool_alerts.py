"""``promtool test rules`` on the layout served for all SLOs (``dashboards.shared_rules``):
synthetic counters, with the control plane's per-SLO gauges (target, window, info), drive
each burn-rate alert across its threshold (fires just above, stays silent just below) and
back (resolves); the annotations template the joined info labels."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dashboards.shared_rules import render_shared_rules
from tests.unit.dashboards.slos import make_slo

BASE = "http://cp:8000"

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


def _info(slo: str) -> dict[str, str]:
    return {
        "slo_id": str(make_slo(slo).id),
        "slo_version": "1",
        "objective": "ttft <= 0.2 s",
    }


def _series(slo: str, bad: str, good: str, minutes: int) -> list[dict[str, str]]:
    """The SLO's counters, and its gauges over ``minutes`` (30 d window, target 0.99)."""
    metric = 'goodput_requests_total{{slo="{}",result="{}"}}'
    info = ",".join(f'{k}="{v}"' for k, v in {**_info(slo), "vantage": "gateway"}.items())
    return [
        {"series": metric.format(slo, "bad"), "values": bad},
        {"series": metric.format(slo, "good"), "values": good},
        {
            "series": f'goodput_slo_objective_ratio{{slo="{slo}",sli="goodput"}}',
            "values": f"0.99x{minutes}",
        },
        {"series": f'goodput_slo_window_seconds{{slo="{slo}"}}', "values": f"2592000x{minutes}"},
        {"series": f'goodput_slo_info{{slo="{slo}",{info}}}', "values": f"1x{minutes}"},
    ]


# The share of the error budget each long window may spend (the SRE workbook's).
BUDGET_SHARE = {"1h": "2%", "6h": "5%", "1d": "10%", "3d": "10%"}


def _burn(
    slo: str, pairs: list[tuple[str, str, str, float]], ratio: float | None = None
) -> list[dict[str, Any]]:
    """The alerts expected for ``pairs``; with ``ratio`` (the steady error ratio), their
    annotations too."""
    sloth = {"sloth_id": f"{slo}-goodput", "sloth_service": slo, "sloth_slo": "goodput"}
    out = []
    for s, long_w, short_w, threshold in pairs:
        alert: dict[str, Any] = {
            "exp_labels": {
                "slo": slo,
                "sli": "goodput",
                "severity": s,
                "long": long_w,
                "short": short_w,
                "sloth_window": long_w,
                "slo_window": "30d",
                **sloth,
                **_info(slo),
            }
        }
        if ratio is not None:
            factor = format(threshold / 0.01, ".4g")
            alert["exp_annotations"] = {
                "slo_version": "1",
                "objective": "ttft <= 0.2 s",
                "runbook_url": f"{BASE}/api/v1/slos/{_info(slo)['slo_id']}/goodput?window=1h",
                "summary": f"SLO {slo} (goodput) spent over {BUDGET_SHARE[long_w]} of its "
                f"error budget in the last {long_w} (burn rate over {factor}; {short_w} "
                "confirms)",
                "description": f"SLO {slo} v1 (goodput) over a 30d window. Error ratio over "
                f"{long_w}: {format(ratio * 100, '.4g')}%, above {factor}x its error budget.",
            }
        out.append(alert)
    return out


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
        series += _series(slo, f"0+{bad}x{minutes}", f"0+{PER_MIN - bad}x{minutes}", minutes)
        expected += _burn(slo, [p for p in PAIRS if ratio > p[3]], ratio)
    return {
        "interval": "1m",
        "input_series": series,
        "alert_rule_test": [_burn_test(f"{minutes}m", expected)],
    }


def _recovery() -> dict[str, Any]:
    """20 % bad for an hour, then all good: the 1h/5m page resolves once the 5m window is
    clean, the 6h/30m page once the 30m window is; the tickets stay."""
    series = _series("recovers", "0+200x60 12000+0x120", "0+800x60 48000+1000x120", 180)
    tests = [
        _burn_test(f"{at}m", _burn("recovers", list(pairs)))
        for at, pairs in ((60, PAIRS), (70, PAIRS[1:]), (100, PAIRS[2:]))
    ]
    return {"interval": "1m", "input_series": series, "alert_rule_test": tests}


def _silence_and_fleet() -> dict[str, Any]:
    """No judged request for 10 minutes after an hour of traffic; an exporter dropping
    records; a gateway on its fallback cap."""
    series = _series("quiet", "0+1x60 _x20", "0+99x60 _x20", 80)
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
        **_info("quiet"),
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
    sloth = {"slo": "quiet", "sli": "goodput", "sloth_id": "quiet-goodput"}
    sloth |= {"sloth_service": "quiet", "sloth_slo": "goodput"}
    recorded: list[dict[str, Any]] = [
        {
            "expr": expr,
            "eval_time": "30m",
            "exp_samples": [{"labels": f"{name}{{{_labels(labels)}}}", "value": value}],
        }
        for expr, name, labels, value in (
            ("slo:objective:ratio", "slo:objective:ratio", sloth, 0.99),
            ("slo:time_period:days", "slo:time_period:days", sloth, 30),
            ("sloth_slo_info", "sloth_slo_info", {**sloth, "sloth_mode": "goodput"}, 1),
            ("slo:current_burn_rate:ratio > 0.99", "", sloth, None),
            ("slo:period_error_budget_remaining:ratio < 0.01", "", _period(sloth), None),
        )
    ]
    for test in recorded:  # a comparison's value: whatever it is (float rounding)
        if test["exp_samples"][0]["value"] is None:
            test["expr"] = f"({test['expr']}) * 0"
            test["exp_samples"][0]["value"] = 0
    return {
        "interval": "1m",
        "input_series": series,
        "alert_rule_test": tests,
        "promql_expr_test": recorded,
    }


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


def _period(labels: dict[str, str]) -> dict[str, str]:
    return {**labels, "slo_window": "30d"}


def _promtool_test(tmp_path: Path, name: str, document: dict[str, Any], test: Any) -> str:
    rules = tmp_path / f"{name}.rules.yaml"
    rules.write_text(yaml.safe_dump(document, sort_keys=False))
    path = tmp_path / f"{name}.test.yaml"
    tests = {"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": test}
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    assert PROMTOOL is not None
    result = subprocess.run(
        [PROMTOOL, "test", "rules", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return "" if result.returncode == 0 else result.stdout + result.stderr


def test_alerts_fire_at_their_burn_rate_and_resolve(tmp_path: Path) -> None:
    """With their templated annotations at a steady ratio; the recovery and silence tests,
    whose ``$value`` moves, without annotations."""
    names = [*STEADY, "recovers", "quiet"]
    document = yaml.safe_load(render_shared_rules([make_slo(n) for n in names], base_url=BASE))
    failures = _promtool_test(tmp_path, "annotated", document, [_steady()])
    for group in document["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    failures += _promtool_test(tmp_path, "plain", document, [_recovery(), _silence_and_fleet()])
    assert not failures, failures
