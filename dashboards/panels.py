"""Grafana dashboards, built with the Grafana foundation SDK (Grafana 11.6 target).

Five dashboards, each tagged ``goodput`` with a stable ``uid``, the Prometheus datasource as
the ``datasource`` variable, and links to the others that keep the time range and variables:

* ``goodput-overview``: per SLO, goodput vs throughput, attainment vs target, burn rate at
  5m/1h/6h, error budget left over the compliance window, availability; RPS and TPS.
* ``goodput-slo``: one SLO (variable ``slo``): TTFT/ITL/TPOT/E2EL percentiles per vantage
  with the objective's threshold drawn, per-objective pass share, budget burn-down,
  rejected requests by priority class.
* ``goodput-pd-fleet``: instances by role and state, queue depth, KV-cache use, KV handed
  over between pools (tokens by source, bytes/s, transfer time; the prefill side's save
  bytes/s and save time), vLLM's own ``vllm:*``
  latency panels, role and policy changes, commands and planner moves as annotations.
* ``goodput-control-loops``: admission (admitted vs shed by class and reason, mode, policy
  version, predicted vs observed TTFT), commands by kind and state, the planner's moves and
  its predicted vs observed goodput, and the gateway's upstream calls and retries.
* ``goodput-exporters``: records delivered, retried, dropped and rejected per exporter;
  ingest rate; ingest batches by outcome.

The SLO panels read the recording rules of :mod:`dashboards.rules`, so Prometheus must load
them. :func:`panel_queries` lists every PromQL expression (for checks against a live
Prometheus); :func:`dashboard_json` gives the classic dashboard JSON (schemaVersion 41).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as gm

__all__ = ["DASHBOARDS", "DashboardSpec", "dashboard_json", "panel_queries"]

DS = gm.DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
SLO_SELECTOR = 'slo=~"$slo"'
# The control plane's per-SLO counter (the gateway's goodput_requests_total has no `result`).
JUDGED = 'result=~"good|bad"'
ALL_RESULTS = 'result=~"good|bad|aborted|rejected"'
PERCENTILES = (0.5, 0.9, 0.99)
LATENCIES = (("ttft", "TTFT"), ("itl", "ITL"), ("tpot", "TPOT"), ("e2el", "E2EL"))

Target = tuple[str, str]  # (expr, legend)


def _query(expr: str, legend: str, ref: int) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + ref))


def _series(
    title: str,
    targets: list[Target],
    *,
    unit: str = "short",
    description: str = "",
    span: int = 12,
    min_val: float | None = None,
    bars: bool = False,
) -> timeseries.Panel:
    panel = (
        timeseries.Panel()
        .title(title)
        .datasource(DS)
        .unit(unit)
        .span(span)
        .height(8)
        .line_width(1)
        .fill_opacity(5)
    )
    if bars:
        panel = panel.draw_style(common.GraphDrawStyle.BARS).fill_opacity(80)
    if description:
        panel = panel.description(description)
    if min_val is not None:
        panel = panel.min(min_val)
    for ref, (expr, legend) in enumerate(targets):
        panel = panel.with_target(_query(expr, legend, ref))
    return panel


def _stat(title: str, expr: str, legend: str, *, unit: str, span: int = 6) -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .datasource(DS)
        .unit(unit)
        .span(span)
        .height(4)
        .with_target(_query(expr, legend, 0).instant())
    )


def _datasource_variable() -> gd.DatasourceVariable:
    return gd.DatasourceVariable("datasource").label("Data source").type("prometheus")


def _query_variable(name: str, query: str, *, multi: bool, label: str) -> gd.QueryVariable:
    variable = (
        gd.QueryVariable(name)
        .label(label)
        .datasource(DS)
        .query(query)
        .refresh(gm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(gm.VariableSort.ALPHABETICAL_ASC)
    )
    if multi:
        variable = variable.multi(True).include_all(True).all_value(".*")
    return variable


def _slo_variable(*, multi: bool) -> gd.QueryVariable:
    return _query_variable(
        "slo", "label_values(slo:objective:ratio, slo)", multi=multi, label="SLO"
    )


def _base(uid: str, title: str, description: str) -> gd.Dashboard:
    return (
        gd.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["goodput"])
        .editable()
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .tooltip(gm.DashboardCursorSync.CROSSHAIR)
        .with_variable(_datasource_variable())
        .link(
            gd.DashboardLink("Goodput")
            .type(gm.DashboardLinkType.DASHBOARDS)
            .tags(["goodput"])
            .as_dropdown(True)
            .keep_time(True)
            .include_vars(True)
        )
    )


# -- Goodput overview ----------------------------------------------------------------------


def _overview() -> gd.Dashboard:
    s = SLO_SELECTOR
    goodput_sli = f'{s},sli="goodput"'
    board = _base(
        "goodput-overview",
        "Goodput overview",
        "Per SLO: goodput vs throughput, attainment vs target, burn rates, error budget, "
        "availability. Generated from the SLO registry (docs/dashboards.md).",
    ).with_variable(_slo_variable(multi=True))
    board = board.with_row(gd.Row("SLOs"))
    board = board.with_panel(
        _series(
            "Goodput vs throughput (requests/s)",
            [
                (
                    f'sum by (slo) (rate(goodput_requests_total{{{s},result="good"}}[{RATE}]))',
                    "{{slo}} goodput",
                ),
                (
                    f"sum by (slo) (rate(goodput_requests_total{{{s},{JUDGED}}}[{RATE}]))",
                    "{{slo}} judged",
                ),
            ],
            unit="reqps",
            description="Good requests/s against judged (good + bad) requests/s.",
        )
    )
    board = board.with_panel(
        _series(
            "Attainment vs target (5m)",
            [
                (f"1 - slo:sli_error:ratio_rate5m{{{goodput_sli}}}", "{{slo}} attainment"),
                (f"slo:objective:ratio{{{goodput_sli}}}", "{{slo}} target"),
            ],
            unit="percentunit",
        )
    )
    board = board.with_panel(
        _series(
            "Burn rate (5m, 1h, 6h)",
            [
                (
                    f"slo:sli_error:ratio_rate{w}{{{goodput_sli}}} / ignoring (sloth_window) "
                    f"slo:error_budget:ratio{{{goodput_sli}}}",
                    f"{{{{slo}}}} {w}",
                )
                for w in ("5m", "1h", "6h")
            ],
            unit="x",
            description="Error ratio / error budget: 1 spends the budget exactly over the "
            "compliance window.",
        )
    )
    board = board.with_panel(
        _series(
            "Error budget remaining (compliance window)",
            [(f"slo:period_error_budget_remaining:ratio{{{goodput_sli}}}", "{{slo}}")],
            unit="percentunit",
        )
    )
    board = board.with_panel(
        _series(
            "Availability: admitted / (admitted + rejected)",
            [
                (
                    "sum by (slo) (rate(goodput_requests_total"
                    f'{{{s},result=~"good|bad|aborted"}}[{RATE}])) / sum by (slo) '
                    f"(rate(goodput_requests_total{{{s},{ALL_RESULTS}}}[{RATE}]))",
                    "{{slo}}",
                )
            ],
            unit="percentunit",
        )
    )
    board = board.with_row(gd.Row("Traffic"))
    board = board.with_panel(
        _series(
            "Requests per second by SLO and result",
            [
                (
                    f"sum by (slo, result) (rate(goodput_requests_total{{{s},{ALL_RESULTS}}}"
                    f"[{RATE}]))",
                    "{{slo}} {{result}}",
                )
            ],
            unit="reqps",
        )
    )
    return board.with_panel(
        _series(
            "Output tokens per second by model and vantage",
            [
                (
                    f"sum by (model, vantage) (rate(goodput_output_tokens_total[{RATE}]))",
                    "{{model}} {{vantage}}",
                )
            ],
            unit="short",
        )
    )


# -- SLO detail ----------------------------------------------------------------------------


def _latency_panel(metric: str, label: str) -> timeseries.Panel:
    targets: list[Target] = [
        (
            f"histogram_quantile({q}, sum by (le, vantage) (rate(goodput_request_{metric}_"
            f'seconds_bucket{{model=~"$model"}}[{RATE}])))',
            f"p{q * 100:g} {{{{vantage}}}}",
        )
        for q in PERCENTILES
    ]
    targets.append(
        (
            f"histogram_quantile(0.99, sum by (le) (rate(goodput_{metric}_seconds_bucket"
            f'{{slo="$slo"}}[{RATE}])))',
            "p99 judged by the SLO",
        )
    )
    targets.append(
        (
            f'goodput_slo_threshold_seconds{{slo="$slo",metric="{metric}"}}',
            "threshold {{objective}}",
        )
    )
    return _series(
        f"{label} percentiles",
        targets,
        unit="s",
        span=12,
        description=f"{label} of successful requests per vantage (exporter histograms, "
        "models of the variable), the SLO's own histogram, and the SLO's threshold.",
    )


def _slo_detail() -> gd.Dashboard:
    one = 'slo="$slo"'
    board = (
        _base(
            "goodput-slo",
            "Goodput SLO detail",
            "One SLO: latency percentiles per vantage with the thresholds, per-objective pass "
            "share, error budget burn-down, rejected requests.",
        )
        .with_variable(_slo_variable(multi=False))
        .with_variable(
            _query_variable(
                "model",
                "label_values(goodput_request_ttft_seconds_count, model)",
                multi=True,
                label="Model",
            )
        )
    )
    board = board.with_row(gd.Row("Objectives"))
    board = board.with_panel(
        _stat(
            "Error budget remaining",
            f'slo:period_error_budget_remaining:ratio{{{one},sli="goodput"}}',
            "{{slo}}",
            unit="percentunit",
        )
    )
    board = board.with_panel(
        _stat(
            "Burn rate (5m)",
            f'slo:current_burn_rate:ratio{{{one},sli="goodput"}}',
            "{{slo}}",
            unit="x",
        )
    )
    board = board.with_panel(
        _stat(
            "Target", f'slo:objective:ratio{{{one},sli="goodput"}}', "{{slo}}", unit="percentunit"
        )
    )
    board = board.with_panel(
        _stat(
            "Compliance window (days)",
            f'slo:time_period:days{{{one},sli="goodput"}}',
            "{{slo}}",
            unit="d",
        )
    )
    board = board.with_panel(
        _series(
            "Attainment vs target",
            [
                (f'1 - slo:sli_error:ratio_rate5m{{{one},sli="goodput"}}', "attainment 5m"),
                (f'1 - slo:sli_error:ratio_rate1h{{{one},sli="goodput"}}', "attainment 1h"),
                (f'slo:objective:ratio{{{one},sli="goodput"}}', "target"),
            ],
            unit="percentunit",
        )
    )
    board = board.with_panel(
        _series(
            "Pass share per objective",
            [
                (
                    f"1 - sum by (objective) (rate(goodput_slo_violations_total{{{one}}}"
                    f"[{RATE}])) / ignoring (objective) group_left sum(rate("
                    f"goodput_requests_total{{{one},{JUDGED}}}[{RATE}]))",
                    "{{objective}}",
                )
            ],
            unit="percentunit",
        )
    )
    board = board.with_panel(
        _series(
            "Error budget burn-down (compliance window)",
            [(f"slo:period_error_budget_remaining:ratio{{{one}}}", "{{sli}}")],
            unit="percentunit",
        )
    )
    board = board.with_panel(
        _series(
            "Rejected requests",
            [
                (
                    f'sum(rate(goodput_requests_total{{{one},result="rejected"}}[{RATE}]))',
                    "rejected (this SLO)",
                ),
                (
                    "sum by (priority, reason) (rate(goodput_gateway_admission_rejections_total"
                    f"[{RATE}]))",
                    "gateways: {{priority}} ({{reason}})",
                ),
            ],
            unit="reqps",
            description="Rejections counted against this SLO, and every gateway's admission "
            "rejections by priority class and reason.",
        )
    )
    board = board.with_row(gd.Row("Latency"))
    for metric, label in LATENCIES:
        board = board.with_panel(_latency_panel(metric, label))
    return board


# -- PD fleet ------------------------------------------------------------------------------


def _pd_fleet() -> gd.Dashboard:
    board = _base(
        "goodput-pd-fleet",
        "Goodput PD fleet",
        "Prefill and decode pools as the gateways see them, the engines' queues and KV "
        "caches, and vLLM's own metrics.",
    )
    board = board.annotation(
        gd.AnnotationQuery()
        .name("Pool changes")
        .datasource(DS)
        .enable(True)
        .icon_color("orange")
        .expr('changes(sum by (role) (goodput_gateway_instances{state="eligible"})[5m:]) > 0')
    )
    board = board.annotation(
        gd.AnnotationQuery()
        .name("Admission policy applied")
        .datasource(DS)
        .enable(True)
        .icon_color("blue")
        .expr("changes(goodput_gateway_admission_policy_version[5m]) > 0")
    )
    board = board.annotation(
        gd.AnnotationQuery()
        .name("Commands issued")
        .datasource(DS)
        .enable(True)
        .icon_color("purple")
        .expr('sum by (kind) (increase(goodput_commands_total{state="pending"}[5m])) > 0')
    )
    board = board.annotation(
        gd.AnnotationQuery()
        .name("Planner moves")
        .datasource(DS)
        .enable(True)
        .icon_color("red")
        .expr("sum by (to_role) (increase(goodput_planner_moves_total[5m])) > 0")
    )
    board = board.with_row(gd.Row("Pools"))
    board = board.with_panel(
        _series(
            "Instances by role and state",
            [("sum by (role, state) (goodput_gateway_instances)", "{{role}} {{state}}")],
        )
    )
    board = board.with_panel(
        _series(
            "Queue depth",
            [
                ("sum by (instance) (vllm:num_requests_waiting)", "waiting {{instance}}"),
                ("sum by (instance) (vllm:num_requests_running)", "running {{instance}}"),
            ],
        )
    )
    board = board.with_panel(
        _series("KV-cache use", [("vllm:kv_cache_usage_perc", "{{instance}}")], unit="percentunit")
    )
    board = board.with_panel(
        _series(
            "Prompt tokens by KV source",
            [
                (
                    f"sum by (instance, source) (rate(vllm:prompt_tokens_by_source_total[{RATE}]))",
                    "{{instance}} {{source}}",
                )
            ],
            description="external_kv_transfer: tokens whose KV cache came from the other "
            "pool (the PD handoff).",
        )
    )
    board = board.with_row(gd.Row("KV transfer"))
    board = board.with_panel(
        _series(
            "KV transfer bytes per second",
            [
                (
                    f"sum by (instance, model) (rate(goodput_kv_transfer_bytes_total[{RATE}]))",
                    "{{instance}} {{model}}",
                )
            ],
            unit="Bps",
            description="KV-cache bytes the decode instances received from the prefill "
            "pool (sim workers: the engine records' kv_bytes; vLLM workers: the KV "
            "connector's loads, through the stat-logger plugin).",
        )
    )
    board = board.with_panel(
        _series(
            "KV transfer time",
            [
                (
                    f"histogram_quantile({q}, sum by (le, model) "
                    f"(rate(goodput_kv_transfer_seconds_bucket[{RATE}])))",
                    f"p{q * 100:g} {{{{model}}}}",
                )
                for q in (0.5, 0.99)
            ],
            unit="s",
            description="Sim workers: from a decode leg's arrival until its prompt's KV "
            "cache is in place (the engine records' hand-off phases). vLLM workers: the KV "
            "connector's load of the prompt's layers (docs/serving.md).",
        )
    )
    board = board.with_panel(
        _series(
            "KV save bytes per second",
            [
                (
                    f"sum by (instance, model) (rate(goodput_kv_save_bytes_total[{RATE}]))",
                    "{{instance}} {{model}}",
                )
            ],
            unit="Bps",
            description="The sender's side of the hand-off: KV-cache bytes the prefill "
            "instances wrote and published for the decode pool to load (vLLM workers: the KV "
            "connector's saves, through the stat-logger plugin; sim workers export none).",
        )
    )
    board = board.with_panel(
        _series(
            "KV save time",
            [
                (
                    f"histogram_quantile({q}, sum by (le, model) "
                    f"(rate(goodput_kv_save_seconds_bucket[{RATE}])))",
                    f"p{q * 100:g} {{{{model}}}}",
                )
                for q in (0.5, 0.99)
            ],
            unit="s",
            description="vLLM workers: the time to write a prompt's KV cache (the layer "
            "writes during the forward pass) and publish it (the rename), per prompt saved.",
        )
    )
    board = board.with_row(gd.Row("vLLM"))
    for name, title in (
        ("vllm:time_to_first_token_seconds", "vLLM TTFT p99"),
        ("vllm:inter_token_latency_seconds", "vLLM ITL p99"),
        ("vllm:e2e_request_latency_seconds", "vLLM E2E latency p99"),
    ):
        board = board.with_panel(
            _series(
                title,
                [
                    (
                        f"histogram_quantile(0.99, sum by (le, instance) (rate({name}_bucket"
                        f"[{RATE}])))",
                        "{{instance}}",
                    )
                ],
                unit="s",
            )
        )
    return board.with_panel(
        _series(
            "vLLM tokens per second",
            [
                (
                    f"sum by (instance) (rate(vllm:generation_tokens_total[{RATE}]))",
                    "generated {{instance}}",
                ),
                (
                    f"sum by (instance) (rate(vllm:prompt_tokens_total[{RATE}]))",
                    "prompt {{instance}}",
                ),
            ],
        )
    )


# -- Control loops -------------------------------------------------------------------------


def _control_loops() -> gd.Dashboard:
    board = _base(
        "goodput-control-loops",
        "Goodput control loops",
        "Admission at the gateways: admitted vs shed by class, the policy each gateway "
        "applies and its mode; the commands the control plane issues; the PD planner's "
        "moves and predictions.",
    )
    board = board.with_row(gd.Row("Admission"))
    board = board.with_panel(
        _series(
            "Admitted vs shed",
            [
                (
                    f'sum(rate(goodput_requests_total{{{ALL_RESULTS},result!="rejected"}}'
                    f"[{RATE}]))",
                    "admitted",
                ),
                (
                    f"sum by (priority) (rate(goodput_gateway_admission_rejections_total[{RATE}]))",
                    "shed {{priority}}",
                ),
            ],
            unit="reqps",
        )
    )
    board = board.with_panel(
        _series(
            "Shed by class and reason",
            [
                (
                    "sum by (priority, reason) (rate(goodput_gateway_admission_rejections_total"
                    f"[{RATE}]))",
                    "{{priority}} {{reason}}",
                )
            ],
            unit="reqps",
        )
    )
    board = board.with_panel(
        _series(
            "Admission mode",
            [("goodput_gateway_admission_mode == 1", "{{instance}} {{mode}}")],
            description="allow_all: no policy yet; policy: within its TTL; fallback: "
            "the policy expired (the control plane did not renew it).",
        )
    )
    board = board.with_panel(
        _series("Policy version", [("goodput_gateway_admission_policy_version", "{{instance}}")])
    )
    board = board.with_panel(
        _series(
            "Admission: predicted vs observed TTFT",
            [
                (
                    f"histogram_quantile({q}, sum by (le, kind) "
                    f"(rate(goodput_gateway_admission_ttft_seconds_bucket[{RATE}])))",
                    f"p{q * 100:g} {{{{kind}}}}",
                )
                for q in (0.5, 0.99)
            ],
            unit="s",
            description="The TTFT admission predicted for each admitted request (prefill queue, "
            "prefill, KV hand-off) and the TTFT the gateway measured for the same requests "
            "(those that finished with a token), while a policy was in force.",
        )
    )
    board = board.with_row(gd.Row("Commands"))
    board = board.with_panel(
        _series(
            "Commands by kind and state",
            [
                (
                    f"sum by (kind, state) (increase(goodput_commands_total[{RATE}]))",
                    "{{kind}} {{state}}",
                )
            ],
            bars=True,
            description="Commands that entered each state: pending = issued (by an operator, "
            "the admission loop or a planner move), delivered (re-deliveries too), acked, "
            "failed, expired.",
        )
    )
    board = board.with_row(gd.Row("Planner"))
    board = board.with_panel(
        _series(
            "Planner moves",
            [
                (
                    f"sum by (to_role) (increase(goodput_planner_moves_total[{RATE}]))",
                    "to {{to_role}}",
                )
            ],
            bars=True,
            description="Role moves the PD planner started, by the pool the instance moves to.",
        )
    )
    board = board.with_panel(
        _series(
            "Planner: predicted vs observed goodput",
            [
                ("goodput_planner_predicted_goodput_rps", "predicted {{split}}"),
                (
                    f'max(sum by (slo) (rate(goodput_requests_total{{result="good"}}[{RATE}])))',
                    "observed (busiest SLO)",
                ),
                (
                    "goodput_planner_move_predicted_goodput_rps",
                    "last move to {{to_role}}: predicted",
                ),
                (
                    "goodput_planner_move_observed_goodput_rps",
                    "last move to {{to_role}}: observed",
                ),
            ],
            unit="reqps",
            description="The planner's last prediction for the current split, the split it "
            "moves toward and the best split, against the good requests/s of the busiest SLO. "
            "Per move: the goodput the last planner move to each pool was predicted to reach "
            "and the goodput observed once its effect was recorded (planner_observe_after_s "
            "after it was done; absent until a move's effect is recorded).",
        )
    )
    board = board.with_row(gd.Row("Gateway"))
    board = board.with_panel(
        _series(
            "In flight",
            [
                ("goodput_gateway_in_flight_requests", "{{instance}} all"),
                ("goodput_gateway_admission_in_flight_requests", "{{instance}} admitted"),
            ],
        )
    )
    return board.with_panel(
        _series(
            "Upstream calls and retries by pool",
            [
                (
                    "sum by (pool, outcome) "
                    f"(rate(goodput_gateway_upstream_requests_total[{RATE}]))",
                    "{{pool}} {{outcome}}",
                ),
                (
                    f"sum by (pool) (rate(goodput_gateway_retries_total[{RATE}]))",
                    "{{pool}} retried",
                ),
            ],
            unit="reqps",
        )
    )


# -- Exporter health -----------------------------------------------------------------------


def _exporters() -> gd.Dashboard:
    board = _base(
        "goodput-exporters",
        "Goodput exporter health",
        "Records delivered, retried, dropped and rejected per exporter; what the control "
        "plane ingests and refuses.",
    )
    board = board.with_row(gd.Row("Exporters"))
    board = board.with_panel(
        _series(
            "Records per second by exporter",
            [
                (
                    f"sum by (job, instance) (rate(goodput_exporter_{name}_total[{RATE}]))",
                    f"{{{{instance}}}} {label}",
                )
                for name, label in (
                    ("exported_records", "delivered"),
                    ("dropped_records", "dropped"),
                    ("rejected_records", "rejected"),
                )
            ],
            unit="short",
        )
    )
    board = board.with_panel(
        _series(
            "Retried deliveries per second",
            [
                (
                    f"sum by (job, instance) (rate(goodput_exporter_retries_total[{RATE}]))",
                    "{{instance}}",
                )
            ],
        )
    )
    board = board.with_panel(
        _series("Buffered bytes", [("goodput_exporter_buffer_bytes", "{{instance}}")], unit="bytes")
    )
    board = board.with_row(gd.Row("Ingest"))
    board = board.with_panel(
        _series(
            "Ingest rate",
            [
                (
                    f"sum by (protocol) (rate(goodput_ingest_records_total[{RATE}]))",
                    "records {{protocol}}",
                ),
                (
                    f"sum by (protocol) (rate(goodput_ingest_tokens_total[{RATE}]))",
                    "tokens {{protocol}}",
                ),
            ],
        )
    )
    board = board.with_panel(
        _series(
            "Ingest batches by outcome",
            [
                (
                    f"sum by (protocol, outcome) (rate(goodput_ingest_batches_total[{RATE}]))",
                    "{{protocol}} {{outcome}}",
                )
            ],
            description="rejected: refused as invalid; failed: not applied; duplicate "
            "and stale: resent batches already applied.",
        )
    )
    return board.with_panel(
        _series(
            "Goodput engine records by outcome",
            [(f"sum by (outcome) (rate(goodput_engine_records_total[{RATE}]))", "{{outcome}}")],
        )
    )


@dataclass(frozen=True, slots=True)
class DashboardSpec:
    uid: str
    build: Callable[[], gd.Dashboard]


DASHBOARDS: tuple[DashboardSpec, ...] = (
    DashboardSpec("goodput-overview", _overview),
    DashboardSpec("goodput-slo", _slo_detail),
    DashboardSpec("goodput-pd-fleet", _pd_fleet),
    DashboardSpec("goodput-control-loops", _control_loops),
    DashboardSpec("goodput-exporters", _exporters),
)


def dashboard_json(spec: DashboardSpec) -> dict[str, Any]:
    """The classic dashboard JSON of ``spec`` (what Grafana's file provider loads)."""
    built = spec.build().build()
    data: dict[str, Any] = json.loads(json.dumps(built, cls=JSONEncoder))
    for number, panel in enumerate(data.get("panels", []), start=1):
        panel["id"] = number  # Grafana wants ids unique within the dashboard
    return data


def panel_queries(data: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """``(panel or annotation title, PromQL)`` for every query of a dashboard's JSON."""
    for panel in data.get("panels", []):
        for target in panel.get("targets", []):
            yield panel.get("title", ""), target["expr"]
    for annotation in data.get("annotations", {}).get("list", []):
        if "expr" in annotation:
            yield annotation["name"], annotation["expr"]
