"""The generated rules in a real Prometheus and Alertmanager, fed by a real control plane.

Once per module: a control plane (``goodput controlplane serve``) on PostgreSQL with three
SLOs, the real :class:`~exporters.transport.ControlPlaneExporter` shipping records to it
(its own counters served for scraping), a prefill and a decode sim worker (vLLM's metric
names) behind the PD gateway, attached to that control plane (``tests/e2e/sim``'s
``start_pd``), Prometheus scraping all of them every second with the rule file the API
serves (``GET /api/v1/prometheus/rules``), Alertmanager routing to a webhook served by the
test. Bad requests for one SLO page through to the webhook with the SLO's labels and
annotations; good traffic resolves it; the other SLOs stay silent. Every panel query of
every dashboard runs against that Prometheus and returns series, and every metric a panel
names is recorded by the rules or exported by a scraped process.

Sim workers save no KV cache (the prefill side's ``goodput_kv_save_*`` comes from vLLM
workers' stat-logger plugin), and there is no vLLM here: the plugin's own collector
(:class:`~serving.vllm_plugin.kv_transfer.KVTransferCollector`, pure) is served on a target
of its own, fed the ``kv_connector_stats`` dicts a vLLM prefill engine's steps ship.
"""

from __future__ import annotations

import json
import os
import re
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
from serving.vllm_plugin.kv_transfer import KVTransferCollector
from tests.e2e.control.conftest import open_loop
from tests.e2e.sim.conftest import start_pd
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
    gateway_url: str
    targets: dict[str, str]
    rules: str
    sent: int = 0
    log: list[str] = field(default_factory=list)
    kv_saves: KVTransferCollector | None = None

    def save_kv(self, prompts: int) -> None:
        """``prompts`` KV saves, as one step of a vLLM prefill engine ships them."""
        assert self.kv_saves is not None
        seconds = [0.002 + 0.001 * (i % 7) for i in range(prompts)]
        self.kv_saves.observe({"save_seconds": seconds, "save_bytes": [1 << 20] * prompts})

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
    exporter_server = kv_server = None
    try:
        url = schema_url(schema)
        upgrade(url)
        env = {**os.environ, "GOODPUT_DATABASE_URL": url}
        keys = {
            role: run_cli(env, "admin", "create-key", "--role", role).strip()
            for role in ("ingest", "viewer", "agent")
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

        def start(name: str, argv: list[str]) -> ChildProcess:
            child = ChildProcess([sys.executable, "-m", "goodput", *argv], env,
                                 directory / f"{name}.log")  # fmt: skip
            children.append(child)
            return child

        workers, gateway_url, waits = start_pd(
            start, cp_url=cp_url, keys=keys, kv_dir=directory / "kv", gateway_id="e2e-alerting"
        )
        for url, child in waits:
            child.wait_http(url, url, timeout_s=90.0)
        viewer = {"Authorization": f"Bearer {keys['viewer']}"}
        rules = directory / "goodput.rules.yaml"
        response = httpx.get(f"{cp_url}/api/v1/prometheus/rules", headers=viewer, timeout=10)
        assert response.status_code == 200, response.text
        rules.write_text(response.text)
        registry = CollectorRegistry()
        exporter = ControlPlaneExporter(cp_url, api_key=keys["ingest"], registry=registry)
        exporter_port = pick_port(HOST, 0)
        exporter_server, _ = start_http_server(exporter_port, addr=HOST, registry=registry)
        kv_registry = CollectorRegistry()
        kv_saves = KVTransferCollector("m")
        kv_registry.register(kv_saves)
        kv_port = pick_port(HOST, 0)
        kv_server, _ = start_http_server(kv_port, addr=HOST, registry=kv_registry)
        targets = {
            "controlplane": f"{HOST}:{cp_port}",
            "exporter": f"{HOST}:{exporter_port}",
            "vllm-prefill-kv": f"{HOST}:{kv_port}",
        }
        fleet = {"gateway": gateway_url, **workers}
        targets.update((job, url.removeprefix("http://")) for job, url in fleet.items())
        webhook_url = f"http://{HOST}:{webhook.server_address[1]}/"
        with start_monitoring(
            directory / "monitoring", targets=targets, rules=rules, webhook_url=webhook_url
        ) as monitoring:
            received: list[dict[str, Any]] = webhook.RequestHandlerClass.received  # type: ignore[attr-defined]
            yield Stack(
                cp_url, monitoring.prometheus_url, viewer, exporter, received, gateway_url,
                targets, response.text, kv_saves=kv_saves,
            )  # fmt: skip
        exporter.shutdown(timeout_s=2.0)
    finally:
        webhook.shutdown()
        for server in (exporter_server, kv_server):
            if server is not None:
                server.shutdown()
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
METRIC = re.compile(r"\b(?:goodput_[a-z0-9_]+|vllm:[a-z0-9_:]+|slo:[a-z0-9_:]+|sloth_slo_info)\b")
SUFFIXES = ("_bucket", "_count", "_sum", "_total")
# Counters of events this stack does not cause (no shedding, no retried upstream call), and
# the gauges of a planner move's recorded effect (no move here: nothing to report): they must
# still be exported (declared on a scraped /metrics), and may have no series here.
EVENTS = {
    "goodput_gateway_admission_rejections_total",
    "goodput_gateway_retries_total",
    "goodput_planner_move_predicted_goodput_rps",
    "goodput_planner_move_observed_goodput_rps",
}


def _exported(stack: Stack) -> set[str]:
    """Every metric name a scraped process declares (``# TYPE``) or has samples of."""
    names: set[str] = set()
    for address in stack.targets.values():
        text = httpx.get(f"http://{address}/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                names.add(line.split()[2])
            elif line and not line.startswith("#"):
                names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def _declared(name: str, exported: set[str]) -> bool:
    base = next((name[: -len(s)] for s in SUFFIXES if name.endswith(s)), name)
    return bool({name, base, f"{base}_total"} & exported)


def test_every_panel_query_returns_series(stack: Stack) -> None:
    stack.send("paging", 20, bad=False)
    # The admission panels compare predictions made while a policy is in force.
    _until(
        lambda: stack.query('goodput_gateway_admission_mode{mode="policy"} == 1')["data"]["result"],
        "an admission policy in force at the gateway",
        timeout_s=90,
    )
    stack.save_kv(8)  # the prefill side's KV saves, before and after the traffic
    outcomes = open_loop(
        stack.gateway_url,
        rate_rps=4.0,
        duration_s=5.0,
        prompt_tokens=lambda rng: int(rng.integers(64, 256)),
        max_tokens=16,
        headers_of=lambda k: ("default", {}),
        seed=0,
    )
    assert sum(o.status == 200 for o in outcomes) >= 10, outcomes[:3]
    stack.save_kv(8)
    recorded = set(re.findall(r'"record": "([^"]+)"', stack.rules))
    exported = _exported(stack)
    time.sleep(3.0)  # two scrapes and evaluations after the traffic
    dead, unknown = [], []
    for spec in DASHBOARDS:
        for title, template in panel_queries(dashboard_json(spec)):
            expr = template
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            body = stack.query(expr)
            assert body["status"] == "success", f"{spec.uid} / {title}: {body}"
            series = body["data"]["result"]
            if not series and expr.endswith(" > 0"):  # an annotation's event filter
                series = stack.query(expr.removesuffix(" > 0"))["data"]["result"]
            names = set(METRIC.findall(expr))
            unknown += [
                f"{spec.uid} / {title}: {n}"
                for n in sorted(names)
                if n not in recorded and not _declared(n, exported)
            ]
            # The SLOs here have a TTFT objective only: no other threshold to draw.
            no_objective = "threshold" in expr and 'metric="ttft"' not in expr
            if not series and not no_objective and not names & EVENTS:
                dead.append(f"{spec.uid} / {title}: {expr}")
    assert unknown == [], "panels name metrics that nothing exports"
    assert dead == [], "panels without series"
