"""``goodput sim``: replay a trace on a simulated H100 cluster in virtual time.

    goodput sim --trace azure_conv \\
        --cluster 'prefill=16,decode=48,gpu=h100,model=llama3.1-70b,tp=4' \\
        --rate-scale 20 --duration 600 --slo ttft=0.2,itl=0.05 --seed 1 --out runs/sim \\
        [--policy none]

``--colocated N`` simulates N instances that serve both phases instead of PD pools. The
summary table goes to stdout; with ``--out DIR`` the JSON report (``report.json``), the
table (``summary.txt``) and the plots (``ttft_cdf.png``, ``itl_cdf.png``, ``pools.png``)
are written there. Exit codes: 0 done, 2 invalid input. See docs/simulator.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import IO, Annotated, Any

import typer

__all__ = ["SimCommandError", "run_sim", "sim"]


class SimCommandError(ValueError):
    """An input ``goodput sim`` cannot run with; the message names it."""


def run_sim(
    *,
    trace: str,
    cluster: str,
    colocated: int = 0,
    rate_scale: float = 1.0,
    duration_s: float = 60.0,
    start_s: float = 0.0,
    slo: str = "ttft=0.2,itl=0.05",
    slo_target: float = 0.99,
    seed: int = 0,
    policy: str = "none",
    out: Path | None = None,
    plots: bool = True,
    progress: bool = False,
    stream: IO[str] | None = None,
) -> dict[str, Any]:
    """Run one simulation, print its summary to ``stream`` (stdout) and return the JSON
    report; raises :class:`SimCommandError` for invalid input."""
    from exporters.slo import SLOError
    from serving.bench.report import parse_slo
    from serving.sim.cluster import (
        ClusterSpecError,
        PolicyError,
        SimOptions,
        Simulator,
        build_workload,
        load_policy,
        parse_cluster,
    )
    from serving.sim.cluster.report import build_report, format_summary
    from serving.traces import TraceError, load_trace

    stream = stream or sys.stdout
    if not 0 < slo_target < 1:
        raise SimCommandError(f"slo-target must be in (0, 1), got {slo_target}")
    try:
        objectives = tuple(parse_slo(slo))
        spec = parse_cluster(cluster, colocated=colocated)
        chosen = load_policy(policy)
        workload = build_workload(  # last: the only input that reads a file
            load_trace(trace), rate_scale=rate_scale, duration_s=duration_s, start_s=start_s
        )
    except (SLOError, ClusterSpecError, TraceError, PolicyError) as exc:
        raise SimCommandError(str(exc)) from None
    if not len(workload):
        raise SimCommandError(f"no request of {trace} arrives within {duration_s:g} s")
    options = SimOptions(objectives=objectives, slo_target=slo_target, seed=seed)
    print(
        f"goodput sim: {len(workload)} requests of {workload.name or trace} over "
        f"{duration_s:g} s at {rate_scale:g}x on {spec.describe()}",
        file=stream,
        flush=True,
    )
    simulator = Simulator(spec, workload, options, chosen)
    result = _run_with_progress(simulator, duration_s) if progress else simulator.run()
    report = build_report(
        result,
        trace=trace,
        cluster=cluster,
        rate_scale=rate_scale,
        duration_s=duration_s,
        start_s=start_s,
        policy=policy,
    )
    summary = format_summary(report)
    print(summary, file=stream, flush=True)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
        (out / "summary.txt").write_text(summary + "\n", encoding="utf-8")
        written = ["report.json", "summary.txt"]
        if plots:
            from serving.sim.cluster.plots import write_plots

            written += [p.name for p in write_plots(result, out)]
        print(f"goodput sim: wrote {', '.join(written)} to {out}", file=stream, flush=True)
    return report


def _run_with_progress(simulator: Any, duration_s: float) -> Any:
    """Run with a rich progress bar on stderr: virtual time against the duration."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from serving.sim.cluster import SimProgress

    columns = (
        TextColumn("virtual {task.completed:8.1f} s"),
        BarColumn(),
        TextColumn("{task.fields[done]} of {task.fields[requests]} requests done"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("simulating", total=duration_s, done=0, requests=0)

        def update(p: SimProgress) -> None:
            bar.update(task, completed=min(p.now_s, duration_s), done=p.finished, requests=p.total)

        return simulator.run(progress=update)


def sim(
    *,
    trace: Annotated[
        str, typer.Option(help="azure_conv, azure_code, mooncake, or a .csv/.jsonl file")
    ] = "azure_conv",
    cluster: Annotated[
        str,
        typer.Option(
            help="pools and hardware: prefill=N,decode=M,gpu=h100,model=llama3.1-8b,tp=1 "
            "[,strategy=chunked|continuous|dynamic|static,...] (docs/simulator.md)"
        ),
    ] = "prefill=2,decode=6,gpu=h100,model=llama3.1-8b,tp=1",
    colocated: Annotated[
        int, typer.Option(min=0, help="N colocated instances instead of prefill/decode pools")
    ] = 0,
    rate_scale: Annotated[
        float, typer.Option(min=1e-6, help="times the trace's request rate")
    ] = 1.0,
    duration: Annotated[
        float, typer.Option(min=0.001, help="virtual seconds of arrivals (the trace repeats)")
    ] = 60.0,
    start: Annotated[float, typer.Option(min=0, help="seconds into the trace to start")] = 0.0,
    slo: Annotated[
        str, typer.Option(help="objectives in seconds: ttft=0.2,itl=0.05 (itl:p99=… too)")
    ] = "ttft=0.2,itl=0.05",
    slo_target: Annotated[float, typer.Option(help="the SLO's target good ratio")] = 0.99,
    seed: Annotated[int, typer.Option(help="seed of the step-time jitter")] = 0,
    out: Annotated[
        Path | None, typer.Option(help="folder for report.json, summary.txt and plots")
    ] = None,
    policy: Annotated[
        str, typer.Option(help="'none', or package.module:attribute of a SimPolicy")
    ] = "none",
    plots: Annotated[bool, typer.Option(help="write PNG plots to --out")] = True,
    progress: Annotated[bool, typer.Option(help="show a progress bar")] = True,
) -> None:
    """Simulate a GPU cluster replaying a trace in virtual time; print goodput and latency."""
    try:
        run_sim(
            trace=trace,
            cluster=cluster,
            colocated=colocated,
            rate_scale=rate_scale,
            duration_s=duration,
            start_s=start,
            slo=slo,
            slo_target=slo_target,
            seed=seed,
            policy=policy,
            out=out,
            plots=plots,
            progress=progress and sys.stderr.isatty(),
        )
    except SimCommandError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
