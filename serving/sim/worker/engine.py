"""One simulated engine instance stepping in real time: the heart of the sim worker.

:class:`SimEngine` runs an :class:`~serving.sim.instance.Instance` (the instance model the
cluster simulator uses: batching strategy, token budget, KV blocks, preemption, prefix
cache) against the event loop's clock. Virtual time is the loop's monotonic time since
:meth:`SimEngine.start`; the instance steps one iteration per event
(``max_segment_steps=1``), so every token exists at the end of the iteration that made it:

* a timer (``loop.call_at``) fires at the instance's next iteration end; the engine commits
  every iteration that has ended by then (``Instance.step`` at its exact modelled time) and
  wakes the requests that got tokens. The next iteration starts at the modelled end of the
  previous one, not when the timer ran, so a late loop delays tokens but never stretches
  the schedule;
* a request arriving at real time *t* first lets the instance commit what ended before *t*,
  then joins the queue at *t* (the order the cluster simulator keeps: a boundary before an
  arrival is processed first);
* a decode leg whose KV cache was computed on another worker waits the modelled KV
  transfer (``kv_transfer_s`` over the configured link, one stream per GPU of the
  instance) and then joins as a ``DECODE`` job: no prefill here, every token from a
  decode iteration, its prompt counted as externally transferred.

Everything runs on the event loop's thread; the only cross-thread reader (the fleet
agent) reads :attr:`SimEngine.load`, a frozen snapshot replaced after every change.
"""

from __future__ import annotations

import asyncio
import bisect
import math
import time
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from serving.sim.instance import Instance, InstanceConfig, Job, JobMode
from serving.sim.kv import get_link
from serving.sim.latency_model import LatencyModel
from serving.sim.worker.prompts import PromptInfo
from serving.workers.load import WorkerLoad

__all__ = ["EngineCounters", "EngineListener", "SimEngine", "SimRequest", "TooLongError"]

_INF = math.inf
# Histogram buckets (seconds) of vLLM's own latency histograms.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
# How late the loop committed an iteration after its modelled end (seconds).
LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


class TooLongError(ValueError):
    """A request whose prompt plus output can never fit this instance."""


@dataclass(slots=True)
class Histogram:
    """Cumulative-bucket histogram counts (Prometheus semantics)."""

    bounds: tuple[float, ...]
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = np.zeros(len(self.bounds), dtype=np.int64)

    def observe(self, values: np.ndarray) -> None:
        if not values.size:
            return
        index = np.searchsorted(np.asarray(self.bounds), values, side="left")
        self.counts += np.bincount(index, minlength=len(self.bounds) + 1)[: len(self.bounds)]
        self.total += float(values.sum())
        self.count += int(values.size)

    def observe_one(self, value: float) -> None:
        index = bisect.bisect_left(self.bounds, value)
        if index < len(self.bounds):
            self.counts[index] += 1
        self.total += value
        self.count += 1


@dataclass(slots=True)
class EngineCounters:
    """What ``/metrics`` exports (vLLM's counters and histograms, docs/sim-worker.md)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    local_compute_tokens: int = 0
    local_cache_hit_tokens: int = 0
    external_kv_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    external_queries: int = 0
    external_hits: int = 0
    preemptions: int = 0
    finished: dict[str, int] = field(default_factory=dict)
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    itl: Histogram = field(default_factory=lambda: Histogram(ITL_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    step_lag: Histogram = field(default_factory=lambda: Histogram(LAG_BUCKETS))


@dataclass(eq=False, slots=True)
class SimRequest:
    """One request on the engine. ``seen`` counts the tokens the engine has made (the HTTP
    side streams them and counts ``sent``); ``event`` is set whenever ``seen`` grows or the
    request ends. Times are virtual seconds."""

    request_id: str
    prompt: PromptInfo
    max_tokens: int
    job: Job
    arrival_s: float
    external_tokens: int = 0
    seen: int = 0
    sent: int = 0
    done: bool = False
    aborted: bool = False
    loading: bool = False
    first_token_s: float = _INF
    event: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def output_tokens(self) -> int:
        return self.job.output_tokens

    @property
    def finish_reason(self) -> str:
        if self.aborted:
            return "abort"
        return "length" if self.job.generated >= self.max_tokens else "stop"

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens not computed here: prefix-cache hits and transferred KV."""
        return self.job.cached_tokens + self.external_tokens


class EngineListener(Protocol):
    """Told of each request's first token and end (virtual seconds), on the loop thread."""

    def first_token(self, request: SimRequest, at_s: float) -> None: ...
    def finished(self, request: SimRequest, at_s: float) -> None: ...


class SimEngine:
    """The instance model in real time (see the module docstring).

    ``config`` is the instance's batching and KV configuration (``max_segment_steps`` is
    forced to 1); ``link`` the KV link a transferred cache crosses (``nvlink`` or
    ``rdma-400g``); ``seed`` seeds the step-time jitter.
    """

    def __init__(
        self,
        latency: LatencyModel,
        config: InstanceConfig,
        *,
        link: str = "nvlink",
        seed: int = 0,
        name: str = "sim",
    ) -> None:
        self.latency = latency
        self.config = replace(config, max_segment_steps=1)
        self.instance = Instance(self.config, latency, name=name, seed=seed)
        self.link = get_link(link)
        self.kv_bytes_per_token = latency.kv_bytes_per_token_per_gpu * latency.tensor_parallel
        self.counters = EngineCounters()
        self.load = WorkerLoad()
        self._requests: dict[int, SimRequest] = {}
        self._num_loading = 0
        self._next_index = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._t0 = 0.0
        self._vnow = 0.0  # the latest virtual time the instance has been driven to
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = _INF
        self.wall_at_zero_s = 0.0  # time.time() at virtual 0
        self.listener: EngineListener | None = None

    # -- clock ------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Bind to the running loop; virtual time 0 is now."""
        self._loop = loop or asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self.wall_at_zero_s = time.time()

    def now(self) -> float:
        """Virtual seconds since :meth:`start`."""
        assert self._loop is not None, "SimEngine.start() first"
        return self._loop.time() - self._t0

    @property
    def max_context_tokens(self) -> int:
        """The most tokens (prompt plus output) one request can hold: the KV capacity."""
        return self.instance.capacity_tokens

    @property
    def transfer_s_per_token(self) -> float:
        return self.latency.kv_bytes_per_token_per_gpu / self.link.bytes_per_s

    def transfer_s(self, prompt_tokens: int) -> float:
        """Seconds the prompt's KV takes to arrive (one stream per GPU, as the cluster
        simulator moves it)."""
        return self.link.setup_s + prompt_tokens * self.transfer_s_per_token

    # -- requests ---------------------------------------------------------------------

    def submit(
        self,
        request_id: str,
        prompt: PromptInfo,
        *,
        max_tokens: int,
        output_tokens: int,
        remote_kv: bool = False,
    ) -> SimRequest:
        """Queue a request now; with ``remote_kv`` its prompt's KV is fetched first."""
        inst = self.instance
        if not inst.fits(prompt.tokens, output_tokens):
            raise TooLongError(
                f"prompt: {prompt.tokens} prompt tokens + {output_tokens} output tokens exceed "
                f"this instance's KV capacity of {inst.capacity_tokens} tokens"
            )
        now = self.now()
        self._catch_up(now)
        index = self._next_index
        self._next_index += 1
        mode = JobMode.DECODE if remote_kv else JobMode.FULL
        job = Job(
            index,
            self._vnow,
            prompt.tokens,
            output_tokens,
            mode=mode,
            hash_ids=list(prompt.block_ids) if prompt.block_ids and not remote_kv else None,
        )
        request = SimRequest(request_id, prompt, max_tokens, job, self._vnow)
        self._requests[index] = request
        if remote_kv:
            request.external_tokens = prompt.tokens
            request.loading = True
            self._num_loading += 1
            land = self._vnow + self.transfer_s(prompt.tokens)
            assert self._loop is not None
            self._loop.call_at(self._t0 + land, self._landed, request, land)
        else:
            inst.submit(job, self._vnow)
        self._changed()
        return request

    def abort(self, request: SimRequest) -> None:
        """The client went away: the request leaves at its next iteration boundary (its
        last token is the one that iteration makes), or at once if it is still queued."""
        if request.done:
            return
        self._catch_up(self.now())
        request.aborted = True
        job = request.job
        if request.loading:
            self._finish(request, self._vnow)
        elif job in self.instance.waiting:
            self.instance.waiting.remove(job)
            self._finish(request, self._vnow)
        else:
            job.output_tokens = min(job.output_tokens, job.generated + 1)
        self._changed()

    # -- the loop ---------------------------------------------------------------------

    def _landed(self, request: SimRequest, land_s: float) -> None:
        request.loading = False
        self._num_loading -= 1
        if request.done:  # aborted while the KV was on its way
            return
        at = max(land_s, self._vnow)
        self._catch_up(at)
        request.job.kv_end_s = at
        self.instance.submit(request.job, at)
        self._changed()

    def _on_timer(self, at: float) -> None:
        self._timer, self._timer_at = None, _INF
        self._catch_up(max(self.now(), at))
        self._changed()

    def _catch_up(self, until_s: float) -> None:
        """Commit every iteration that ended by ``until_s``."""
        inst = self.instance
        wall = self.now()
        while inst.next_event_s <= until_s:
            at = inst.next_event_s
            self.counters.step_lag.observe_one(max(0.0, wall - at))
            preempted = inst.stats.num_preemptions
            done = inst.step(at)
            self._vnow = at
            self.counters.preemptions += inst.stats.num_preemptions - preempted
            self._emit(inst.running, at)
            if done:
                self._emit(done, at)
                for job in done:
                    request = self._requests.get(job.index)
                    if request is not None:
                        self._finish(request, at)
        self._vnow = max(self._vnow, until_s)

    def _emit(self, jobs: list[Job], at: float) -> None:
        requests, counters = self._requests, self.counters
        for job in jobs:
            request = requests.get(job.index)
            if request is None or job.generated <= request.seen:
                continue
            if not request.seen:
                self._first_token(request, at)
            counters.generation_tokens += job.generated - request.seen
            request.seen = job.generated
            request.event.set()

    def _first_token(self, request: SimRequest, at: float) -> None:
        request.first_token_s = at
        c, job = self.counters, request.job
        external = request.external_tokens
        cached = job.cached_tokens
        c.prompt_tokens += job.prompt_tokens
        c.external_kv_tokens += external
        c.local_cache_hit_tokens += cached
        c.local_compute_tokens += job.prompt_tokens - cached - external
        c.prefix_queries += job.prompt_tokens - external
        c.prefix_hits += cached
        c.ttft.observe(np.array([at - request.arrival_s]))
        if self.listener is not None:
            self.listener.first_token(request, at)

    def _finish(self, request: SimRequest, at: float) -> None:
        request.done = True
        self._requests.pop(request.job.index, None)
        reason = request.finish_reason
        c = self.counters
        c.finished[reason] = c.finished.get(reason, 0) + 1
        c.e2e.observe(np.array([at - request.arrival_s]))
        times = request.job.emission_times()
        if times.size > 1:
            c.itl.observe(np.diff(times))
        if self.listener is not None:
            self.listener.finished(request, at)
        request.event.set()

    def note_transfer_query(self, prompt_tokens: int, hit: bool) -> None:
        """Count a lookup for a prompt's KV on another worker (vLLM's external prefix
        cache queries and hits, in tokens)."""
        self.counters.external_queries += prompt_tokens
        if hit:
            self.counters.external_hits += prompt_tokens

    def _changed(self) -> None:
        """Re-arm the timer for the instance's next iteration end; refresh the load."""
        inst = self.instance
        kv = inst.kv
        self.load = WorkerLoad(
            num_requests_running=len(inst.running),
            num_requests_waiting=len(inst.waiting) + self._num_loading,
            kv_cache_usage_ratio=1.0 - kv.available / kv.capacity,
        )
        at = inst.next_event_s
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = at
        if at < _INF:
            assert self._loop is not None
            self._timer = self._loop.call_at(self._t0 + at, self._on_timer, at)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
