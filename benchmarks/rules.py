"""Benchmark: Prometheus rules for 1,000 SLOs, generated and evaluated by a real Prometheus.

Two layouts, measured in the same run: the one served for all SLOs
(``dashboards.shared_rules.render_shared_rules``: rules computed once for every SLO, one
group per compliance window) and the per-SLO one (``dashboards.rules.render_rules``: a group
of some 20 rules per SLO, what ``GET /slos/{ref}/prometheus-rules`` serves for one SLO).

1. **Generation**: both files for 1,000 SLOs (28-day window, a TTFT and an ITL p99
   objective, target 0.99), best of 3. Baseline in the same run: the per-SLO file built rule
   by rule (``rules_document`` encoded with ``json``, what ``render_rules`` did before its
   templates); both texts must be equal.
2. **Evaluation**, each file in its own Prometheus (the Debian package, ``make install``;
   started by :func:`goodput.demo_prometheus.start_monitoring`) scraping a static target
   that exposes what the control plane exposes and the rules read, with
   ``GoodputCollector``'s labels: ``goodput_requests_total{slo,vantage,result}`` for every
   SLO (counters growing at 10 good, 0.05 bad, 0.01 rejected and 0.01 aborted requests/s
   per SLO) and the gauges ``goodput_slo_objective_ratio``, ``goodput_slo_window_seconds``
   and ``goodput_slo_info``. Once every SLO's 5-minute ratio is recorded and one more
   evaluation interval has passed, ``rule_eval_s`` is
   ``prometheus_rule_group_last_duration_seconds`` summed over the layout's SLO groups (the
   groups run concurrently: the sum is CPU work per interval, not wall time; the fleet
   group, the same in both, apart), ``rule_eval_max_group_s`` the slowest group. The keys
   without a prefix are the served layout's, ``per_slo_*`` the per-SLO layout's, and
   ``rule_eval_ratio`` the per-SLO layout's ``rule_eval_s`` over the served one's.
3. **Series per SLO**: the recording series Prometheus holds per SLO (``slo:*`` and
   ``sloth_slo_info``), against Sloth's documented rule set for one SLO (8 SLI error
   ratios + 7 metadata rules, one series each); ``exposed_series_per_slo`` is what the
   target exposes per SLO (the series the rules read: 4 counters, 3 gauges).

Prometheus scrapes and evaluates every 30 s; ``prometheus_cpu_s_per_interval`` is its
process CPU time over two intervals, per interval: the work the rules cost, which the sum of
concurrent group durations over-counts when the groups wait for a busy CPU.
``promtool check rules`` runs on the generated file. Run from the repo root:
``python benchmarks/rules.py [--quick]`` (``--quick``: 100 SLOs, 2 s interval). The last line
of output is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from prometheus_client import CollectorRegistry, start_http_server  # noqa: E402
from prometheus_client.metrics_core import (  # noqa: E402
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector  # noqa: E402

from controlplane.schemas.slo import SLOPublic  # noqa: E402
from dashboards.rules import encode_rules, objective_text, render_rules, rules_document  # noqa: E402
from dashboards.shared_rules import render_shared_rules  # noqa: E402
from goodput.demo_prometheus import INSTALL_HINT, missing_binaries, start_monitoring  # noqa: E402

HOST = "127.0.0.1"
BASE_URL = "http://goodput:8000"
WINDOW_S = 28 * 86_400
# Sloth's rule set for one SLO (sloth.dev, "Prometheus rules"): the SLI error ratio over
# 5m, 30m, 1h, 2h, 6h, 1d, 3d and the SLO period, and 7 metadata rules; one series each.
SLOTH_RULES = (
    *(f"slo:sli_error:ratio_rate{w}" for w in ("5m", "30m", "1h", "2h", "6h", "1d", "3d", "28d")),
    "slo:objective:ratio",
    "slo:error_budget:ratio",
    "slo:time_period:days",
    "slo:current_burn_rate:ratio",
    "slo:period_burn_rate:ratio",
    "slo:period_error_budget_remaining:ratio",
    "sloth_slo_info",
)
RATES = (("good", 10.0), ("bad", 0.05), ("rejected", 0.01), ("aborted", 0.01))


def make_slos(count: int) -> list[SLOPublic]:
    epoch = datetime(2025, 1, 1, tzinfo=UTC)
    return [
        SLOPublic.model_validate(
            {
                "id": uuid.uuid5(uuid.NAMESPACE_URL, f"slo-{i:04d}"),
                "name": f"slo-{i:04d}",
                "description": "",
                "selector": {"tenant": f"tenant-{i}"},
                "objectives": [
                    {"metric": "ttft", "threshold_s": 0.2, "statistic": "max"},
                    {"metric": "itl", "threshold_s": 0.05, "statistic": "p99"},
                ],
                "target": 0.99,
                "window_s": WINDOW_S,
                "vantage": "gateway",
                "availability_target": None,
                "version": 1,
                "created_at": epoch,
                "updated_at": epoch,
                "deleted_at": None,
            }
        )
        for i in range(count)
    ]


def best_of(runs: int, fn: object) -> tuple[float, str]:
    assert callable(fn)
    best, text = float("inf"), ""
    for _ in range(runs):
        start = time.perf_counter()
        text = fn()
        best = min(best, time.perf_counter() - start)
    return best, text


class StaticTarget(Collector):
    """``goodput_requests_total{slo,vantage,result}`` for every SLO, growing with time, and
    each SLO's target, window and info gauges."""

    def __init__(self, slos: list[SLOPublic]) -> None:
        self._slos = slos
        self._start = time.monotonic()

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        elapsed = time.monotonic() - self._start
        family = CounterMetricFamily(
            "goodput_requests",
            "Requests finished per SLO by result.",
            labels=["slo", "vantage", "result"],
        )
        target = GaugeMetricFamily("goodput_slo_objective_ratio", "Target.", labels=["slo", "sli"])
        window = GaugeMetricFamily("goodput_slo_window_seconds", "Window.", labels=["slo"])
        info = GaugeMetricFamily(
            "goodput_slo_info",
            "Info.",
            labels=["slo", "slo_id", "slo_version", "objective", "vantage"],
        )
        for slo in self._slos:
            for result, rate in RATES:
                family.add_metric([slo.name, "gateway", result], 1000.0 + rate * elapsed)
            target.add_metric([slo.name, "goodput"], slo.target)
            window.add_metric([slo.name], slo.window_s)
            labels = [slo.name, str(slo.id), str(slo.version), objective_text(slo), "gateway"]
            info.add_metric(labels, 1.0)
        yield from (family, target, window, info)


def promtool_ok(path: Path) -> bool:
    promtool = shutil.which("promtool")
    if promtool is None:
        return False
    done = subprocess.run(
        [promtool, "check", "rules", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        print(done.stdout[-2000:] + done.stderr[-2000:], file=sys.stderr)
    return done.returncode == 0


def query(prometheus_url: str, expr: str) -> list[dict[str, object]]:
    response = httpx.get(f"{prometheus_url}/api/v1/query", params={"query": expr}, timeout=30)
    response.raise_for_status()
    result: list[dict[str, object]] = response.json()["data"]["result"]
    return result


def scalar(prometheus_url: str, expr: str) -> float:
    result = query(prometheus_url, expr)
    if not result:
        return 0.0
    value = result[0]["value"]
    assert isinstance(value, list)
    return float(value[1])


def group_durations(prometheus_url: str) -> dict[str, float]:
    """``prometheus_rule_group_last_duration_seconds`` by group name, from Prometheus's own
    ``/metrics`` (label ``rule_group="<file>;<group>"``)."""
    text = httpx.get(f"{prometheus_url}/metrics", timeout=30).text
    out = {}
    for line in text.splitlines():
        if line.startswith("prometheus_rule_group_last_duration_seconds{"):
            labels, value = line.rsplit(" ", 1)
            group = labels.split('rule_group="', 1)[1].split('"', 1)[0].split(";", 1)[1]
            out[group] = float(value)
    return out


def process_cpu_s(prometheus_url: str) -> float:
    text = httpx.get(f"{prometheus_url}/metrics", timeout=30).text
    line = next(x for x in text.splitlines() if x.startswith("process_cpu_seconds_total "))
    return float(line.split()[1])


def evaluate(
    slos: list[SLOPublic], rules: Path, interval_s: float, work: Path, *, groups: int | None
) -> dict[str, float]:
    """One layout's figures; ``groups`` is how many SLO groups it has (``None``: one per
    SLO, the per-SLO layout, whose groups are named ``goodput-slo-<name>``)."""
    registry = CollectorRegistry()
    registry.register(StaticTarget(slos))
    server, thread = start_http_server(0, addr=HOST, registry=registry)
    port = server.server_address[1]
    try:
        with start_monitoring(
            work / "monitoring",
            targets={"controlplane": f"{HOST}:{port}"},
            rules=rules,
            interval_s=interval_s,
        ) as monitoring:
            url = monitoring.prometheus_url
            deadline = time.monotonic() + max(120.0, 40 * interval_s)
            expected = len(slos)
            while scalar(url, "count(slo:sli_error:ratio_rate5m)") < expected:
                if time.monotonic() > deadline:
                    raise SystemExit("Prometheus recorded no 5m ratio for every SLO in time")
                time.sleep(interval_s / 2)
            time.sleep(interval_s)  # one more full evaluation with every series there
            cpu_start, wall_start = process_cpu_s(url), time.monotonic()
            time.sleep(2 * interval_s)
            intervals = (time.monotonic() - wall_start) / interval_s
            cpu_s = (process_cpu_s(url) - cpu_start) / intervals
            durations = group_durations(url)
            prefix = "goodput-slo-" if groups is None else "goodput-slos"
            slo_groups = [v for g, v in durations.items() if g.startswith(prefix)]
            want = expected if groups is None else groups
            if len(slo_groups) != want:
                raise SystemExit(f"{len(slo_groups)} SLO groups evaluated, expected {want}")
            recorded = scalar(url, 'count({__name__=~"slo:.+|sloth_slo_info",sloth_service!=""})')
            read = "goodput_requests_total|goodput_slo_(objective_ratio|window_seconds|info)"
            exposed = scalar(url, f'count({{__name__=~"{read}"}})')
            missed = scalar(url, "sum(prometheus_rule_group_iterations_missed_total)")
            return {
                "rule_eval_s": sum(slo_groups),
                "rule_eval_max_group_s": max(slo_groups),
                "rule_eval_fleet_s": durations.get("goodput-fleet", 0.0),
                "prometheus_cpu_s_per_interval": cpu_s,
                "series_per_slo": recorded / expected,
                "exposed_series_per_slo": exposed / expected,
                "missed_iterations": missed,
            }
    finally:
        server.shutdown()
        thread.join(timeout=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="100 SLOs, 2 s interval")
    args = parser.parse_args()
    count, interval_s = (100, 2.0) if args.quick else (1000, 30.0)
    slos = make_slos(count)
    generate_s, text = best_of(3, lambda: render_shared_rules(slos, base_url=BASE_URL))
    per_slo_s, per_slo = best_of(3, lambda: render_rules(slos, base_url=BASE_URL))
    baseline_s, baseline = best_of(3, lambda: encode_rules(rules_document(slos, base_url=BASE_URL)))
    if per_slo != baseline:
        raise SystemExit("render_rules differs from the rule-by-rule encoding")
    print(f"generated {len(text) / 1e3:.1f} kB for {count} SLOs in {generate_s:.3f} s; per-SLO "
          f"layout {len(per_slo) / 1e6:.1f} MB in {per_slo_s:.3f} s (rule by rule: "
          f"{baseline_s:.3f} s)")  # fmt: skip
    result: dict[str, object] = {
        "slos": count,
        "generate_s": round(generate_s, 4),
        "per_slo_generate_s": round(per_slo_s, 4),
        "per_slo_generate_rule_by_rule_s": round(baseline_s, 4),
        "rules_bytes": len(text),
        "per_slo_rules_bytes": len(per_slo),
        "sloth_series_per_slo": len(SLOTH_RULES),
        "eval_interval_s": interval_s,
    }
    with tempfile.TemporaryDirectory(prefix="goodput-rules-bench-") as tmp:
        work = Path(tmp)
        layouts = (("", text, 1 + len({s.window_s for s in slos})), ("per_slo_", per_slo, None))
        missing = missing_binaries()
        for prefix, rule_text, groups in layouts:
            rules = work / f"{prefix}goodput.rules.yaml"
            rules.write_text(rule_text, encoding="utf-8")
            result[f"{prefix}promtool_ok"] = promtool_ok(rules)
            if missing:
                continue
            measured = evaluate(slos, rules, interval_s, work / f"{prefix}run", groups=groups)
            result.update({f"{prefix}{k}": round(v, 4) for k, v in measured.items()})
        if missing:
            print(f"{missing} not installed ({INSTALL_HINT}): no rule evaluation", file=sys.stderr)
        else:
            ratio = float(result["per_slo_rule_eval_s"]) / float(result["rule_eval_s"])  # type: ignore[arg-type]
            result["rule_eval_ratio"] = round(ratio, 1)
    for key in ("generate_s", "series_per_slo", "rule_eval_s", "per_slo_rule_eval_s"):
        print(f"{key}: {result.get(key)}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
