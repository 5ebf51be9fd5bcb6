"""The stack demo's scenario: overload without control, then the same overload with the loops.

On a running stack (control plane; one prefill and two decode workers; a gateway
``demo-open`` that takes no commands, as a stack without Goodput's loops, and a gateway
``demo-gateway`` that registers and applies the control plane's admission policies) it:

1. **measures** the idle stack: a few requests one at a time at the mean prompt through
   ``demo-open`` (class ``critical``), judged against the SLO — the SLO is met when the
   stack is not overloaded — and their median TTFT, which sets the lone prefill worker's
   capacity (1 / TTFT requests/s, an underestimate: TTFT also holds the KV hand-off);
2. **overloads it without control**: the planner paused (``POST /automation/pause``),
   ``--overload`` × that capacity of long prompts and short outputs, half ``standard`` and
   half ``sheddable`` (plus a few ``critical``), through ``demo-open``, for ``open_s``;
3. waits for what is in flight, then **switches control on**: the planner resumed and the
   same traffic through ``demo-gateway``, for ``control_s``. The control plane's actions
   are printed as they happen (:class:`goodput.demo_actions.ActionFeed`): each admission
   policy (version, what each class is refused above), the first refusal, each planner
   move (its reason, drain → set_role → resume, the observed effect);
4. prints the two phases side by side, from the client's outcomes.

Every ``interval_s`` one line: the phase, the client's counts so far (sent, served, shed
with 429, failed) and the control plane's goodput API over ``window`` (goodput,
attainment, availability, p99 TTFT), and the pools.
"""

from __future__ import annotations

import functools
import math
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from goodput.demo_actions import ActionFeed, pools
from goodput.demo_client import OpenLoop, Outcome, closed_loop

__all__ = ["HEADER", "PhaseResult", "ScenarioOptions", "ScenarioStack", "run_scenario"]

Say = Callable[[str], None]
HEADER = (
    "  time  phase       sent served  shed failed | goodput attainment availability"
    "  p99 TTFT | pools"
)
MIX = {"critical": 0.1, "standard": 0.45, "sheddable": 0.45}
#: The largest share of the TTFT objective that the idle TTFT may take (see _fit_ttft).
IDLE_SHARE = 0.7
WIDTH = 20


@dataclass(frozen=True, slots=True)
class ScenarioOptions:
    slo: str  # the SLO's name: sent as x-goodput-slo, so admission protects it
    model: str  # the served model name
    prompt_tokens: tuple[int, int] = (1000, 1600)
    max_tokens: int = 16
    overload: float = 2.5  # offered load ÷ the measured capacity of one prefill worker
    idle_requests: int = 6
    open_s: float = 60.0
    control_s: float = 120.0
    drain_s: float = 60.0
    interval_s: float = 5.0
    window: str = "10s"
    seed: int = 0
    # Raise the SLO's TTFT objective when the idle stack is too slow for it (the demo's own
    # SLO; one given by the user is left as it is).
    fit_slo: bool = True


@dataclass(frozen=True, slots=True)
class ScenarioStack:
    """What the scenario drives: URLs, keys (viewer, operator), the gateways by role."""

    cp_url: str
    viewer_key: str
    operator_key: str
    open_gateway: str  # URL of the gateway without control
    control_gateway: str  # URL of the gateway that applies policies
    control_gateway_id: str
    alive: Callable[[], str | None]  # None while every process runs, else what exited


@dataclass(frozen=True, slots=True)
class PhaseResult:
    name: str
    seconds: float
    outcomes: list[Outcome]
    moves: int
    policies: int

    def counts(self, ttft_s: float, itl_s: float | None) -> dict[str, float]:
        served = [o for o in self.outcomes if o.status == 200 and o.complete]
        good = [o for o in served if _good(o, ttft_s, itl_s)]
        shed = sum(o.status == 429 for o in self.outcomes)
        cancelled = sum(o.cancelled for o in self.outcomes)
        sent = len(self.outcomes)
        return {
            "sent": sent,
            "served": len(served),
            "shed": shed,
            "cancelled": cancelled,
            "failed": sent - len(served) - shed - cancelled,
            "good": len(good),
            "goodput": len(good) / self.seconds,
            "attainment": len(good) / max(len(served), 1),
            "availability": (sent - shed) / max(sent, 1),
            "critical_shed": sum(
                o.status == 429 and o.priority == "critical" for o in self.outcomes
            ),
        }


def _good(outcome: Outcome, ttft_s: float, itl_s: float | None) -> bool:
    if outcome.ttft_s is None or outcome.ttft_s > ttft_s:
        return False
    return itl_s is None or outcome.max_itl_s is None or outcome.max_itl_s <= itl_s


def _thresholds(slo: Mapping[str, Any]) -> tuple[float, float | None]:
    by_metric = {o["metric"]: float(o["threshold_s"]) for o in slo["objectives"]}
    return by_metric.get("ttft", float("inf")), by_metric.get("itl")


def run_scenario(stack: ScenarioStack, options: ScenarioOptions, stop: threading.Event,
                 say: Say) -> list[PhaseResult]:  # fmt: skip
    """Run the scenario (see the module); the phases run, in order (fewer when ``stop``)."""
    viewer = {"Authorization": f"Bearer {stack.viewer_key}"}
    operator = {"Authorization": f"Bearer {stack.operator_key}"}
    with httpx.Client(base_url=stack.cp_url, headers=viewer, timeout=10.0) as client:
        slo = client.get(f"/api/v1/slos/{options.slo}").raise_for_status().json()
        ttft_s, itl_s = _thresholds(slo)
        target = float(slo["target"])
        # Paused first: the planner must not act on the idle measurement either.
        client.post("/api/v1/automation/pause", json={"reason": "demo: phase without control"},
                    headers=operator).raise_for_status()  # fmt: skip
        capacity = _measure_idle(stack, options, ttft_s, itl_s, say)
        if options.fit_slo and 1.0 / capacity > IDLE_SHARE * ttft_s:
            ttft_s = _fit_ttft(client, operator, slo, idle_s=1.0 / capacity, ttft_s=ttft_s,
                               say=say)  # fmt: skip
        rate = options.overload * capacity
        say(f"goodput demo: offering {rate:.2f} req/s ({options.overload:g}x), prompts "
            f"{options.prompt_tokens[0]}-{options.prompt_tokens[1]} tokens, "
            f"{options.max_tokens} output tokens, classes {MIX}")  # fmt: skip
        feed = ActionFeed(client, stack.control_gateway_id, options.slo)
        feed.poll()  # what happened before the run is not news
        results: list[PhaseResult] = []
        phases = (("no control", stack.open_gateway, options.open_s),
                  ("control", stack.control_gateway, options.control_s))  # fmt: skip
        for k, (name, url, seconds) in enumerate(phases):
            if stop.is_set():
                break
            if name == "control":
                feed.rules = ""  # the next policy is news: it now shapes the traffic
                client.post("/api/v1/automation/resume", json={"reason": "demo: control on"},
                            headers=operator).raise_for_status()  # fmt: skip
                say("goodput demo: control ON: planner resumed, traffic through "
                    f"{stack.control_gateway_id} (admission policies)")  # fmt: skip
            else:
                say("goodput demo: control OFF: planner paused, traffic through demo-open "
                    "(no admission policy)")  # fmt: skip
            say(HEADER)
            loop = OpenLoop(url, options.model, options.slo, rate, options.prompt_tokens,
                            options.max_tokens, mix=MIX, seed=options.seed + k,
                            id_prefix=f"demo-{int(time.time())}-{k}")  # fmt: skip
            moves_before, policies_before = feed.moves_done, feed.policies
            elapsed = _phase(
                loop,
                name,
                seconds,
                options=options,
                stack=stack,
                client=client,
                feed=feed,
                stop=stop,
                say=say,
            )
            # demo-open takes no policy: those acked meanwhile by demo-gateway shaped nothing.
            policies = feed.policies - policies_before if name == "control" else 0
            results.append(PhaseResult(name, elapsed, list(loop.outcomes),
                                       feed.moves_done - moves_before, policies))  # fmt: skip
        say("")
        for line in comparison(results, ttft_s, itl_s, target):
            say(line)
        return results


def _fit_ttft(client: httpx.Client, operator: Mapping[str, str], slo: Mapping[str, Any],
              *, idle_s: float, ttft_s: float, say: Say) -> float:  # fmt: skip
    """Raise the SLO's TTFT objective so that the idle TTFT is :data:`IDLE_SHARE` of it (to
    the next 100 ms): on a machine slower than the one the demo's SLO was written for, an
    SLO the idle stack misses would make every request infeasible and leave the loops
    nothing to show. Returns the new objective."""
    fitted = math.ceil(idle_s / IDLE_SHARE * 10) / 10
    objectives = [
        {"metric": o["metric"], "statistic": o["statistic"],
         "threshold_s": fitted if o["metric"] == "ttft" else o["threshold_s"]}
        for o in slo["objectives"]
    ]  # fmt: skip
    client.patch(f"/api/v1/slos/{slo['name']}", json={"objectives": objectives},
                 headers=dict(operator)).raise_for_status()  # fmt: skip
    say(f"goodput demo: the idle TTFT ({idle_s:.2f} s) is over {IDLE_SHARE:.0%} of the SLO's "
        f"{ttft_s:g} s on this machine: its TTFT objective is now {fitted:g} s, so that the "
        "SLO holds when the stack is not overloaded (docs/demo.md)")  # fmt: skip
    return fitted


def _measure_idle(stack: ScenarioStack, options: ScenarioOptions, ttft_s: float,
                  itl_s: float | None, say: Say) -> float:  # fmt: skip
    """Requests/s one prefill worker serves (1 / median idle TTFT); says whether the SLO
    holds on the idle stack."""
    mean = sum(options.prompt_tokens) // 2
    send = functools.partial(closed_loop, stack.open_gateway, model=options.model,
                             slo=options.slo, prompt_tokens=mean,
                             max_tokens=options.max_tokens)  # fmt: skip
    send(count=2, id_prefix=f"demo-warm-{int(time.time())}")
    idle = send(count=options.idle_requests, id_prefix=f"demo-{int(time.time())}")
    served = [o for o in idle if o.status == 200 and o.ttft_s is not None]
    if not served:
        raise RuntimeError(f"the idle stack served none of {len(idle)} requests: {idle[:1]}")
    ttft = statistics.median(o.ttft_s or 0.0 for o in served)
    itls = [o.max_itl_s for o in served if o.max_itl_s is not None]
    good = sum(_good(o, ttft_s, itl_s) for o in served)
    say(f"goodput demo: idle stack, {len(idle)} requests of {mean} prompt tokens one at a "
        f"time: {good}/{len(idle)} meet the SLO, TTFT median {ttft * 1000:.0f} ms, largest "
        f"gap median {statistics.median(itls) * 1000 if itls else 0:.0f} ms; one prefill "
        f"worker serves about {1 / ttft:.2f} req/s")  # fmt: skip
    return 1.0 / ttft


def _phase(loop: OpenLoop, name: str, seconds: float, *, options: ScenarioOptions,
           stack: ScenarioStack,
           client: httpx.Client, feed: ActionFeed, stop: threading.Event,
           say: Say) -> float:  # fmt: skip
    loop.start()
    started = time.monotonic()
    next_line = started + 2.0
    first_refusal = True
    while not stop.is_set():
        now = time.monotonic()
        if now - started >= seconds:
            break
        problem = stack.alive()
        if problem:
            loop.stop(drain_s=0.0)
            raise RuntimeError(problem)
        for line in feed.poll(policies=name == "control"):
            say(line)
        if first_refusal:
            shed = next((o for o in list(loop.outcomes) if o.status == 429), None)
            if shed is not None and shed.error:
                first_refusal = False
                say(f"  >> first 429 (Retry-After {shed.retry_after} s): "
                    f"{shed.error.get('message', '')}")  # fmt: skip
        if now >= next_line:
            say(_line(client, loop, name, now - started, options.window))
            next_line += options.interval_s
        stop.wait(1.0)
    sent_for = time.monotonic() - started
    say(f"goodput demo: {name}: stopped sending; waiting for {loop.in_flight()} requests "
        "in flight")  # fmt: skip
    loop.stop(drain_s=0.0 if stop.is_set() else 60.0)
    for line in feed.poll(policies=name == "control"):
        say(line)
    say(_line(client, loop, name, time.monotonic() - started, options.window))
    return sent_for


def _line(client: httpx.Client, loop: OpenLoop, name: str, elapsed_s: float,
          window: str) -> str:  # fmt: skip
    outcomes = list(loop.outcomes)
    served = sum(o.status == 200 and o.complete for o in outcomes)
    shed = sum(o.status == 429 for o in outcomes)
    failed = len(outcomes) - served - shed - sum(o.cancelled for o in outcomes)
    head = (f"{elapsed_s:5.0f} s  {name:<10} {loop.sent:5d} {served:6d} {shed:5d} "
            f"{failed:6d} |")  # fmt: skip
    try:
        data = client.get("/api/v1/goodput", params={"window": window}).raise_for_status()
        stats = data.json()["data"][0]
        members = client.get("/api/v1/fleet", params={"kind": "worker"}).raise_for_status()
        split = pools(members.json()["data"])
    except (httpx.HTTPError, IndexError, KeyError, ValueError) as exc:
        return f"{head} (control plane: {type(exc).__name__})"
    p99 = stats["ttft"]["p99_s"]

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:.1%}"

    return (
        f"{head} {stats['goodput_rps']:7.2f} {pct(stats['attainment_ratio']):>10} "
        f"{pct(stats.get('availability_ratio')):>12}  "
        f"{'-' if p99 is None else f'{p99 * 1000:.0f} ms':>8} | {split}"
    )


def comparison(results: list[PhaseResult], ttft_s: float, itl_s: float | None,
               target: float) -> list[str]:  # fmt: skip
    """The phases side by side (client-side, the SLO's thresholds)."""
    if not results:
        return []
    counts = [r.counts(ttft_s, itl_s) for r in results]
    rows: list[tuple[str, Callable[[dict[str, float], PhaseResult], str]]] = [
        ("requests sent", lambda c, r: f"{c['sent']:.0f}"),
        ("served (200, complete)", lambda c, r: f"{c['served']:.0f}"),
        ("shed (429)", lambda c, r: f"{c['shed']:.0f} (critical {c['critical_shed']:.0f})"),
        ("failed", lambda c, r: f"{c['failed']:.0f}"),
        ("cancelled after the drain", lambda c, r: f"{c['cancelled']:.0f}"),
        ("goodput (good req/s)", lambda c, r: f"{c['goodput']:.2f}"),
        (f"attainment (target {target:.0%})", lambda c, r: f"{c['attainment']:.1%}"),
        ("availability", lambda c, r: f"{c['availability']:.1%}"),
        ("planner moves", lambda c, r: f"{r.moves}"),
        ("admission policies applied", lambda c, r: f"{r.policies}"),
    ]
    head = f"{'':28}" + "".join(f"{r.name:>{WIDTH}}" for r in results)
    lines = [f"Comparison (client-side, {results[0].seconds:.0f} s and "
             f"{results[-1].seconds:.0f} s of the same offered load):", head]  # fmt: skip
    for label, cell in rows:
        cells = (cell(c, r) for c, r in zip(counts, results, strict=True))
        lines.append(f"{label:28}" + "".join(f"{text:>{WIDTH}}" for text in cells))
    for result in results:
        failed = [o for o in result.outcomes if not o.cancelled and (
            o.status not in (200, 429) or (o.status == 200 and not o.complete))]  # fmt: skip
        if failed:
            first = failed[0]
            why = (first.error or {}).get("message", "stream ended without [DONE]")
            lines.append(f"first failure ({result.name}): HTTP {first.status}: {why}"[:300])
    return lines
