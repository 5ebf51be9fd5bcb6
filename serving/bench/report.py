"""The bench's numbers, from client-side records, with the exporters' metric core.

:func:`summarize` computes TTFT, TPOT, E2EL (one value per successful request) and ITL
(one value per gap between chunks of successful requests) — mean, median, p90, p99 — with
:func:`exporters.latency.request_latencies` and :func:`~exporters.latency.itl_gaps_s`, and
goodput with :func:`exporters.slo.judge`: good requests (finished OK and meeting every
objective) per second of the run. There is no second implementation of any metric here.

:func:`parse_slo` reads ``ttft=0.2,itl=0.05`` (seconds; ``itl:p99=0.05`` for a per-request
ITL percentile instead of the largest gap).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from exporters.latency import itl_gaps_s, request_latencies
from exporters.records import RecordBatch, RequestRecord, Status
from exporters.slo import Metric, Objective, SLOError, judge

__all__ = ["format_summary", "parse_slo", "per_request", "summarize"]

F64 = npt.NDArray[np.float64]
_STATS = (("mean", None), ("p50", 50.0), ("p90", 90.0), ("p99", 99.0))


def parse_slo(text: str) -> list[Objective]:
    """``metric[:statistic]=seconds`` pairs, comma-separated; ``SLOError`` naming the part."""
    objectives = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep:
            raise SLOError(f"slo: expected metric=seconds, got {part!r}")
        metric, _, statistic = name.strip().partition(":")
        try:
            threshold = float(value)
        except ValueError:
            raise SLOError(f"slo: {name.strip()}: expected seconds, got {value!r}") from None
        metric = metric.strip().lower()
        if metric not in {m.value for m in Metric}:
            raise SLOError(
                f"slo: metric must be one of {[m.value for m in Metric]}, got {metric!r}"
            )
        objectives.append(Objective(Metric(metric), threshold, statistic or "max"))
    if not objectives:
        raise SLOError(f"slo: expected at least one metric=seconds, got {text!r}")
    return objectives


def _stats_ms(values: F64) -> dict[str, float | None]:
    values = values[~np.isnan(values)]
    out: dict[str, float | None] = {}
    for name, q in _STATS:
        if values.shape[0] == 0:
            out[name] = None
        elif q is None:
            out[name] = float(values.mean()) * 1e3
        else:
            out[name] = float(np.percentile(values, q)) * 1e3
    return out


def summarize(
    records: list[RequestRecord], objectives: list[Objective], duration_s: float
) -> dict[str, Any]:
    """The run's summary (JSON-ready): counts, throughput, latency stats in ms, goodput."""
    batch = RecordBatch.from_records(records)
    lat = request_latencies(batch)
    ok = batch.status == Status.OK
    gaps, rows = itl_gaps_s(batch, validate=False)
    verdicts = judge(batch, objectives, lat)
    duration_s = max(duration_s, 1e-9)
    output = int(lat.output_tokens[ok].sum())
    return {
        "requests": len(batch),
        "completed": int(ok.sum()),
        "failed": int((batch.status == Status.ERROR).sum()),
        "duration_s": duration_s,
        "request_throughput_rps": float(ok.sum()) / duration_s,
        "output_throughput_tok_s": output / duration_s,
        "total_input_tokens": int(batch.prompt_tokens[ok].sum()),
        "total_output_tokens": output,
        "ttft_ms": _stats_ms(lat.ttft_s[ok]),
        "tpot_ms": _stats_ms(lat.tpot_s[ok]),
        "itl_ms": _stats_ms(gaps[ok[rows]]),
        "e2el_ms": _stats_ms(lat.e2el_s[ok]),
        "slo": [
            {"metric": o.metric.value, "statistic": o.statistic, "threshold_s": o.threshold_s}
            for o in objectives
        ],
        "good": verdicts.num_good,
        "goodput_rps": verdicts.num_good / duration_s,
        "attainment_ratio": (
            verdicts.num_good / verdicts.num_judged if verdicts.num_judged else None
        ),
    }


def per_request(
    records: list[RequestRecord], scheduled_s: Mapping[str, float]
) -> list[dict[str, Any]]:
    """One JSON-ready row per request: id, send time in the plan (``scheduled_s`` by request
    id), lengths, status, TTFT/TPOT/E2EL (s) and ITL gaps."""
    batch = RecordBatch.from_records(records)
    lat = request_latencies(batch, validate=False)
    gaps, _ = itl_gaps_s(batch, validate=False)
    starts = np.concatenate(([0], np.cumsum(lat.num_gaps)))
    out = []
    for i, record in enumerate(records):
        out.append(
            {
                "request_id": record.request_id,
                "scheduled_s": scheduled_s.get(record.request_id),
                "status": record.status.name.lower(),
                "reason": record.reason,
                "prompt_tokens": record.prompt_tokens,
                "output_tokens": int(lat.output_tokens[i]),
                "ttft_s": _num(lat.ttft_s[i]),
                "tpot_s": _num(lat.tpot_s[i]),
                "e2el_s": _num(lat.e2el_s[i]),
                "itl_s": gaps[starts[i] : starts[i + 1]].tolist(),
            }
        )
    return out


def _num(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as the lines the CLI prints."""
    lines = [
        f"{'requests sent / completed / failed':<36}{summary['requests']} / "
        f"{summary['completed']} / {summary['failed']}",
        f"{'duration (s)':<36}{summary['duration_s']:.2f}",
        f"{'request throughput (req/s)':<36}{summary['request_throughput_rps']:.2f}",
        f"{'output throughput (tok/s)':<36}{summary['output_throughput_tok_s']:.1f}",
    ]
    for key, title in (
        ("ttft_ms", "TTFT"),
        ("tpot_ms", "TPOT"),
        ("itl_ms", "ITL"),
        ("e2el_ms", "E2EL"),
    ):
        stats = summary[key]
        cells = "  ".join(f"{name} {'-' if v is None else f'{v:.2f}'}" for name, v in stats.items())
        lines.append(f"{title + ' (ms)':<36}{cells}")
    slo = ", ".join(
        f"{o['metric']}{'' if o['statistic'] == 'max' else ':' + o['statistic']}"
        f"<={o['threshold_s'] * 1000:g}ms"
        for o in summary["slo"]
    )
    attainment = summary["attainment_ratio"]
    lines.append(
        f"{'goodput (req/s) for ' + slo:<36}{summary['goodput_rps']:.2f}  "
        f"({summary['good']} good, attainment "
        f"{'-' if attainment is None else f'{attainment:.1%}'})"
    )
    return "\n".join(lines)
