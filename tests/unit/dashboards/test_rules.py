"""Generated rules: names, factors, refusals, and ``promtool check rules`` on every SLO shape."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dashboards._windows import ALERT_WINDOWS, duration
from dashboards.rules import (
    RulesError,
    encode_rules,
    render_rules,
    rules_document,
    slo_rule_group,
)
from tests.unit.dashboards.slos import make_slo

BASE = "http://cp.example:8000"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (make install: Debian package prometheus)"
)

OBJECTIVES = {
    "ttft": [{"metric": "ttft", "threshold_s": 0.2}],
    "tpot": [{"metric": "tpot", "threshold_s": 0.05}],
    "itl": [{"metric": "itl", "threshold_s": 0.05}],
    "itl_p99": [{"metric": "itl", "threshold_s": 0.05, "statistic": "p99"}],
    "itl_p99.9": [{"metric": "itl", "threshold_s": 0.08, "statistic": "p99.9"}],
    "e2el": [{"metric": "e2el", "threshold_s": 30.0}],
    "several": [
        {"metric": "ttft", "threshold_s": 0.2},
        {"metric": "itl", "threshold_s": 0.05, "statistic": "p99"},
        {"metric": "tpot", "threshold_s": 0.04},
        {"metric": "e2el", "threshold_s": 20.0},
    ],
    "none": [],
}
# Window lengths the API accepts (60 s … 366 d), each with a target its alerts can express.
WINDOWS = {
    3_600: 0.99,
    3 * 3_600: 0.99,
    86_400: 0.99,
    7 * 86_400: 0.99,
    28 * 86_400: 0.99,
    30 * 86_400: 0.99,
    90 * 86_400: 0.999,
    366 * 86_400: 0.9999,
    2_419_321: 0.995,  # not a whole number of minutes
}


def _shapes() -> list[object]:
    slos = [
        make_slo(f"obj-{key.replace('.', '-')}", objectives=objectives)
        for key, objectives in OBJECTIVES.items()
    ]
    slos += [
        make_slo(f"win-{window}", window_s=window, target=target)
        for window, target in WINDOWS.items()
    ]
    slos.append(make_slo("avail", availability_target=0.999, vantage="engine"))
    return slos


def _rules(group: dict[str, object]) -> list[dict[str, object]]:
    rules = group["rules"]
    assert isinstance(rules, list)
    return rules


def test_sloth_names_and_labels() -> None:
    group = slo_rule_group(make_slo("chat", window_s=28 * 86_400), base_url=BASE)
    assert group["name"] == "goodput-slo-chat"
    records = [r["record"] for r in _rules(group) if "record" in r]
    assert records == [
        *(f"slo:sli_error:ratio_rate{w}" for w in ("5m", "30m", "1h", "2h", "6h", "1d", "3d")),
        "slo:sli_error:ratio_rate28d",
        "slo:objective:ratio",
        "slo:error_budget:ratio",
        "slo:time_period:days",
        "slo:current_burn_rate:ratio",
        "slo:period_burn_rate:ratio",
        "slo:period_error_budget_remaining:ratio",
        "sloth_slo_info",
    ]
    first = _rules(group)[0]
    assert first["expr"] == (
        'sum(rate(goodput_requests_total{slo="chat",result="bad"}[5m])) / '
        'sum(rate(goodput_requests_total{slo="chat",result=~"good|bad"}[5m]))'
    )
    assert first["labels"] == {
        "slo": "chat",
        "sli": "goodput",
        "sloth_id": "chat-goodput",
        "sloth_service": "chat",
        "sloth_slo": "goodput",
        "sloth_window": "5m",
    }


def test_factors_scale_with_the_compliance_window() -> None:
    """30 d gives the workbook's 14.4, 6, 3, 1; 28 d scales them by 28/30."""
    for window_s, factors in ((30 * 86_400, (14.4, 6, 3, 1)), (28 * 86_400, (13.44, 5.6, 2.8))):
        for alert, factor in zip(ALERT_WINDOWS, factors, strict=False):
            assert alert.factor(window_s) == pytest.approx(factor)
    group = slo_rule_group(make_slo("chat"), base_url=BASE)
    alerts = [r for r in _rules(group) if r.get("alert") == "GoodputErrorBudgetBurn"]
    assert [
        (a["labels"]["severity"], a["labels"]["long"], a["labels"]["short"]) for a in alerts
    ] == [  # type: ignore[index]
        ("page", "1h", "5m"),
        ("page", "6h", "30m"),
        ("ticket", "1d", "2h"),
        ("ticket", "3d", "6h"),
    ]
    assert alerts[0]["expr"] == (
        'slo:sli_error:ratio_rate1h{sloth_id="chat-goodput"} > 0.144 and ignoring (sloth_window) '
        'slo:sli_error:ratio_rate5m{sloth_id="chat-goodput"} > 0.144'
    )


def test_annotations_name_the_slo_version_objective_and_runbook() -> None:
    slo = make_slo("chat", version=7)
    alert = next(r for r in _rules(slo_rule_group(slo, base_url=BASE)) if "alert" in r)
    annotations = alert["annotations"]
    assert annotations["slo_version"] == "7"  # type: ignore[index]
    assert annotations["objective"] == "ttft <= 0.2 s"  # type: ignore[index]
    assert annotations["runbook_url"] == f"{BASE}/api/v1/slos/{slo.id}/goodput?window=1h"  # type: ignore[index]


def test_alert_pairs_longer_than_the_window_are_left_out() -> None:
    group = slo_rule_group(make_slo("hourly", window_s=3_600), base_url=BASE)
    alerts = [
        r["labels"]["long"] for r in _rules(group) if r.get("alert") == "GoodputErrorBudgetBurn"
    ]  # type: ignore[index]
    assert alerts == ["1h"]


def test_window_shorter_than_the_page_alert_is_refused() -> None:
    with pytest.raises(RulesError) as caught:
        slo_rule_group(make_slo("short", window_s=1_800), base_url=BASE)
    assert str(caught.value) == (
        "slo 'short': window_s must be >= 3600 for burn-rate alerts (the page alert's long "
        "window is 1h), got 1800"
    )


def test_target_whose_page_alert_cannot_fire_is_refused() -> None:
    """90 % over 30 d: the page alert would need an error ratio of 1.44."""
    with pytest.raises(RulesError) as caught:
        slo_rule_group(make_slo("loose", target=0.9), base_url=BASE)
    message = str(caught.value)
    assert message.startswith("slo 'loose': target 0.9 with window_s 2592000 cannot be alerted")
    assert "error ratio of 1.44" in message
    assert "allowed: target > 0.9305555556 for this window, or a shorter window_s" in message
    with pytest.raises(RulesError, match=r"availability_target 0\.5 with window_s"):
        slo_rule_group(make_slo("avail", availability_target=0.5), base_url=BASE)


def test_availability_target_adds_an_sli() -> None:
    group = slo_rule_group(make_slo("chat", availability_target=0.999), base_url=BASE)
    slis = {r["labels"]["sli"] for r in _rules(group) if "labels" in r}  # type: ignore[index]
    assert slis == {"goodput", "availability"}


def test_document_is_sorted_and_starts_with_the_fleet_group() -> None:
    doc = rules_document([make_slo("b"), make_slo("a")], base_url=BASE)
    assert [g["name"] for g in doc["groups"]] == ["goodput-fleet", "goodput-slo-a", "goodput-slo-b"]


def test_duration() -> None:
    assert [duration(s) for s in (60, 90, 3_600, 86_400, 2_419_200)] == [
        "1m",
        "90s",
        "1h",
        "1d",
        "28d",
    ]


@needs_promtool
def test_promtool_checks_every_shape(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(render_rules(_shapes(), base_url=BASE))  # type: ignore[arg-type]
    result = subprocess.run(
        [PROMTOOL, "check", "rules", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    groups = yaml.safe_load(path.read_text())["groups"]
    assert len(groups) == 1 + len(_shapes())


@pytest.mark.parametrize("base_url", [BASE, 'http://cp.example:8000/"q\\\n'])
def test_rendered_text_is_the_encoded_document(base_url: str) -> None:
    """The precompiled templates give what encoding every rule gives, escapes included."""
    slos = _shapes()
    assert render_rules(slos, base_url=base_url) == encode_rules(  # type: ignore[arg-type]
        rules_document(slos, base_url=base_url)  # type: ignore[arg-type]
    )


def test_render_refuses_an_inexpressible_slo() -> None:
    with pytest.raises(RulesError, match="slo 'loose'"):
        render_rules([make_slo("fine"), make_slo("loose", target=0.9)], base_url=BASE)
