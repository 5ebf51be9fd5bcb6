"""The simulation's report: the goodput engine's numbers, as JSON and as a summary table.

Every latency percentile, count, rate and ratio comes from the
:class:`~controlplane.goodput.GoodputEngine` that judged the emitted records (one
implementation of the maths); the report only adds what the simulator alone knows —
the cluster, preemptions, prefix-cache hits, events, and how fast it ran.
"""

from __future__ import annotations

import math
from typing import Any

from serving.sim.cluster.results import SimResult

__all__ = ["REPORT_VERSION", "build_report", "format_summary"]

REPORT_VERSION = 1
_METRICS = (("ttft", "TTFT"), ("itl", "ITL"), ("tpot", "TPOT"), ("e2el", "E2EL"))


def build_report(result: SimResult, **context: Any) -> dict[str, Any]:
    """A JSON-ready dict of ``result`` (``context``: extra keys under ``"run"``, e.g. the
    command-line options)."""
    spec, options, stats = result.spec, result.options, result.stats
    instance = spec.instance
    return {
        "version": REPORT_VERSION,
        "cluster": {
            "description": spec.describe(),
            "profile": spec.profile,
            "prefill": spec.num_prefill,
            "decode": spec.num_decode,
            "colocated": spec.num_colocated,
            "gpus": spec.num_gpus,
            "tensor_parallel": spec.tensor_parallel,
            "link": spec.link,
            "strategy": instance.strategy.value,
            "max_num_seqs": instance.max_num_seqs,
            "max_num_batched_tokens": instance.max_num_batched_tokens,
            "batch_size": instance.batch_size,
            "batch_window_s": instance.batch_window_s,
            "prefix_caching": instance.prefix_caching,
            "jitter_ratio": instance.jitter_ratio,
        },
        "slo": {
            "objectives": [
                {"metric": o.metric.value, "statistic": o.statistic, "threshold_s": o.threshold_s}
                for o in options.objectives
            ],
            "target": options.slo_target,
        },
        "run": {"seed": options.seed, "workload": result.workload_name, **context},
        "goodput": stats.as_dict(),
        "simulation": {
            "requests": result.num_requests,
            "finished": result.num_finished,
            "rejected": result.num_rejected,
            "errors": result.num_errors,
            "prompt_tokens": result.prompt_tokens,
            "cached_tokens": result.cached_tokens,
            "prefix_hit_ratio": (
                result.cached_tokens / result.prompt_tokens if result.prompt_tokens else 0.0
            ),
            "output_tokens": result.output_tokens,
            "preemptions": result.num_preemptions,
            "iterations": result.num_iterations,
            "decode_runs": result.num_runs,
            "events": result.num_events,
            "busy_ratio": result.busy_ratio,
            "virtual_s": result.end_s,
            "wall_s": result.wall_s,
            "requests_per_wall_s": result.num_requests / result.wall_s if result.wall_s else 0.0,
            "tokens_per_wall_s": result.output_tokens / result.wall_s if result.wall_s else 0.0,
        },
    }


def _ms(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 1e3:.1f}"


def format_summary(report: dict[str, Any]) -> str:
    """The report as the lines ``goodput sim`` prints."""
    g, sim, cluster = report["goodput"], report["simulation"], report["cluster"]
    slo = ", ".join(
        f"{o['metric']}{'' if o['statistic'] == 'max' else ':' + o['statistic']}"
        f"<={o['threshold_s'] * 1000:g}ms"
        for o in report["slo"]["objectives"]
    )
    attainment = g["attainment_ratio"]
    lines = [
        f"{'cluster':<30}{cluster['description']}",
        f"{'requests':<30}{sim['requests']} ({sim['finished']} finished, "
        f"{sim['rejected']} rejected, {sim['errors']} errors)",
        f"{'virtual time (s)':<30}{sim['virtual_s']:.1f}",
        f"{'goodput (req/s)':<30}{g['goodput_rps']:.2f}  for {slo}",
        f"{'attainment':<30}"
        f"{'-' if attainment is None else f'{attainment:.2%}'}  "
        f"({g['good']} good of {g['requests']} judged, target {report['slo']['target']:g})",
        f"{'throughput':<30}{g['throughput_rps']:.2f} req/s, "
        f"{g['output_tokens_per_s']:.0f} output tok/s",
        f"{'preemptions':<30}{sim['preemptions']}",
        f"{'prefix cache hits':<30}{sim['prefix_hit_ratio']:.1%} of prompt tokens",
        f"{'latency (ms)':<30}{'p50':>9}{'p90':>9}{'p99':>9}",
    ]
    for key, title in _METRICS:
        p = g[key]
        lines.append(
            f"{'  ' + title:<30}{_ms(p['p50_s']):>9}{_ms(p['p90_s']):>9}{_ms(p['p99_s']):>9}"
        )
    lines.append(
        f"{'simulation speed':<30}{sim['wall_s']:.1f} s wall, "
        f"{sim['requests_per_wall_s']:.0f} req/s, {sim['tokens_per_wall_s']:.0f} tok/s"
    )
    return "\n".join(lines)
