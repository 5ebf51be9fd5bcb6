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
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from goodput._demo_processes import ChildProcess, pick_port

__all__ = ["ALERTMANAGER_BINARY", "Monitoring", "missing_binaries", "start_monitoring"]

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
