"""The demo's Prometheus hook: its alert lines, and the demo without the binaries."""

from __future__ import annotations

from pathlib import Path

import pytest

from goodput import demo_prometheus
from goodput.demo_prometheus import INSTALL_HINT, alert_line, demo_monitoring


def test_alert_line_names_the_alert_its_slo_and_windows() -> None:
    alert = {
        "status": "firing",
        "labels": {
            "alertname": "GoodputErrorBudgetBurn",
            "slo": "demo-chat",
            "sli": "goodput",
            "severity": "page",
            "long": "1h",
            "short": "5m",
        },
        "annotations": {"summary": "SLO demo-chat (goodput) burns its error budget"},
    }
    assert alert_line(alert) == (
        "alert firing: GoodputErrorBudgetBurn slo=demo-chat sli=goodput severity=page "
        "long=1h short=5m: SLO demo-chat (goodput) burns its error budget"
    )
    assert alert_line({"status": "resolved", "labels": {"alertname": "X"}}) == "alert resolved: X"


def test_without_the_binaries_the_demo_says_how_to_get_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(demo_prometheus, "missing_binaries", lambda: ["prometheus"])
    said: list[str] = []
    with demo_monitoring(
        tmp_path,
        control_plane_url="http://127.0.0.1:9",
        viewer_key="key",
        targets={"controlplane": "127.0.0.1:9"},
        say=said.append,
    ) as monitoring:
        assert monitoring is None
    assert said == [
        f"goodput demo: no Prometheus or Alertmanager (prometheus not found); {INSTALL_HINT}"
    ]
    assert list(tmp_path.iterdir()) == []
