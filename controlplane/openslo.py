"""OpenSLO v1 import and export of SLOs (pure: YAML text in and out, no database).

A Goodput SLO says: *target* of the requests that match *selector* are good over a rolling
*window*, a request being good when it succeeds and meets every latency objective. In
OpenSLO terms that is an ``Occurrences`` SLO over a **ratio** SLI (good / total requests)
whose *good* side carries the latency thresholds. Export (lossless, re-importable)::

    apiVersion: openslo/v1
    kind: SLO
    metadata: {name: chat, annotations: {goodput.dev/vantage: gateway}}
    spec:
      description: ...
      service: llama                    # selector.model, or "goodput"
      budgetingMethod: Occurrences
      timeWindow: [{duration: 28d, isRolling: true}]
      indicator:
        metadata: {name: chat-requests}
        spec:
          ratioMetric:
            counter: true
            good:  {metricSource: {type: Goodput, spec: {requests: good, selector: {...},
                    objectives: [{metric: ttft, op: lte, threshold_s: 0.2, statistic: max}]}}}
            total: {metricSource: {type: Goodput, spec: {requests: total, selector: {...}}}}
      objectives: [{displayName: good requests, target: 0.99}]

``availability_target`` travels as the annotation ``goodput.dev/availability-target``, and
``infeasible`` (what admission does with a request that cannot meet the TTFT objective even
on an idle instance) as ``goodput.dev/infeasible`` when it is not the default ``admit``.

Import also accepts a single-metric **threshold** SLI, the usual way to write a latency SLO
in OpenSLO: ``thresholdMetric.metricSource`` of type ``Goodput`` with
``spec: {metric: ttft, statistic: max, selector: {...}}`` and one objective
``{op: lte, value: 0.2, target: 0.99}`` (``lt`` is read as ``lte``: latencies are measured
in microseconds, so the difference is below resolution). Anything else (``indicatorRef``,
Timeslices, calendar windows, other data sources) is rejected with the field named.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

import yaml
from pydantic import ValidationError

from controlplane.errors import InvalidInputError, format_validation_errors
from controlplane.schemas.slo import SLOCreate, SLOPublic

__all__ = [
    "API_VERSION",
    "MAX_DEPTH",
    "PARSE_BUDGET_S",
    "export_yaml",
    "format_duration",
    "parse_documents",
    "parse_duration",
    "to_openslo",
]

API_VERSION = "openslo/v1"
ANNOTATION_VANTAGE = "goodput.dev/vantage"
ANNOTATION_AVAILABILITY = "goodput.dev/availability-target"
ANNOTATION_INFEASIBLE = "goodput.dev/infeasible"
SOURCE_TYPE = "Goodput"

#: Limits of an import's YAML: nesting (an SLO needs 8 levels) and parse time.
MAX_DEPTH = 32
PARSE_BUDGET_S = 2.0
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_UNITS = {"s": 1, "m": 60, "h": 3_600, "d": 86_400, "w": 604_800}
_DURATION = re.compile(r"(\d+)([smhdw])")


def format_duration(seconds: int) -> str:
    """The largest OpenSLO unit that divides ``seconds`` evenly: 2419200 → ``"28d"``."""
    for unit in ("d", "h", "m"):
        if seconds % _UNITS[unit] == 0:
            return f"{seconds // _UNITS[unit]}{unit}"
    return f"{seconds}s"


def parse_duration(text: object, where: str) -> int:
    match = _DURATION.fullmatch(str(text).strip())
    if match is None:
        raise InvalidInputError(
            f"{where} must be a rolling duration like '28d', '12h', '30m' or '3600s' "
            f"(calendar units M, Q, Y are not supported), got {text!r}",
            loc=_loc(where),
        )
    return int(match.group(1)) * _UNITS[match.group(2)]


def _loc(where: str) -> tuple[str | int, ...]:
    parts: list[str | int] = ["body"]
    for token in re.findall(r"[^.\[\]]+|\[\d+\]", where):
        parts.append(int(token[1:-1]) if token.startswith("[") else token)
    return tuple(parts)


def to_openslo(slo: SLOPublic) -> dict[str, Any]:
    """One OpenSLO v1 ``SLO`` document for a Goodput SLO (see the module docstring)."""
    annotations = {ANNOTATION_VANTAGE: slo.vantage.value}
    if slo.availability_target is not None:
        annotations[ANNOTATION_AVAILABILITY] = repr(slo.availability_target)
    if slo.infeasible != "admit":
        annotations[ANNOTATION_INFEASIBLE] = slo.infeasible
    selector = dict(slo.selector)
    objectives = [
        {"metric": o.metric, "op": "lte", "threshold_s": o.threshold_s, "statistic": o.statistic}
        for o in slo.objectives
    ]
    return {
        "apiVersion": API_VERSION,
        "kind": "SLO",
        "metadata": {"name": slo.name, "annotations": annotations},
        "spec": {
            "description": slo.description,
            "service": selector.get("model") or "goodput",
            "budgetingMethod": "Occurrences",
            "timeWindow": [{"duration": format_duration(slo.window_s), "isRolling": True}],
            "indicator": {
                "metadata": {"name": f"{slo.name}-requests"},
                "spec": {
                    "ratioMetric": {
                        "counter": True,
                        "good": _source(
                            {"requests": "good", "selector": selector, "objectives": objectives}
                        ),
                        "total": _source({"requests": "total", "selector": selector}),
                    }
                },
            },
            "objectives": [{"displayName": "good requests", "target": slo.target}],
        },
    }


def _source(spec: dict[str, Any]) -> dict[str, Any]:
    return {"metricSource": {"type": SOURCE_TYPE, "spec": spec}}


class _PlainDumper(yaml.SafeDumper):
    """Writes repeated values out in full: imports refuse aliases, so exports must not use them."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def export_yaml(slos: Sequence[SLOPublic]) -> str:
    """A YAML stream with one OpenSLO document per SLO."""
    return yaml.dump_all(
        [to_openslo(s) for s in slos],
        Dumper=_PlainDumper,
        sort_keys=False,
        allow_unicode=True,
        default_flow_style=False,
    )


def _load_all(text: str, max_depth: int, budget_s: float) -> list[Any]:
    """The documents of ``text``, after one pass over its parse events that refuses
    aliases (a few bytes expanding into a huge structure: "billion laughs"), nesting deeper
    than ``max_depth`` and a parse running past ``budget_s`` seconds (checked per event),
    so no input keeps a worker thread for long. libyaml's parser when present (linear in
    the nesting; the pure-Python one is quadratic in it)."""
    deadline = time.monotonic() + budget_s
    depth = 0
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            if isinstance(event, yaml.AliasEvent):
                raise InvalidInputError("YAML aliases (*name) are not allowed in an import")
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > max_depth:
                    raise InvalidInputError(f"YAML nests deeper than {max_depth} levels")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
            if time.monotonic() > deadline:
                raise InvalidInputError(f"YAML took more than {budget_s:g} s to parse")
        return [doc for doc in yaml.load_all(text, Loader=_LOADER) if doc is not None]
    except yaml.YAMLError as exc:
        reason = " ".join(str(exc).split())[:200]
        raise InvalidInputError(f"body is not valid YAML: {reason}") from None


def _get(node: object, key: str, where: str, kind: type | tuple[type, ...] = dict) -> Any:
    if not isinstance(node, Mapping) or key not in node:
        raise InvalidInputError(f"{where}.{key} is required", loc=_loc(f"{where}.{key}"))
    value = node[key]
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise InvalidInputError(
            f"{where}.{key} must be a {names}, got {value!r}"[:300], loc=_loc(f"{where}.{key}")
        )
    return value


def _expect(value: object, allowed: Sequence[object], where: str) -> None:
    if value not in allowed:
        raise InvalidInputError(
            f"{where} must be one of {list(allowed)}, got {value!r}", loc=_loc(where)
        )


def _goodput_source(node: object, where: str) -> dict[str, Any]:
    source = _get(node, "metricSource", where)
    _expect(source.get("type"), [SOURCE_TYPE], f"{where}.metricSource.type")
    spec: dict[str, Any] = _get(source, "spec", f"{where}.metricSource")
    return spec


def _window(spec: Mapping[str, Any], where: str) -> int:
    windows = _get(spec, "timeWindow", where, list)
    if len(windows) != 1:
        raise InvalidInputError(
            f"{where}.timeWindow must have exactly 1 entry, got {len(windows)}",
            loc=_loc(f"{where}.timeWindow"),
        )
    window = windows[0]
    if not isinstance(window, Mapping) or window.get("isRolling") is not True:
        raise InvalidInputError(
            f"{where}.timeWindow[0].isRolling must be true (calendar windows are not supported)",
            loc=_loc(f"{where}.timeWindow[0].isRolling"),
        )
    return parse_duration(window.get("duration"), f"{where}.timeWindow[0].duration")


def _from_ratio(ratio: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Selector and objectives from a ratio SLI whose good side is a Goodput source."""
    good = _goodput_source(_get(ratio, "good", where), f"{where}.good")
    where_good = f"{where}.good.metricSource.spec"
    _expect(good.get("requests"), ["good"], f"{where_good}.requests")
    objectives = good.get("objectives") or []
    if not isinstance(objectives, list):
        raise InvalidInputError(
            f"{where_good}.objectives must be a list, got {objectives!r}"[:300],
            loc=_loc(f"{where_good}.objectives"),
        )
    plain: list[object] = []
    for k, objective in enumerate(objectives):
        if not isinstance(objective, Mapping):
            plain.append(objective)  # SLOCreate validation names what is wrong with it
            continue
        _expect(objective.get("op", "lte"), ["lte", "lt"], f"{where_good}.objectives[{k}].op")
        plain.append({key: v for key, v in objective.items() if key != "op"})
    return {"selector": good.get("selector") or {}, "objectives": plain}


def _from_openslo(doc: Mapping[str, Any], where: str) -> dict[str, Any]:
    _expect(doc.get("apiVersion"), [API_VERSION], f"{where}.apiVersion")
    _expect(doc.get("kind"), ["SLO"], f"{where}.kind")
    metadata = _get(doc, "metadata", where)
    spec = _get(doc, "spec", where)
    annotations = metadata.get("annotations") or {}
    if "indicatorRef" in spec:
        raise InvalidInputError(
            f"{where}.spec.indicatorRef is not supported: inline the SLI as spec.indicator",
            loc=_loc(f"{where}.spec.indicatorRef"),
        )
    _expect(spec.get("budgetingMethod"), ["Occurrences"], f"{where}.spec.budgetingMethod")
    fields: dict[str, Any] = {
        "name": metadata.get("name"),
        "description": spec.get("description") or "",
        "window_s": _window(spec, f"{where}.spec"),
        "vantage": annotations.get(ANNOTATION_VANTAGE, "gateway"),
    }
    if ANNOTATION_AVAILABILITY in annotations:
        fields["availability_target"] = annotations[ANNOTATION_AVAILABILITY]
    if ANNOTATION_INFEASIBLE in annotations:
        fields["infeasible"] = annotations[ANNOTATION_INFEASIBLE]
    indicator = _get(_get(spec, "indicator", f"{where}.spec"), "spec", f"{where}.spec.indicator")
    goals = _get(spec, "objectives", f"{where}.spec", list)
    if len(goals) != 1 or not isinstance(goals[0], Mapping):
        raise InvalidInputError(
            f"{where}.spec.objectives must have exactly 1 entry (one target per Goodput SLO), "
            f"got {len(goals)}",
            loc=_loc(f"{where}.spec.objectives"),
        )
    goal = goals[0]
    fields["target"] = _get(goal, "target", f"{where}.spec.objectives[0]", (int, float))
    where_sli = f"{where}.spec.indicator.spec"
    if "ratioMetric" in indicator:
        fields.update(
            _from_ratio(_get(indicator, "ratioMetric", where_sli), f"{where_sli}.ratioMetric")
        )
    elif "thresholdMetric" in indicator:
        source = _goodput_source(
            _get(indicator, "thresholdMetric", where_sli), f"{where_sli}.thresholdMetric"
        )
        _expect(goal.get("op"), ["lte", "lt"], f"{where}.spec.objectives[0].op")
        threshold = _get(goal, "value", f"{where}.spec.objectives[0]", (int, float))
        fields["selector"] = source.get("selector") or {}
        fields["objectives"] = [
            {
                "metric": source.get("metric"),
                "threshold_s": threshold,
                "statistic": source.get("statistic", "max"),
            }
        ]
    else:
        raise InvalidInputError(
            f"{where_sli} must have ratioMetric or thresholdMetric", loc=_loc(where_sli)
        )
    return fields


def parse_documents(
    text: str, *, max_depth: int = MAX_DEPTH, budget_s: float = PARSE_BUDGET_S
) -> list[SLOCreate]:
    """SLO definitions from a YAML stream of OpenSLO v1 ``SLO`` documents and/or Goodput's
    own form (the ``SLOCreate`` fields, e.g. ``{name, objectives, target, window_s}``).

    CPU-bound: call it from a worker thread. Raises :class:`InvalidInputError` naming the
    document and field (``documents[1].spec...``), also for YAML nested deeper than
    ``max_depth`` or taking longer than ``budget_s`` to parse.
    """
    docs = _load_all(text, max_depth, budget_s)
    if not docs:
        raise InvalidInputError("body has no YAML documents; expected one or more SLOs")
    parsed: list[SLOCreate] = []
    for index, doc in enumerate(docs):
        where = f"documents[{index}]"
        if not isinstance(doc, Mapping):
            raise InvalidInputError(
                f"{where} must be a mapping (an SLO), got {type(doc).__name__}", loc=_loc(where)
            )
        fields = _from_openslo(doc, where) if "apiVersion" in doc else dict(doc)
        try:
            parsed.append(SLOCreate.model_validate(fields))
        except ValidationError as exc:
            entries = format_validation_errors(exc.errors(include_url=False))
            first = entries[0]
            raise InvalidInputError(
                f"{where}.{first['msg']}", loc=_loc(f"{where}.{first['field']}")
            ) from None
    return parsed
