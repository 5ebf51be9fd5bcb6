"""Prometheus and Alertmanager as child processes on loopback, with generated configs.

The Debian packages ``prometheus`` and ``prometheus-alertmanager`` (``make install``) give
the binaries ``prometheus`` and ``prometheus-alertmanager``. :func:`start_monitoring` writes a
Prometheus config (scrape targets, the rule file, the Alertmanager) and an Alertmanager config
(one webhook receiver, or none) under ``directory``, starts both on free ports with their
data there, and waits until both answer; :meth:`Monitoring.stop` stops them.

Example::

    with start_monitoring(tmp, targets={"controlplane": "127.0.0.1:8000"},
                          rules=rule_file, webhook_url="http://127.0.0.1:9999/") as mon:
        print(mon.prometheus_url, mon.alertmanager_url)

:func:`demo_monitoring` is what ``goodput demo`` uses: where the binaries are installed, the
rules from the control plane's API, both processes, and a webhook receiver that prints each
alert as it fires and resolves; where they are not, one line saying how to get them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from goodput._demo_processes import ChildProcess, DemoError, pick_port

__all__ = [
    "ALERTMANAGER_BINARY",
    "INSTALL_HINT",
    "Monitoring",
    "alert_line",
    "demo_monitoring",
    "missing_binaries",
    "start_monitoring",
]

HOST = "127.0.0.1"
PROMETHEUS_BINARY = "prometheus"
ALERTMANAGER_BINARY = "prometheus-alertmanager"
INSTALL_HINT = (
    "install them with `make install` (Debian packages prometheus and "
    "prometheus-alertmanager: sudo apt-get install -y prometheus prometheus-alertmanager)"
)


def missing_binaries() -> list[str]:
    """The binaries of the two that are not on PATH."""
    return [b for b in (PROMETHEUS_BINARY, ALERTMANAGER_BINARY) if shutil.which(b) is None]


@dataclass
class Monitoring:
    prometheus_url: str
    alertmanager_url: str
    children: list[ChildProcess]

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop(timeout_s=10.0)


def _prometheus_config(
    targets: Mapping[str, str], rules: Path, alertmanager: str, interval_s: float
) -> dict[str, object]:
    interval = f"{interval_s:g}s"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(rules)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [address]}]}
            for job, address in targets.items()
        ],
    }


def _alertmanager_config(webhook_url: str | None) -> dict[str, object]:
    receiver: dict[str, object] = {"name": "goodput"}
    if webhook_url is not None:
        receiver["webhook_configs"] = [{"url": webhook_url, "send_resolved": True}]
    return {
        "route": {
            "receiver": "goodput",
            "group_by": ["alertname", "slo", "severity"],
            "group_wait": "1s",
            "group_interval": "1s",
            "repeat_interval": "1h",
        },
        "receivers": [receiver],
    }


@contextlib.contextmanager
def start_monitoring(
    directory: Path,
    *,
    targets: Mapping[str, str],
    rules: Path,
    webhook_url: str | None = None,
    interval_s: float = 1.0,
    ready_timeout_s: float = 60.0,
) -> Iterator[Monitoring]:
    """Prometheus scraping ``targets`` (job name → ``host:port``) every ``interval_s`` with
    ``rules``, and an Alertmanager it sends to; both stopped on exit."""
    directory.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    am_port, am_cluster_port, prom_port = (pick_port(HOST, 0) for _ in range(3))
    am_config = directory / "alertmanager.yml"
    am_config.write_text(yaml.safe_dump(_alertmanager_config(webhook_url), sort_keys=False))
    prom_config = directory / "prometheus.yml"
    prom_config.write_text(
        yaml.safe_dump(
            _prometheus_config(targets, rules, f"{HOST}:{am_port}", interval_s), sort_keys=False
        )
    )
    children: list[ChildProcess] = []
    monitoring = Monitoring(f"http://{HOST}:{prom_port}", f"http://{HOST}:{am_port}", children)
    try:
        alertmanager = ChildProcess(
            [
                ALERTMANAGER_BINARY,
                f"--config.file={am_config}",
                f"--storage.path={directory / 'alertmanager-data'}",
                f"--web.listen-address={HOST}:{am_port}",
                f"--cluster.listen-address={HOST}:{am_cluster_port}",
            ],
            env,
            directory / "alertmanager.log",
        )
        children.append(alertmanager)
        prometheus = ChildProcess(
            [
                PROMETHEUS_BINARY,
                f"--config.file={prom_config}",
                f"--storage.tsdb.path={directory / 'prometheus-data'}",
                f"--web.listen-address={HOST}:{prom_port}",
                "--web.enable-lifecycle",
            ],
            env,
            directory / "prometheus.log",
        )
        children.append(prometheus)
        alertmanager.wait_http(
            f"{monitoring.alertmanager_url}/-/ready", "alertmanager", timeout_s=ready_timeout_s
        )
        prometheus.wait_http(
            f"{monitoring.prometheus_url}/-/ready", "prometheus", timeout_s=ready_timeout_s
        )
        yield monitoring
    finally:
        monitoring.stop()


def alert_line(alert: Mapping[str, object]) -> str:
    """One line for an alert of an Alertmanager webhook message."""
    labels = alert.get("labels") or {}
    annotations = alert.get("annotations") or {}
    assert isinstance(labels, dict) and isinstance(annotations, dict)
    where = " ".join(
        f"{key}={labels[key]}"
        for key in ("slo", "sli", "severity", "long", "short", "instance")
        if key in labels
    )
    head = " ".join(p for p in (str(labels.get("alertname", "?")), where) if p)
    summary = annotations.get("summary")
    return f"alert {alert.get('status', '?')}: {head}" + (f": {summary}" if summary else "")


def _alert_receiver(say: Callable[[str], None]) -> ThreadingHTTPServer:
    """A webhook receiver on loopback that says each alert once per status change."""
    seen: set[tuple[str, str]] = set()
    lock = threading.Lock()

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            self.send_response(200)
            self.end_headers()
            try:
                alerts = json.loads(body).get("alerts", [])
            except ValueError:
                return
            for alert in alerts:
                key = (str(alert.get("fingerprint")), str(alert.get("status")))
                with lock:
                    if key in seen:
                        continue
                    seen.add(key)
                say(f"goodput demo: {alert_line(alert)}")

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer((HOST, 0), Receiver)
    threading.Thread(target=server.serve_forever, name="goodput-demo-alerts", daemon=True).start()
    return server


@contextlib.contextmanager
def demo_monitoring(
    directory: Path,
    *,
    control_plane_url: str,
    viewer_key: str,
    targets: Mapping[str, str],
    say: Callable[[str], None],
    interval_s: float = 5.0,
) -> Iterator[Monitoring | None]:
    """Prometheus and Alertmanager for a demo run, or ``None`` (and a line saying how to get
    them) where they are not installed or do not start: the demo runs either way.

    Prometheus loads the control plane's rule file (``GET /api/v1/prometheus/rules``) and
    scrapes ``targets`` (job → ``host:port``) every ``interval_s``; each alert that fires
    or resolves is said as it reaches the webhook receiver served here."""
    import httpx

    missing = missing_binaries()
    if missing:
        say(f"goodput demo: no Prometheus or Alertmanager ({', '.join(missing)} not found); "
            f"{INSTALL_HINT}")  # fmt: skip
        yield None
        return
    try:
        response = httpx.get(
            f"{control_plane_url}/api/v1/prometheus/rules",
            headers={"Authorization": f"Bearer {viewer_key}"},
            timeout=30.0,
        )
    except httpx.HTTPError as exc:
        say(f"goodput demo: no Prometheus: reading the rules failed ({exc})")
        yield None
        return
    if response.status_code != 200:
        say(f"goodput demo: no Prometheus: the rules answered HTTP {response.status_code}")
        yield None
        return
    directory.mkdir(parents=True, exist_ok=True)
    rules = directory / "goodput.rules.yaml"
    rules.write_text(response.text, encoding="utf-8")
    receiver = _alert_receiver(say)
    webhook_url = f"http://{HOST}:{receiver.server_address[1]}/"
    try:
        with contextlib.ExitStack() as stack:
            try:
                monitoring = stack.enter_context(
                    start_monitoring(
                        directory, targets=targets, rules=rules, webhook_url=webhook_url,
                        interval_s=interval_s,
                    )
                )  # fmt: skip
            except DemoError as exc:
                say(f"goodput demo: Prometheus or Alertmanager did not start: {exc}")
                monitoring = None
            if monitoring is not None:
                say(f"Prometheus: {monitoring.prometheus_url}/alerts (rules {rules}; scrapes "
                    f"{', '.join(targets)} every {interval_s:g} s)")  # fmt: skip
                say(f"Alertmanager: {monitoring.alertmanager_url} (alerts are printed here too)")
            yield monitoring
    finally:
        receiver.shutdown()
        receiver.server_close()
