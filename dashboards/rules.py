"""Prometheus recording and alert rules generated from SLO definitions.

Each SLO gets one rule group, ``goodput-slo-<name>``, built on the control plane's counter
``goodput_requests_total{slo, result}`` (``controlplane.goodput.collector``), so every ratio is
computed by Prometheus from rates. Names follow Sloth's conventions, so Sloth dashboards and
habits work; each recorded series carries ``slo`` and ``sli`` plus Sloth's ``sloth_id``,
``sloth_service`` (the SLO's name) and ``sloth_slo`` (the SLI) labels:

* SLIs: ``goodput`` (bad / judged requests: a request is bad when it fails or misses an
  objective) and, when the SLO has an ``availability_target``, ``availability`` (rejected /
  (admitted + rejected)).
* Per SLI, 15 recording rules (Sloth's set): ``slo:sli_error:ratio_rate<w>`` for ``w`` in
  5m, 30m, 1h, 2h, 6h, 1d, 3d and the compliance window (``ratio_rate28d``);
  ``slo:objective:ratio``, ``slo:error_budget:ratio``, ``slo:time_period:days``,
  ``slo:current_burn_rate:ratio`` (5m), ``slo:period_burn_rate:ratio``,
  ``slo:period_error_budget_remaining:ratio`` and ``sloth_slo_info``.
* Per SLI, ``GoodputErrorBudgetBurn{severity, long, short}`` for each window pair of
  :data:`~dashboards._windows.ALERT_WINDOWS` that fits in the compliance window, and for the
  goodput SLI ``GoodputSLONoData`` (judged traffic over the last hour, none over 5 minutes).

:func:`fleet_rule_group` adds the SLO-independent alerts: an exporter dropping records, a
gateway whose admission fell back to its static cap (the control plane stopped renewing its
policy), a control plane rejecting ingest batches.

An SLO whose alerts cannot be expressed raises :class:`RulesError` naming the field: a
compliance window shorter than the page alert's long window (1 h), or a target so low that
an alert's threshold error ratio reaches 1 (it could never fire).

Example::

    text = render_rules([slo], base_url="http://goodput:8000")
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from dashboards._windows import ALERT_WINDOWS, SLI_WINDOWS, AlertWindow, duration, seconds

__all__ = [
    "RulesError",
    "SLORuleSource",
    "fleet_rule_group",
    "render_rules",
    "rules_document",
    "slo_rule_group",
]

Rule = dict[str, Any]

_REQUESTS = "goodput_requests_total"


class ObjectiveSource(Protocol):
    @property
    def metric(self) -> str: ...
    @property
    def threshold_s(self) -> float: ...
    @property
    def statistic(self) -> str: ...


class SLORuleSource(Protocol):
    """What the generator reads of an SLO (``controlplane.schemas.slo.SLOPublic`` has it)."""

    @property
    def id(self) -> object: ...
    @property
    def name(self) -> str: ...
    @property
    def version(self) -> int: ...
    @property
    def target(self) -> float: ...
    @property
    def window_s(self) -> int: ...
    @property
    def availability_target(self) -> float | None: ...
    @property
    def objectives(self) -> Sequence[ObjectiveSource]: ...


class RulesError(ValueError):
    """An SLO whose rules cannot be expressed; the message names the SLO and the field."""


@dataclass(frozen=True, slots=True)
class _SLI:
    """One SLI of an SLO: its error and total selectors and its target."""

    name: str
    field: str  # the SLO field holding the target, for error messages
    target: float
    bad: str
    total: str


def _slis(slo: SLORuleSource) -> list[_SLI]:
    sel = f'slo="{slo.name}"'
    slis = [
        _SLI(
            "goodput",
            "target",
            slo.target,
            f'{_REQUESTS}{{{sel},result="bad"}}',
            f'{_REQUESTS}{{{sel},result=~"good|bad"}}',
        )
    ]
    if slo.availability_target is not None:
        slis.append(
            _SLI(
                "availability",
                "availability_target",
                slo.availability_target,
                f'{_REQUESTS}{{{sel},result="rejected"}}',
                f'{_REQUESTS}{{{sel},result=~"good|bad|aborted|rejected"}}',
            )
        )
    return slis


def _num(value: float) -> str:
    return format(value, ".10g")


def objective_text(slo: SLORuleSource) -> str:
    """``"ttft <= 0.2 s and itl p99 <= 0.05 s"`` (every request; ``"none"`` without any)."""
    parts = [
        f"{o.metric}{'' if o.statistic == 'max' else ' ' + o.statistic} <= {_num(o.threshold_s)} s"
        for o in slo.objectives
    ]
    return " and ".join(parts) or "none (every successful request is good)"


def _alert_windows(slo: SLORuleSource, sli: _SLI) -> list[tuple[AlertWindow, float]]:
    """The alert windows that fit in the compliance window, each with its threshold ratio;
    :class:`RulesError` when the page alert does not fit or a threshold cannot be reached."""
    window = slo.window_s
    fitting = [a for a in ALERT_WINDOWS if seconds(a.long) <= window]
    if not any(a.severity == "page" for a in fitting):
        raise RulesError(
            f"slo {slo.name!r}: window_s must be >= 3600 for burn-rate alerts (the page "
            f"alert's long window is 1h), got {window}"
        )
    budget = 1.0 - sli.target
    out = []
    for alert in fitting:
        threshold = alert.factor(window) * budget
        if threshold >= 1.0:
            # factor × (1 − target) < 1  ⇔  target > 1 − 1/factor
            raise RulesError(
                f"slo {slo.name!r}: {sli.field} {_num(sli.target)} with window_s {window} "
                f"cannot be alerted on: the {alert.severity} alert over {alert.long} and "
                f"{alert.short} fires above {_num(alert.factor(window))}x the error budget, an "
                f"error ratio of {threshold:.3g} that no traffic can exceed; allowed: "
                f"{sli.field} > {_num(1 - 1 / alert.factor(window))} for this window, or a "
                f"shorter window_s (<= {int(seconds(alert.long) / (alert.budget_share * budget))})"
            )
        out.append((alert, threshold))
    return out


def slo_rule_group(slo: SLORuleSource, *, base_url: str) -> dict[str, Any]:
    """The rule group of one SLO (see the module); :class:`RulesError` when inexpressible."""
    rules: list[Rule] = []
    period = duration(slo.window_s)
    for sli in _slis(slo):
        rules.extend(_sli_rules(slo, sli, period, base_url))
    return {"name": f"goodput-slo-{slo.name}", "rules": rules}


def _sli_rules(slo: SLORuleSource, sli: _SLI, period: str, base_url: str) -> list[Rule]:
    alerts = _alert_windows(slo, sli)  # first: an inexpressible SLO yields no rules at all
    sloth_id = f"{slo.name}-{sli.name}"
    ids = {"slo": slo.name, "sli": sli.name}
    labels = {**ids, "sloth_id": sloth_id, "sloth_service": slo.name, "sloth_slo": sli.name}
    match = f'{{sloth_id="{sloth_id}"}}'
    budget = _num(1.0 - sli.target)
    rules: list[Rule] = []
    for window in dict.fromkeys((*SLI_WINDOWS, period)):
        rules.append(
            {
                "record": f"slo:sli_error:ratio_rate{window}",
                "expr": f"sum(rate({sli.bad}[{window}])) / sum(rate({sli.total}[{window}]))",
                "labels": {**labels, "sloth_window": window},
            }
        )
    meta = (
        ("slo:objective:ratio", f"vector({_num(sli.target)})"),
        ("slo:error_budget:ratio", f"vector({budget})"),
        ("slo:time_period:days", f"vector({_num(slo.window_s / 86_400)})"),
        (
            "slo:current_burn_rate:ratio",
            f"sum without (sloth_window) (slo:sli_error:ratio_rate5m{match}) / {budget}",
        ),
        (
            "slo:period_burn_rate:ratio",
            f"sum without (sloth_window) (slo:sli_error:ratio_rate{period}{match}) / {budget}",
        ),
        ("slo:period_error_budget_remaining:ratio", f"1 - slo:period_burn_rate:ratio{match}"),
    )
    rules.extend({"record": r, "expr": e, "labels": labels} for r, e in meta)
    rules.append(
        {
            "record": "sloth_slo_info",
            "expr": "vector(1)",
            "labels": {**labels, "sloth_mode": "goodput", "sloth_objective": _num(sli.target)},
        }
    )
    annotations = {
        "slo_version": str(slo.version),
        "objective": objective_text(slo) if sli.name == "goodput" else "admitted, not rejected",
        "runbook_url": f"{base_url.rstrip('/')}/api/v1/slos/{slo.id}/goodput?window=1h",
    }
    described = (
        f"SLO {slo.name} v{slo.version} ({sli.name}): {annotations['objective']}; "
        f"target {_num(sli.target)} over {period}."
    )
    for alert, threshold in alerts:
        factor = _num(round(alert.factor(slo.window_s), 4))
        rules.append(
            {
                "alert": "GoodputErrorBudgetBurn",
                "expr": (
                    f"slo:sli_error:ratio_rate{alert.long}{match} > {_num(threshold)} "
                    f"and ignoring (sloth_window) "
                    f"slo:sli_error:ratio_rate{alert.short}{match} > {_num(threshold)}"
                ),
                "labels": {
                    **ids,
                    "severity": alert.severity,
                    "long": alert.long,
                    "short": alert.short,
                },
                "annotations": {
                    **annotations,
                    "summary": (
                        f"SLO {slo.name} ({sli.name}) burns its error budget over {factor}x "
                        f"too fast ({alert.long} and {alert.short})"
                    ),
                    "description": (
                        f"{described} Error ratio over {alert.long}: "
                        "{{ $value | humanizePercentage }}; threshold "
                        f"{_num(threshold)} ({factor}x the budget of {budget})."
                    ),
                },
            }
        )
    if sli.name == "goodput":
        rules.append(
            {
                "alert": "GoodputSLONoData",
                "expr": (
                    f"slo:sli_error:ratio_rate1h{match} >= 0 unless ignoring (sloth_window) "
                    f"slo:sli_error:ratio_rate5m{match} >= 0"
                ),
                "for": "5m",
                "labels": {**ids, "severity": "ticket"},
                "annotations": {
                    **annotations,
                    "summary": f"SLO {slo.name} judged no request for 10 minutes",
                    "description": (
                        f"{described} It had traffic within the hour; the control plane may "
                        "not be scraped, or its exporters may not be delivering."
                    ),
                },
            }
        )
    return rules


def fleet_rule_group() -> dict[str, Any]:
    """Alerts on the machinery rather than an SLO (the same for every registry)."""
    dropped = "goodput:exporter_dropped_records:rate5m"
    rejected = "goodput:ingest_rejected_batches:rate5m"
    fallback = "goodput:gateway_admission_fallback:max"
    return {
        "name": "goodput-fleet",
        "rules": [
            {
                "record": dropped,
                "expr": "sum by (job, instance) (rate(goodput_exporter_dropped_records_total[5m]))",
            },
            {
                "record": rejected,
                "expr": "sum by (job, instance, protocol) "
                '(rate(goodput_ingest_batches_total{outcome="rejected"}[5m]))',
            },
            {
                "record": fallback,
                "expr": 'max by (job, instance) (goodput_gateway_admission_mode{mode="fallback"})',
            },
            {
                "alert": "GoodputExporterDroppingRecords",
                "expr": f"{dropped} > 0",
                "for": "1m",
                "labels": {"severity": "ticket"},
                "annotations": {
                    "summary": "Exporter {{ $labels.instance }} drops request records",
                    "description": "{{ $value | humanize }} records/s dropped (buffer full or "
                    "shut down): goodput is under-counted for the SLOs it feeds.",
                },
            },
            {
                "alert": "GoodputGatewayAdmissionFallback",
                "expr": f"{fallback} == 1",
                "for": "1m",
                "labels": {"severity": "ticket"},
                "annotations": {
                    "summary": "Gateway {{ $labels.instance }} admits on its static fallback cap",
                    "description": "Its admission policy expired: the control plane has not "
                    "renewed it (unreachable, or its admission loop stopped).",
                },
            },
            {
                "alert": "GoodputIngestRejectingBatches",
                "expr": f"{rejected} > 0",
                "for": "5m",
                "labels": {"severity": "ticket"},
                "annotations": {
                    "summary": "Control plane {{ $labels.instance }} rejects ingest batches",
                    "description": "{{ $value | humanize }} batches/s refused as invalid "
                    "({{ $labels.protocol }}): an exporter and the control plane disagree "
                    "on the wire contract.",
                },
            },
        ],
    }


def rules_document(slos: Iterable[SLORuleSource], *, base_url: str) -> dict[str, Any]:
    """A Prometheus rule file (as data): the fleet group, then one group per SLO by name.
    Raises :class:`RulesError` for the first SLO that cannot be expressed."""
    groups = [slo_rule_group(s, base_url=base_url) for s in sorted(slos, key=lambda s: s.name)]
    return {"groups": [fleet_rule_group(), *groups]}


def render_rules(slos: Iterable[SLORuleSource], *, base_url: str) -> str:
    """The rule file as YAML text (``promtool check rules`` accepts it): block style for the
    groups, each rule one line in flow style (JSON, which YAML includes). A YAML emitter
    takes ~40x longer for a thousand SLOs."""
    lines = [
        "# Generated by Goodput from the SLO registry (dashboards.rules). Do not edit.",
        "groups:",
    ]
    for group in rules_document(slos, base_url=base_url)["groups"]:
        lines.append(f"- name: {json.dumps(group['name'])}")
        lines.append("  rules:")
        lines.extend(f"  - {json.dumps(rule, ensure_ascii=False)}" for rule in group["rules"])
    return "\n".join(lines) + "\n"
