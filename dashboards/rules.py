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

import dataclasses
import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from dashboards._windows import ALERT_WINDOWS, SLI_WINDOWS, AlertWindow, duration, seconds

__all__ = [
    "RulesError",
    "SLORuleSource",
    "encode_rules",
    "fleet_rule_group",
    "objectives_text",
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


@dataclasses.dataclass(frozen=True, slots=True)
class _SLI:
    """One SLI of an SLO: its name, the SLO field holding its target, and the target."""

    name: str
    field: str  # the SLO field holding the target, for error messages
    target: float


def _slis(slo: SLORuleSource) -> list[_SLI]:
    slis = [_SLI("goodput", "target", slo.target)]
    if slo.availability_target is not None:
        slis.append(_SLI("availability", "availability_target", slo.availability_target))
    return slis


def _num(value: float) -> str:
    return format(value, ".10g")


def objectives_text(objectives: Iterable[ObjectiveSource]) -> str:
    """``"ttft <= 0.2 s and itl p99 <= 0.05 s"`` (every request; ``"none"`` without any)."""
    parts = [
        f"{o.metric}{'' if o.statistic == 'max' else ' ' + o.statistic} <= {_num(o.threshold_s)} s"
        for o in objectives
    ]
    return " and ".join(parts) or "none (every successful request is good)"


def objective_text(slo: SLORuleSource) -> str:
    """The SLO's objectives as text (:func:`objectives_text`)."""
    return objectives_text(slo.objectives)


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
    for text in _sli_texts(slo, base_url):
        rules.extend(_sli_rules(text))
    return {"name": f"goodput-slo-{slo.name}", "rules": rules}


@dataclasses.dataclass(frozen=True, slots=True)
class _SLIText:
    """The strings one SLI's rules are made of: an SLO's values, or a template's fields."""

    sli: str  # "goodput" or "availability": the shape, never a field
    slo: str
    period: str
    target: str
    budget: str
    days: str
    version: str
    objective: str
    runbook_url: str
    alerts: tuple[tuple[AlertWindow, str, str], ...]  # (window, threshold, factor)


def _sli_texts(slo: SLORuleSource, base_url: str) -> list[_SLIText]:
    """One :class:`_SLIText` per SLI, every SLI checked first (an inexpressible SLO yields
    no rules at all)."""
    slis = [(sli, _alert_windows(slo, sli)) for sli in _slis(slo)]
    period = duration(slo.window_s)
    days = _num(slo.window_s / 86_400)
    version = str(slo.version)
    runbook_url = f"{base_url.rstrip('/')}/api/v1/slos/{slo.id}/goodput?window=1h"
    return [
        _SLIText(
            sli=sli.name,
            slo=slo.name,
            period=period,
            target=_num(sli.target),
            budget=_num(1.0 - sli.target),
            days=days,
            version=version,
            objective=objective_text(slo) if sli.name == "goodput" else "admitted, not rejected",
            runbook_url=runbook_url,
            alerts=tuple(
                (alert, _num(threshold), _num(round(alert.factor(slo.window_s), 4)))
                for alert, threshold in alerts
            ),
        )
        for sli, alerts in slis
    ]


def _selectors(sli: str, slo: str) -> tuple[str, str]:
    """The error and total counters of an SLI, as PromQL selectors."""
    sel = f'slo="{slo}"'
    if sli == "goodput":
        return f'{_REQUESTS}{{{sel},result="bad"}}', f'{_REQUESTS}{{{sel},result=~"good|bad"}}'
    return (
        f'{_REQUESTS}{{{sel},result="rejected"}}',
        f'{_REQUESTS}{{{sel},result=~"good|bad|aborted|rejected"}}',
    )


def _sli_rules(t: _SLIText) -> list[Rule]:
    bad, total = _selectors(t.sli, t.slo)
    sloth_id = f"{t.slo}-{t.sli}"
    ids = {"slo": t.slo, "sli": t.sli}
    labels = {**ids, "sloth_id": sloth_id, "sloth_service": t.slo, "sloth_slo": t.sli}
    match = f'{{sloth_id="{sloth_id}"}}'
    rules: list[Rule] = []
    for window in dict.fromkeys((*SLI_WINDOWS, t.period)):
        rules.append(
            {
                "record": f"slo:sli_error:ratio_rate{window}",
                "expr": f"sum(rate({bad}[{window}])) / sum(rate({total}[{window}]))",
                "labels": {**labels, "sloth_window": window},
            }
        )
    meta = (
        ("slo:objective:ratio", f"vector({t.target})"),
        ("slo:error_budget:ratio", f"vector({t.budget})"),
        ("slo:time_period:days", f"vector({t.days})"),
        (
            "slo:current_burn_rate:ratio",
            f"sum without (sloth_window) (slo:sli_error:ratio_rate5m{match}) / {t.budget}",
        ),
        (
            "slo:period_burn_rate:ratio",
            f"sum without (sloth_window) (slo:sli_error:ratio_rate{t.period}{match}) / {t.budget}",
        ),
        ("slo:period_error_budget_remaining:ratio", f"1 - slo:period_burn_rate:ratio{match}"),
    )
    rules.extend({"record": r, "expr": e, "labels": labels} for r, e in meta)
    rules.append(
        {
            "record": "sloth_slo_info",
            "expr": "vector(1)",
            "labels": {**labels, "sloth_mode": "goodput", "sloth_objective": t.target},
        }
    )
    annotations = {
        "slo_version": t.version,
        "objective": t.objective,
        "runbook_url": t.runbook_url,
    }
    described = (
        f"SLO {t.slo} v{t.version} ({t.sli}): {t.objective}; target {t.target} over {t.period}."
    )
    for alert, threshold, factor in t.alerts:
        rules.append(
            {
                "alert": "GoodputErrorBudgetBurn",
                "expr": (
                    f"slo:sli_error:ratio_rate{alert.long}{match} > {threshold} "
                    f"and ignoring (sloth_window) "
                    f"slo:sli_error:ratio_rate{alert.short}{match} > {threshold}"
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
                        f"SLO {t.slo} ({t.sli}) spent over {alert.budget_text} "
                        f"of its error budget in the last {alert.long} (burn rate over "
                        f"{factor}; {alert.short} confirms)"
                    ),
                    "description": (
                        f"{described} Error ratio over {alert.long}: "
                        "{{ $value | humanizePercentage }}; threshold "
                        f"{threshold} ({factor}x the budget of {t.budget})."
                    ),
                },
            }
        )
    if t.sli == "goodput":
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
                    "summary": f"SLO {t.slo} judged no request for 10 minutes",
                    "description": (
                        f"{described} It had traffic within the hour; the control plane may "
                        "not be scraped, or its exporters may not be delivering."
                    ),
                },
            }
        )
    return rules


# -- Rendering: one precompiled template per SLI shape -----------------------------------
#
# A rule file for a thousand SLOs holds some 20,000 rules; building each as dicts and
# encoding it with json took 1.6 s. The rules of an SLI depend on the SLO only through the
# strings of :class:`_SLIText`, so each shape (the SLI, whether the compliance window is one
# of the SLI windows, which alert pairs fit) is built once by :func:`_sli_rules` with
# placeholders for those strings, encoded, and turned into a ``str.format`` template; an SLO
# then costs one ``format`` call per SLI. JSON escapes a string character by character, so
# formatting JSON-escaped values into the encoded template gives the text that encoding the
# rules would give (``tests/unit/dashboards/test_rules.py`` checks it on every shape).

_FIELDS = ("slo", "period", "target", "budget", "days", "version", "objective", "runbook_url")
_OPEN, _CLOSE = "\ue000", "\ue001"  # private-use code points: never in a rule


def _field(name: str) -> str:
    return f"{_OPEN}{name}{_CLOSE}"


@functools.lru_cache(maxsize=256)
def _template(sli: str, fixed_period: str, alerts: tuple[AlertWindow, ...]) -> str:
    """The rule lines of an SLI shape as a ``str.format`` template over :data:`_FIELDS` and
    ``threshold<i>``/``factor<i>``; ``fixed_period`` is the compliance window when it is one
    of :data:`SLI_WINDOWS` (its ratio is then not recorded twice), else empty."""
    f = {name: _field(name) for name in _FIELDS}
    text = _SLIText(
        sli=sli,
        slo=f["slo"],
        period=fixed_period or f["period"],
        target=f["target"],
        budget=f["budget"],
        days=f["days"],
        version=f["version"],
        objective=f["objective"],
        runbook_url=f["runbook_url"],
        alerts=tuple(
            (alert, _field(f"threshold{i}"), _field(f"factor{i}")) for i, alert in enumerate(alerts)
        ),
    )
    encoded = "\n".join(f"  - {json.dumps(rule, ensure_ascii=False)}" for rule in _sli_rules(text))
    encoded = encoded.replace("{", "{{").replace("}", "}}")
    return re.sub(f"{_OPEN}(\\w+){_CLOSE}", r"{\1}", encoded)


_JSON_ESCAPED = re.compile(r'["\\\x00-\x1f]')


def _escaped(value: str) -> str:
    """``value`` as it reads inside a JSON string."""
    if _JSON_ESCAPED.search(value) is None:
        return value
    return json.dumps(value, ensure_ascii=False)[1:-1]


def _render_sli(text: _SLIText) -> str:
    fixed = text.period if text.period in SLI_WINDOWS else ""
    template = _template(text.sli, fixed, tuple(alert for alert, _, _ in text.alerts))
    values = {name: _escaped(getattr(text, name)) for name in _FIELDS}
    for i, (_, threshold, factor) in enumerate(text.alerts):
        values[f"threshold{i}"] = threshold
        values[f"factor{i}"] = factor
    return template.format_map(values)


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


_HEADER = (
    "# Generated by Goodput from the SLO registry (dashboards.rules). Do not edit.",
    "groups:",
)


def _group_lines(group: Mapping[str, Any]) -> list[str]:
    return [
        f"- name: {json.dumps(group['name'])}",
        "  rules:",
        *(f"  - {json.dumps(rule, ensure_ascii=False)}" for rule in group["rules"]),
    ]


def encode_rules(document: Mapping[str, Any]) -> str:
    """A rule document (:func:`rules_document`) as rule-file text, rule by rule: the text
    :func:`render_rules` writes from its templates, slower (what tests and
    ``benchmarks/rules.py`` compare it with)."""
    lines = list(_HEADER)
    for group in document["groups"]:
        lines.extend(_group_lines(group))
    return "\n".join(lines) + "\n"


def render_rules(slos: Iterable[SLORuleSource], *, base_url: str) -> str:
    """The rule file as YAML text (``promtool check rules`` accepts it): block style for the
    groups, each rule one line in flow style (JSON, which YAML includes), the text of
    ``encode_rules(rules_document(...))``. Each SLO fills a precompiled template (see above):
    ~0.1 s for a thousand SLOs, where a YAML emitter took 36 s."""
    lines = [*_HEADER, *_group_lines(fleet_rule_group())]
    for slo in sorted(slos, key=lambda s: s.name):
        texts = _sli_texts(slo, base_url)  # raises before anything of this SLO is written
        lines.append(f"- name: {json.dumps(f'goodput-slo-{slo.name}')}")
        lines.append("  rules:")
        lines.extend(_render_sli(text) for text in texts)
    return "\n".join(lines) + "\n"
