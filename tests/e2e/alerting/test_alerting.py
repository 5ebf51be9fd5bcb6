"""The generated rules in a real Prometheus and Alertmanager, fed by a real control plane.

Once per module: a control plane (``goodput controlplane serve``) on PostgreSQL with three
SLOs, the real :class:`~exporters.transport.ControlPlaneExporter` shipping records to it
(its own counters served for scraping), Prometheus scraping both every second with the rule
file the API serves (``GET /api/v1/prometheus/rules``), Alertmanager routing to a webhook
served by the test. Bad requests for one SLO page through to the webhook with the SLO's
labels and annotations; good traffic resolves it; the other SLOs stay silent. Every panel
query of the SLO and exporter dashboards runs against that Prometheus.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import numpy as np
import pytest
from prometheus_client import CollectorRegistry, start_http_server

from dashboards.panels import DASHBOARDS, dashboard_json, panel_queries
from exporters.records import Labels, RequestRecord, Status, Vantage
from exporters.transport import ControlPlaneExporter
from goodput._demo_processes import ChildProcess, pick_port, run_cli
from goodput.demo_prometheus import INSTALL_HINT, missing_binaries, start_monitoring
from migrations import upgrade
from tests.integration.controlplane.conftest import create_schema, drop_schema, schema_url

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        bool(missing_binaries()), reason=f"{missing_binaries()} not installed; {INSTALL_HINT}"
    ),
]

HOST = "127.0.0.1"
SLOS = """
name: {name}
selector: {{tenant: {name}}}
objectives: [{{metric: ttft, threshold_s: 0.2}}]
target: 0.99
window_s: 2592000
"""
NAMES = ("paging", "calm-a", "calm-b")


class _Webhook(BaseHTTPRequestHandler):
    received: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        type(self).received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


@dataclass
class Stack:
    cp_url: str
    prometheus_url: str
    viewer: dict[str, str]
    exporter: ControlPlaneExporter
    received: list[dict[str, Any]]
    sent: int = 0
    log: list[str] = field(default_factory=list)

    def send(self, tenant: str, count: int, *, bad: bool) -> None:
        now_us = int(time.time() * 1e6)
        for i in range(count):
            offsets = np.array([50_000, 70_000, 90_000], dtype=np.int64)
            self.exporter.export(
                RequestRecord(
                    request_id=f"{tenant}-{self.sent + i}",
                    vantage=Vantage.GATEWAY,
                    arrival_time_ns=(now_us - 100_000) * 1000,
                    labels=Labels(model="m", tenant=tenant),
                    emission_offsets_us=offsets,
                    status=Status.ERROR if bad else Status.OK,
                )
            )
        self.sent += count
        self.exporter.force_flush(timeout_s=5.0)

    def query(self, expr: str) -> dict[str, Any]:
        response = httpx.get(f"{self.prometheus_url}/api/v1/query", params={"query": expr})
        body: dict[str, Any] = response.json()
        return body

    def alerts(self) -> list[dict[str, Any]]:
        return [a for message in self.received for a in message["alerts"]]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    directory = tmp_path_factory.mktemp("alerting")
    schema = create_schema()
    children: list[ChildProcess] = []
    webhook = ThreadingHTTPServer((HOST, 0), type("Hook", (_Webhook,), {"received": []}))
    threading.Thread(target=webhook.serve_forever, daemon=True).start()
    exporter_server = None
    try:
        url = schema_url(schema)
        upgrade(url)
        env = {**os.environ, "GOODPUT_DATABASE_URL": url}
        keys = {
            role: run_cli(env, "admin", "create-key", "--role", role).strip()
            for role in ("ingest", "viewer")
        }
        slo_file = directory / "slos.yaml"
        slo_file.write_text("---".join(SLOS.format(name=n) for n in NAMES))
        run_cli(env, "slo", "apply", "-f", str(slo_file))
        cp_port = pick_port(HOST, 0)
        cp_url = f"http://{HOST}:{cp_port}"
        cp = ChildProcess(
            [
                sys.executable,
                "-m",
                "goodput",
                "controlplane",
                "serve",
                "--no-migrate",
                "--host",
                HOST,
                "--port",
                str(cp_port),
            ],
            env,
            directory / "controlplane.log",
        )
        children.append(cp)
        cp.wait_http(f"{cp_url}/ready", "control plane", timeout_s=90.0)
        viewer = {"Authorization": f"Bearer {keys['viewer']}"}
        rules = directory / "goodput.rules.yaml"
        response = httpx.get(f"{cp_url}/api/v1/prometheus/rules", headers=viewer, timeout=10)
        assert response.status_code == 200, response.text
        rules.write_text(response.text)
        registry = CollectorRegistry()
        exporter = ControlPlaneExporter(cp_url, api_key=keys["ingest"], registry=registry)
        exporter_port = pick_port(HOST, 0)
        exporter_server, _ = start_http_server(exporter_port, addr=HOST, registry=registry)
        targets = {"controlplane": f"{HOST}:{cp_port}", "exporter": f"{HOST}:{exporter_port}"}
        webhook_url = f"http://{HOST}:{webhook.server_address[1]}/"
        with start_monitoring(
            directory / "monitoring", targets=targets, rules=rules, webhook_url=webhook_url
        ) as monitoring:
            received: list[dict[str, Any]] = webhook.RequestHandlerClass.received  # type: ignore[attr-defined]
            yield Stack(cp_url, monitoring.prometheus_url, viewer, exporter, received)
        exporter.shutdown(timeout_s=2.0)
    finally:
        webhook.shutdown()
        if exporter_server is not None:
            exporter_server.shutdown()
        for child in reversed(children):
            child.stop(timeout_s=15.0)
        drop_schema(schema)


def _until(check: Any, what: str, timeout_s: float, tick: Any = None) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        if tick is not None:
            tick()
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        time.sleep(1.0)


def _page(alert: dict[str, Any]) -> bool:
    labels = alert["labels"]
    return labels.get("alertname") == "GoodputErrorBudgetBurn" and labels.get("long") == "1h"


def test_page_reaches_the_webhook_and_resolves(stack: Stack) -> None:
    def traffic(bad: bool) -> None:
        stack.send("paging", 5, bad=bad)
        stack.send("calm-a", 5, bad=False)
        stack.send("calm-b", 5, bad=False)

    firing = _until(
        lambda: [a for a in stack.alerts() if _page(a) and a["status"] == "firing"],
        "the page alert at the webhook",
        timeout_s=120,
        tick=lambda: traffic(bad=True),
    )
    alert = firing[0]
    assert alert["labels"]["slo"] == "paging"
    assert alert["labels"]["severity"] == "page"
    assert alert["labels"]["sli"] == "goodput"
    assert alert["annotations"]["slo_version"] == "1"
    assert alert["annotations"]["objective"] == "ttft <= 0.2 s"
    assert alert["annotations"]["runbook_url"].startswith(f"{stack.cp_url}/api/v1/slos/")

    def good_burst() -> None:
        stack.send("paging", 100, bad=False)

    _until(
        lambda: [a for a in stack.alerts() if _page(a) and a["status"] == "resolved"],
        "the page alert resolved at the webhook",
        timeout_s=120,
        tick=good_burst,
    )
    others = {a["labels"].get("slo") for a in stack.alerts()} - {"paging"}
    assert others == set(), f"alerts for other SLOs: {others}"
    active = httpx.get(f"{stack.prometheus_url}/api/v1/alerts").json()["data"]["alerts"]
    assert {a["labels"].get("slo") for a in active} <= {"paging"}


VARIABLES = {"$__rate_interval": "1m", "$slo": "paging", "$model": ".*"}
# Dashboards whose every query must return series here (the PD fleet and control-loop
# dashboards read the gateway and the engines, which this stack does not run).
LIVE = ("goodput-overview", "goodput-slo", "goodput-exporters")
# Series that exist only once their event happened or where the stack has no such part.
NOT_HERE = (
    "goodput_request_",
    "goodput_gateway_",
    "goodput_output_tokens_total",
    "goodput_exporter_buffer_bytes",
)


def test_every_panel_query_runs(stack: Stack) -> None:
    stack.send("paging", 20, bad=False)
    time.sleep(3.0)
    empty = []
    for spec in DASHBOARDS:
        for title, template in panel_queries(dashboard_json(spec)):
            expr = template
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            body = stack.query(expr)
            assert body["status"] == "success", f"{spec.uid} / {title}: {body}"
            # The SLOs here have a TTFT objective only: no other threshold to draw.
            no_objective = "threshold" in expr and 'metric="ttft"' not in expr
            expected = spec.uid in LIVE and not any(n in expr for n in NOT_HERE)
            if expected and not no_objective and not body["data"]["result"]:
                empty.append(f"{spec.uid} / {title}: {expr}")
    assert empty == []
