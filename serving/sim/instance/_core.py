"""The mechanics of one simulated instance: its state, KV blocks, plans and commits.

:class:`InstanceCore` holds what every batching strategy shares — the queue and the
running batch, the KV block pool, the iteration in progress (one iteration, or a *run* of
decode iterations with all their end times), committing it (token times, phase times,
block growth, finishes), and admission, preemption and prefix-cache bookkeeping.
:class:`~serving.sim.instance.Instance` adds the event-loop contract and the strategies'
schedulers on top.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import numpy.typing as npt

from serving.sim.instance._kv import BlockPool
from serving.sim.instance._steps import Seed, StepTimer
from serving.sim.instance.config import InstanceConfig, Strategy
from serving.sim.instance.job import Job, JobMode
from serving.sim.kv import kv_capacity_tokens
from serving.sim.latency_model import LatencyModel

__all__ = ["IDLE", "ITERATION", "RUN", "TIMER", "InstanceCore", "InstanceStats"]

F64 = npt.NDArray[np.float64]
_INF = math.inf
IDLE, ITERATION, RUN, TIMER = range(4)  # what the instance is doing
_PREFILL = JobMode.PREFILL  # enum attribute lookups are slow in hot loops


class InstanceStats:
    """Counters of one instance since it started (plain attributes, read freely)."""

    __slots__ = (
        "busy_s",
        "cached_tokens",
        "computed_prompt_tokens",
        "num_iterations",
        "num_preemptions",
        "num_runs",
    )

    def __init__(self) -> None:
        self.num_iterations = 0  # iterations, whether alone or in a run
        self.num_runs = 0  # runs of decode iterations (one event each)
        self.num_preemptions = 0
        self.computed_prompt_tokens = 0  # prefill tokens computed (recomputation included)
        self.cached_tokens = 0  # prompt tokens read from the prefix cache
        self.busy_s = 0.0


class InstanceCore:
    """State and mechanics shared by every strategy (see the module docstring)."""

    def __init__(
        self,
        config: InstanceConfig,
        latency: LatencyModel,
        *,
        name: str = "",
        seed: Seed = None,
    ) -> None:
        self.config = config
        self.latency = latency
        self.name = name
        bs = config.block_size
        tokens = config.kv_capacity_tokens
        if tokens is None:
            tokens = kv_capacity_tokens(
                latency.model, latency.tensor_parallel, memory_utilization=config.memory_utilization
            )
        if tokens < bs:
            raise ValueError(
                f"{latency.name}: the weights leave no room for a KV cache "
                f"(kv_capacity_tokens = {tokens}); use more tensor parallelism"
            )
        self.kv = BlockPool(tokens // bs, config.prefix_block_tokens // bs)
        self._max_context = self.kv.capacity * bs
        self._max_steps = config.max_segment_steps or 1 << 62
        self.timer = StepTimer(latency, config.jitter_ratio, seed)
        self.stats = InstanceStats()
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []
        self.next_event_s = _INF
        self.version = 0
        self.closed = False
        self._kind = IDLE
        self._start_s = 0.0
        self._chunks: list[tuple[Job, int]] = []
        self._decodes: list[Job] = []
        self._run_ends: F64 = np.zeros(0)
        self._run_steps = 0
        self._seats = 0  # static/dynamic: the batch's seats, finished sequences included
        self._frozen_context = 0  # static/dynamic: KV tokens of finished batch members
        self._batching = config.strategy in (Strategy.STATIC, Strategy.DYNAMIC)

    # -- plans ----------------------------------------------------------------------------

    def _set_next(self, time_s: float) -> None:
        if time_s != self.next_event_s:
            self.next_event_s = time_s
            self.version += 1

    def _idle(self, timer_s: float = _INF) -> None:
        self._kind = TIMER if timer_s < _INF else IDLE
        self._set_next(timer_s)

    def _start_iteration(
        self, now: float, chunks: list[tuple[Job, int]], decodes: list[Job]
    ) -> None:
        tokens = attention = 0
        for job, n in chunks:
            tokens += n
            attention += n * n + 2 * n * job.computed
            if job.prefill_start_s != job.prefill_start_s:
                job.prefill_start_s = now
        context = 0
        for job in decodes:
            context += job.computed
        seconds = self.timer.iteration_s(tokens, attention, len(decodes), context)
        self._kind, self._start_s = ITERATION, now
        self._chunks, self._decodes = chunks, decodes
        self._set_next(now + seconds)

    def _start_run(self, now: float) -> bool:
        """Decode iterations of the whole running batch (every sequence decoding) until it
        changes; ``False``, with nothing started, when not even one fits in the KV cache
        (the caller preempts, then tries again)."""
        running = self.running
        steps = self._max_steps
        context = 0
        for job in running:
            left = job.output_tokens - job.generated
            if left < steps:  # noqa: PLR1730 - a compare is cheaper than min() per sequence
                steps = left
            context += job.computed
        # Each sequence needs at most steps // bs + 1 new blocks: test exactly only when
        # that bound does not fit.
        kv = self.kv
        if len(running) * (steps // self.config.block_size + 1) > kv.free + kv.evictable:
            steps = self._kv_steps(steps)
            if not steps:
                return False
        batch = len(running)
        if self._batching:
            batch, context = self._seats, context + self._frozen_context
        ends = self.timer.decode_run_ends(now, batch, context, len(running), steps)
        self._kind, self._start_s = RUN, now
        self._run_ends, self._run_steps = ends, steps
        self._set_next(ends.item(steps - 1))
        return True

    def _kv_steps(self, steps: int) -> int:
        """The most decode iterations (<= ``steps``, maybe 0) whose new blocks fit."""
        bs = self.config.block_size
        computed = np.array([j.computed for j in self.running], dtype=np.int64)
        held = np.array([j.blocks + j.shared_blocks for j in self.running], dtype=np.int64)
        available = self.kv.available

        def need(k: int) -> int:
            return int(np.maximum(-(-(computed + k) // bs) - held, 0).sum())

        lo, hi = 0, steps  # need(0) == 0 fits; find the largest k that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if need(mid) <= available:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _truncate(self, now: float) -> None:
        """End the current run at the first iteration boundary at or after ``now``."""
        ends = self._run_ends
        index = int(ends[: self._run_steps].searchsorted(now))  # the method: no dispatch
        if index + 1 < self._run_steps:
            self._run_steps = index + 1
            self._set_next(ends.item(index))

    # -- commits --------------------------------------------------------------------------

    def _end_iteration(self, end_s: float) -> list[Job]:
        self.stats.num_iterations += 1
        self.stats.busy_s += end_s - self._start_s
        done: list[Job] = []
        stamp: F64 | None = None
        for job in self._decodes:
            job.computed += 1
            job.generated += 1
            if stamp is None:
                stamp = np.array([end_s])
            job.emissions.append(stamp)
            if job.generated >= job.output_tokens:
                done.append(job)
        for job, n in self._chunks:
            job.computed += n
            self.stats.computed_prompt_tokens += n
            if job.computed < job.prefill_target:
                continue
            self._prefilled(job, end_s)
            if job.mode is _PREFILL:
                done.append(job)
                continue
            if stamp is None:
                stamp = np.array([end_s])
            job.emissions.append(stamp)
            job.generated += 1
            if job.generated >= job.output_tokens:
                done.append(job)
        self._chunks, self._decodes = [], []
        if done:
            self._retire(done, end_s)
        return done

    def _end_run(self) -> list[Job]:
        steps = self._run_steps
        ends = self._run_ends
        stamps = ends if steps == ends.shape[0] else ends[:steps]
        end_s = ends.item(steps - 1)
        stats = self.stats
        stats.num_iterations += steps
        stats.num_runs += 1
        stats.busy_s += end_s - self._start_s
        bs = self.config.block_size
        grown = 0
        done: list[Job] = []
        for job in self.running:  # once per run: locals rather than attribute round trips
            computed = job.computed + steps
            job.computed = computed
            generated = job.generated + steps
            job.generated = generated
            job.emissions.append(stamps)
            blocks = -(-computed // bs) - job.shared_blocks
            if blocks > job.blocks:
                grown += blocks - job.blocks
                job.blocks = blocks
            if generated >= job.output_tokens:
                done.append(job)
        taken = self.kv.allocate(grown)
        assert taken, "a run never outgrows the KV blocks it was planned with"
        if done:
            self._retire(done, end_s)
        return done

    def _prefilled(self, job: Job, end_s: float) -> None:
        """The job's prompt (and recomputed tokens) are in the KV cache."""
        if job.prefill_end_s != job.prefill_end_s:
            job.prefill_end_s = end_s
        ids = job.hash_ids
        if ids and self.config.prefix_caching:
            full = min(len(ids), job.prompt_tokens // self.config.prefix_block_tokens)
            new = ids[len(job.hash_refs) : full]
            if new:
                self.kv.insert(new)
                job.hash_refs.extend(new)
                moved = len(new) * self.kv.blocks_per_prefix
                job.shared_blocks += moved
                job.blocks -= moved

    def _retire(self, done: list[Job], end_s: float) -> None:
        running = self.running
        for job in done:
            if job.mode is not _PREFILL:
                job.finished_s = end_s
                if self._batching:
                    self._frozen_context += job.computed
            self._release(job)
            running.remove(job)

    def _release(self, job: Job) -> None:
        self.kv.release(job.blocks)
        if job.hash_refs:
            self.kv.release_prefix(job.hash_refs)
        job.blocks = job.shared_blocks = 0
        job.hash_refs = []

    def _preempt(self, job: Job) -> None:
        """Recompute preemption: drop the job's KV and queue it first again."""
        self._release(job)
        job.computed = 0
        job.prefill_target = job.prompt_tokens
        if job.mode is not _PREFILL:
            job.prefill_target += job.generated
        job.num_preemptions += 1
        self.stats.num_preemptions += 1
        self.waiting.appendleft(job)

    # -- admission ------------------------------------------------------------------------

    def _grow(self, job: Job, tokens: int) -> bool:
        """Hold KV blocks for ``tokens`` tokens of ``job``'s context."""
        need = -(-tokens // self.config.block_size) - job.shared_blocks - job.blocks
        if need <= 0:
            return True
        if not self.kv.allocate(need):
            return False
        job.blocks += need
        return True

    def _admit_prefill(self, job: Job, tokens: int) -> bool:
        """Start ``job``'s prefill: read its cached prefix, and hold blocks for ``tokens``
        more tokens after it (0: the whole rest of the prompt). ``False``, with the job left
        as it was, when the KV cache cannot take them."""
        ids = job.hash_ids
        config = self.config
        if ids and config.prefix_caching and job.computed == 0 and not job.hash_refs:
            limit = (job.prefill_target - 1) // config.prefix_block_tokens
            hit = self.kv.match(ids, limit)
            if hit:
                refs = list(ids[:hit])
                self.kv.acquire(refs)
                job.hash_refs = refs
                job.shared_blocks = hit * self.kv.blocks_per_prefix
                job.computed = hit * config.prefix_block_tokens
        rest = job.prefill_target - job.computed
        if self._grow(job, job.computed + (min(tokens, rest) if tokens else rest)):
            if job.num_preemptions == 0 and not job.cached_tokens and job.computed:
                job.cached_tokens = job.computed
                self.stats.cached_tokens += job.computed
            return True
        if job.hash_refs and not job.blocks:  # leave it as it was queued
            self._release(job)
            job.computed = 0
        return False

    def _decode_all(self, now: float) -> bool:
        """Start a run of the running batch, preempting first if blocks are short;
        ``False`` when nothing is left running."""
        if not self.running:
            return False
        if not self._start_run(now):
            self._hold_next_tokens()
            if not self.running:
                return False
            started = self._start_run(now)
            assert started, "each sequence holds its next token's block"
        return True

    def _hold_next_tokens(self) -> None:
        """Before decoding: every running sequence holds a block for its next token,
        preempting the newest running ones (recompute) while blocks are short."""
        running = self.running
        i = 0
        while i < len(running):
            job = running[i]
            if self._grow(job, job.computed + 1):
                i += 1
                continue
            self._preempt(running.pop())
