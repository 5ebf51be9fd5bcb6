"""Prometheus rules for all SLOs at once: evaluation cost follows the compliance windows, not
the number of SLOs.

The per-SLO layout (:func:`dashboards.rules.render_rules`) gives every SLO a group of about 20
rules, and Prometheus spends some 0.3 ms of CPU per rule evaluation whatever the rule: 6.5 CPU-s
per interval for 1,000 SLOs. Here every rule covers every SLO (``sum by (slo)`` over
``goodput_requests_total``), and what differs between SLOs comes from gauges the control plane
exports (``controlplane.goodput.collector``): ``goodput_slo_objective_ratio{slo,sli}`` (the
target of each SLI), ``goodput_slo_window_seconds{slo}`` (the compliance window) and
``goodput_slo_info{slo,slo_id,slo_version,objective,vantage}`` (value 1). The recorded names
and labels are those of the per-SLO layout (Sloth's): ``slo``, ``sli``, ``sloth_id``,
``sloth_service``, ``sloth_slo`` (and ``sloth_window`` on the SLI ratios), so dashboards read
either layout.

Groups:

* ``goodput-slos``: ``slo:sli_error:ratio_rate<w>`` for ``w`` in 5m … 3d (the goodput SLI, and
  the availability SLI when an SLO has an availability target, kept to those SLOs);
  ``slo:objective:ratio``, ``slo:error_budget:ratio``, ``slo:time_period:days``,
  ``slo:current_burn_rate:ratio``, ``slo:period_error_budget_remaining:ratio``,
  ``sloth_slo_info``; the alert ``GoodputSLONoData``.
* ``goodput-slos-<W>``, one per distinct compliance window ``W`` of the SLOs: the SLI ratio
  over ``W`` (when ``W`` is not one of the windows above) and ``slo:period_burn_rate:ratio``,
  both kept to the SLOs whose ``goodput_slo_window_seconds`` is ``W``, and the
  ``GoodputErrorBudgetBurn`` alerts whose pairs fit in ``W``, labelled ``slo_window`` (``W``:
  Prometheus refuses two rules of one name and one label set). Within the group the burn-rate
  factors are constants (``budget_share × W / long``, :mod:`dashboards._windows`); each
  SLO's threshold is ``factor × slo:error_budget:ratio``, joined ``on (slo, sli)``.
* ``goodput-fleet``: as in the per-SLO layout (:func:`dashboards.rules.fleet_rule_group`).

Alerts join the info series ``on (slo) group_left (slo_id, slo_version, objective)``, so
those labels are on the alert and its annotations template them (summary, description,
``objective``, ``slo_version``, ``runbook_url``). The file depends on the registry only
through the set of compliance windows and whether an SLO has an availability target; the
SLOs are still checked one by one: an SLO whose alerts cannot fire is named, with why, in a
comment at the top of the file (:func:`unalertable`), and the per-SLO file refuses it.

Example::

    text = render_shared_rules(slos, base_url="http://goodput:8000")
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dashboards._windows import ALERT_WINDOWS, SLI_WINDOWS, AlertWindow, duration, seconds
from dashboards.rules import (
    _HEADER,
    RulesError,
    SLORuleSource,
    _alert_windows,
    _group_lines,
    _num,
    _slis,
    fleet_rule_group,
)

__all__ = ["render_shared_rules", "shared_rules_document", "unalertable"]

Rule = dict[str, Any]

_REQUESTS = "goodput_requests_total"
_OBJECTIVE = "goodput_slo_objective_ratio"
_WINDOW = "goodput_slo_window_seconds"
_INFO = "goodput_slo_info"
_INFO_LABELS = "slo_id, slo_version, objective"
#: The SLI's error and total counters (result label values).
_COUNTERS = {
    "goodput": ('result="bad"', 'result=~"good|bad"'),
    "availability": ('result="rejected"', 'result=~"good|bad|aborted|rejected"'),
}
_OBJECTIVE_TEXT = {"goodput": "{{ $labels.objective }}", "availability": "admitted, not rejected"}


def _sloth_labels(expr: str, sli: str) -> str:
    """``expr`` (labelled ``slo``) with Sloth's ``sloth_service`` and ``sloth_id``."""
    service = f'label_replace({expr}, "sloth_service", "$1", "slo", "(.*)")'
    return f'label_replace({service}, "sloth_id", "$1-{sli}", "slo", "(.*)")'


def _window_is(window_s: int) -> str:
    return f"on (slo) (max by (slo) ({_WINDOW}) == {window_s})"


def _info_join(expr: str) -> str:
    return f"({expr}) * on (slo) group_left ({_INFO_LABELS}) max by (slo, {_INFO_LABELS}) ({_INFO})"


def _ratio_rule(sli: str, window: str, keep: str = "") -> Rule:
    bad, total = _COUNTERS[sli]
    expr = (
        f"sum by (slo) (rate({_REQUESTS}{{{bad}}}[{window}])) / "
        f"sum by (slo) (rate({_REQUESTS}{{{total}}}[{window}]))"
    )
    if sli == "availability":
        expr = f'({expr}) and on (slo) {_OBJECTIVE}{{sli="availability"}}'
    if keep:
        expr = f"({expr}) and {keep}"
    return {
        "record": f"slo:sli_error:ratio_rate{window}",
        "expr": _sloth_labels(expr, sli),
        "labels": {"sli": sli, "sloth_slo": sli, "sloth_window": window},
    }


def _annotations(base_url: str, sli: str) -> dict[str, str]:
    return {
        "slo_version": "{{ $labels.slo_version }}",
        "objective": _OBJECTIVE_TEXT[sli],
        "runbook_url": f"{base_url.rstrip('/')}/api/v1/slos/{{{{ $labels.slo_id }}}}/goodput"
        "?window=1h",
    }


def _described(sli: str) -> str:
    return (
        f"SLO {{{{ $labels.slo }}}} v{{{{ $labels.slo_version }}}} ({sli}): {_OBJECTIVE_TEXT[sli]}."
    )


def _slos_group(slis: set[str], base_url: str) -> dict[str, Any]:
    rules = [_ratio_rule(sli, w) for sli in ("goodput", "availability") if sli in slis
             for w in SLI_WINDOWS]  # fmt: skip
    rules += [
        {
            "record": "slo:objective:ratio",
            "expr": (
                "label_replace(label_replace(label_join(max by (slo, sli) "
                f'({_OBJECTIVE}), "sloth_id", "-", "slo", "sli"), '
                '"sloth_service", "$1", "slo", "(.*)"), "sloth_slo", "$1", "sli", "(.*)")'
            ),
        },
        {"record": "slo:error_budget:ratio", "expr": "1 - slo:objective:ratio"},
        {
            "record": "slo:time_period:days",
            "expr": (
                "slo:objective:ratio * 0 + on (slo) group_left () "
                f"(max by (slo) ({_WINDOW}) / 86400)"
            ),
        },
        {
            "record": "slo:current_burn_rate:ratio",
            "expr": (
                "sum without (sloth_window) (slo:sli_error:ratio_rate5m) "
                "/ on (slo, sli) group_left () slo:error_budget:ratio"
            ),
        },
        {
            "record": "slo:period_error_budget_remaining:ratio",
            "expr": "1 - slo:period_burn_rate:ratio",
        },
        {
            "record": "sloth_slo_info",
            "expr": "slo:objective:ratio * 0 + 1",
            "labels": {"sloth_mode": "goodput"},
        },
    ]
    ratio1h, ratio5m = (
        'slo:sli_error:ratio_rate1h{sli="goodput"}',
        ('slo:sli_error:ratio_rate5m{sli="goodput"}'),
    )
    rules.append(
        {
            "alert": "GoodputSLONoData",
            "expr": _info_join(f"{ratio1h} >= 0 unless ignoring (sloth_window) {ratio5m} >= 0"),
            "for": "5m",
            "labels": {"severity": "ticket"},
            "annotations": {
                **_annotations(base_url, "goodput"),
                "summary": "SLO {{ $labels.slo }} judged no request for 10 minutes",
                "description": (
                    f"{_described('goodput')} It had traffic within the hour; its exporters "
                    "may not be delivering."
                ),
            },
        }
    )
    return {"name": "goodput-slos", "rules": rules}


def _burn_alert(alert: AlertWindow, window_s: int, base_url: str) -> Rule:
    factor = _num(round(alert.factor(window_s), 4))
    threshold = f"on (slo, sli) group_left () ({factor} * slo:error_budget:ratio)"
    expr = (
        f"(slo:sli_error:ratio_rate{alert.long} > {threshold}) and ignoring (sloth_window) "
        f"(slo:sli_error:ratio_rate{alert.short} > {threshold}) and {_window_is(window_s)}"
    )
    return {
        "alert": "GoodputErrorBudgetBurn",
        "expr": _info_join(expr),
        "labels": {
            "severity": alert.severity,
            "long": alert.long,
            "short": alert.short,
            "slo_window": duration(window_s),
        },
        "annotations": {
            "slo_version": "{{ $labels.slo_version }}",
            "objective": (
                '{{ if eq $labels.sli "availability" }}admitted, not rejected'
                "{{ else }}{{ $labels.objective }}{{ end }}"
            ),
            "runbook_url": _annotations(base_url, "goodput")["runbook_url"],
            "summary": (
                "SLO {{ $labels.slo }} ({{ $labels.sli }}) spent over "
                f"{alert.budget_text} of its error budget in the last {alert.long} "
                f"(burn rate over {factor}; {alert.short} confirms)"
            ),
            "description": (
                "SLO {{ $labels.slo }} v{{ $labels.slo_version }} ({{ $labels.sli }}) over "
                f"a {duration(window_s)} window. Error ratio over {alert.long}: "
                "{{ $value | humanizePercentage }}, above "
                f"{factor}x its error budget."
            ),
        },
    }


def _window_group(window_s: int, slis: set[str], base_url: str) -> dict[str, Any]:
    period = duration(window_s)
    keep = _window_is(window_s)
    rules: list[Rule] = []
    if period not in SLI_WINDOWS:
        rules += [_ratio_rule(sli, period, keep) for sli in ("goodput", "availability")
                  if sli in slis]  # fmt: skip
    rules.append(
        {
            "record": "slo:period_burn_rate:ratio",
            "expr": (
                f"(sum without (sloth_window) (slo:sli_error:ratio_rate{period}) "
                f"/ on (slo, sli) group_left () slo:error_budget:ratio) and {keep}"
            ),
            "labels": {"slo_window": period},
        }
    )
    rules += [
        _burn_alert(alert, window_s, base_url)
        for alert in ALERT_WINDOWS
        if seconds(alert.long) <= window_s
    ]
    return {"name": f"goodput-slos-{period}", "rules": rules}


def shared_rules_document(slos: Iterable[SLORuleSource], *, base_url: str) -> dict[str, Any]:
    """The rule file for all SLOs (as data): the fleet group, ``goodput-slos`` and one group
    per distinct compliance window, shortest first. An SLO that no burn-rate alert can page
    on (:func:`unalertable`) is still recorded: its alerts are the window group's, whose
    threshold its error ratio can never cross; one SLO never takes the others' file down."""
    windows: dict[int, set[str]] = {}
    for slo in sorted(slos, key=lambda s: s.name):
        for sli in _slis(slo):
            windows.setdefault(slo.window_s, set()).add(sli.name)
    groups = [fleet_rule_group()]
    if windows:
        every = set().union(*windows.values())
        groups.append(_slos_group(every, base_url))
        groups += [_window_group(w, slis, base_url) for w, slis in sorted(windows.items())]
    return {"groups": groups}


def unalertable(slos: Iterable[SLORuleSource]) -> list[str]:
    """Why each SLO that cannot be paged on cannot be (the per-SLO layout's
    :class:`~dashboards.rules.RulesError` message, naming the SLO, the field and the allowed
    values), in SLO name order; empty when every SLO can be."""
    reasons = []
    for slo in sorted(slos, key=lambda s: s.name):
        for sli in _slis(slo):
            try:
                _alert_windows(slo, sli)
            except RulesError as exc:
                reasons.append(str(exc))
                break
    return reasons


def render_shared_rules(slos: Iterable[SLORuleSource], *, base_url: str) -> str:
    """:func:`shared_rules_document` as rule-file text (block style, one rule per line in
    JSON flow style, as :func:`dashboards.rules.render_rules`); each SLO that cannot be
    paged on is named, with why, in a comment at the top."""
    slos = list(slos)
    title, *rest = _HEADER
    lines = [title, *(f"# not alerted on: {reason}" for reason in unalertable(slos)), *rest]
    for group in shared_rules_document(slos, base_url=base_url)["groups"]:
        lines.extend(_group_lines(group))
    return "\n".join(lines) + "\n"
