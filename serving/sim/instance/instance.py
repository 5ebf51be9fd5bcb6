"""One engine instance stepping in virtual time: batching, KV blocks, preemption, prefix cache.

An :class:`Instance` is driven from outside by an event loop (the cluster simulator, or
:func:`~serving.sim.instance.serve` for one instance). The contract:

* :meth:`Instance.submit` puts a :class:`~serving.sim.instance.Job` in the queue at
  ``now``; an idle instance starts work at once, a running decode batch that can take the
  job stops at the iteration boundary after ``now`` so the job joins there.
* :attr:`Instance.next_event_s` is when the instance next needs the loop (the end of its
  current iteration or run of iterations, a batching timer, or ``inf`` when idle);
  :attr:`Instance.version` changes whenever it does, so a heap of ``(time, version)`` can
  skip stale entries.
* :meth:`Instance.step` at exactly ``next_event_s`` commits the work that ends then,
  schedules the next iteration, and returns the jobs that completed: finished ones
  (``finished_s`` set) and, for ``PREFILL`` jobs, the ones whose prompt is computed.

Decode iterations of a batch that nothing joins or leaves are one *run*: one event, one
numpy expression for all their end times (``_steps.StepTimer.decode_run_ends``), and one
shared array of token times per run appended to each job's emissions. A run ends at the
first finish, when the KV cache would run out, at ``max_segment_steps``, or early when a
job arrives that may join (``submit`` truncates it at the next boundary).

Example::

    inst = Instance(InstanceConfig(strategy=Strategy.CONTINUOUS),
                    LatencyModel.for_profile("h100-llama3.1-8b"))
    done = serve(inst, [Job(0, 0.0, 1000, 50), Job(1, 0.01, 300, 20)])
    ttft_s = done[0].emissions[0][0] - done[0].arrival_s
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

__all__ = ["Instance", "InstanceStats"]

F64 = npt.NDArray[np.float64]
_INF = math.inf
_IDLE, _ITERATION, _RUN, _TIMER = range(4)
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


class Instance:
    """A vLLM-like engine instance in virtual time (see the module docstring).

    ``config.kv_capacity_tokens`` ``None`` sizes the KV cache from the model; ``seed`` (an
    int or a sequence of ints, as numpy's ``default_rng`` takes) seeds the step-time jitter;
    ``name`` labels it in errors and reports.
    """

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
        self._kind = _IDLE
        self._start_s = 0.0
        self._chunks: list[tuple[Job, int]] = []
        self._decodes: list[Job] = []
        self._run_ends: F64 = np.zeros(0)
        self._run_steps = 0
        self._seats = 0  # static/dynamic: the batch's seats, finished sequences included
        self._frozen_context = 0  # static/dynamic: KV tokens of finished batch members
        self._batching = config.strategy in (Strategy.STATIC, Strategy.DYNAMIC)
        self._schedule = {
            Strategy.CHUNKED: self._schedule_chunked,
            Strategy.CONTINUOUS: self._schedule_continuous,
        }.get(config.strategy, self._schedule_batch)

    def __repr__(self) -> str:
        return (
            f"Instance({self.name!r}, {self.config.strategy.value}, waiting={len(self.waiting)}, "
            f"running={len(self.running)}, next={self.next_event_s:.6f})"
        )

    # -- the loop's interface -------------------------------------------------------------

    @property
    def capacity_tokens(self) -> int:
        return self.kv.capacity * self.config.block_size

    def fits(self, prompt_tokens: int, output_tokens: int) -> bool:
        """Whether a request can ever run here: its whole context fits the KV cache."""
        return prompt_tokens + output_tokens <= self._max_context

    def submit(self, job: Job, now: float) -> None:
        """Queue ``job`` at ``now`` (see the module docstring)."""
        if job.prompt_tokens + job.output_tokens > self._max_context:
            raise ValueError(
                f"{self.name or 'instance'}: job {job.index} needs "
                f"{job.prompt_tokens + job.output_tokens} tokens of KV cache, more than its "
                f"capacity of {self.capacity_tokens}"
            )
        if job.queued_s != job.queued_s:  # nan: first queue of this request
            job.queued_s = now
        self.waiting.append(job)
        kind = self._kind
        if kind == _RUN:
            if not self._batching and len(self.running) < self.config.max_num_seqs:
                self._truncate(now)
        elif kind != _ITERATION:
            self._schedule(now)

    def close(self, now: float) -> None:
        """No more jobs will come: static and dynamic batching start a partial batch."""
        self.closed = True
        if self._kind in (_IDLE, _TIMER) and self.waiting:
            self._schedule(now)

    def step(self, now: float) -> list[Job]:
        """Commit what ends at ``now`` (= :attr:`next_event_s`), schedule the next work and
        return the jobs that completed."""
        if now != self.next_event_s:
            raise ValueError(f"step at {now!r}, but the next event is at {self.next_event_s!r}")
        kind = self._kind
        if kind == _ITERATION:
            done = self._end_iteration(now)
        elif kind == _RUN:
            done = self._end_run()
        else:
            done = []
        self._kind = _IDLE
        self._schedule(now)
        return done

    # -- plans ----------------------------------------------------------------------------

    def _set_next(self, time_s: float) -> None:
        if time_s != self.next_event_s:
            self.next_event_s = time_s
            self.version += 1

    def _idle(self, timer_s: float = _INF) -> None:
        self._kind = _TIMER if timer_s < _INF else _IDLE
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
        self._kind, self._start_s = _ITERATION, now
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
        self._kind, self._start_s = _RUN, now
        self._run_ends, self._run_steps = ends, steps
        self._set_next(float(ends[-1]))
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
        index = int(np.searchsorted(ends[: self._run_steps], now, side="left"))
        if index + 1 < self._run_steps:
            self._run_steps = index + 1
            self._set_next(float(ends[index]))

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
        end_s = float(stamps[-1])
        self.stats.num_iterations += steps
        self.stats.num_runs += 1
        self.stats.busy_s += end_s - self._start_s
        bs = self.config.block_size
        grown = 0
        done: list[Job] = []
        for job in self.running:
            job.computed += steps
            job.generated += steps
            job.emissions.append(stamps)
            blocks = -(-job.computed // bs) - job.shared_blocks
            if blocks > job.blocks:
                grown += blocks - job.blocks
                job.blocks = blocks
            if job.generated >= job.output_tokens:
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

    # -- scheduling -----------------------------------------------------------------------

    def _schedule_chunked(self, now: float) -> None:
        """vLLM V1: running sequences first (decodes, then prefill chunks in order), then
        queued ones, within the iteration's token budget."""
        config = self.config
        running, waiting = self.running, self.waiting
        if running and (not waiting or len(running) >= config.max_num_seqs):
            for job in running:
                if job.computed < job.prefill_target:
                    break
            else:  # only decodes, and nobody can join: a run, if the KV cache allows
                if self._start_run(now):
                    return
        budget = config.max_num_batched_tokens
        chunks: list[tuple[Job, int]] = []
        decodes: list[Job] = []
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            job = running[i]
            prefilling = job.needs_prefill
            n = min(job.prefill_target - job.computed, budget) if prefilling else 1
            while not self._grow(job, job.computed + n):
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is job:
                    break
            else:
                if prefilling:
                    chunks.append((job, n))
                else:
                    decodes.append(job)
                budget -= n
                i += 1
        while not preempted and waiting and budget > 0 and len(running) < config.max_num_seqs:
            job = waiting[0]
            if job.needs_prefill:
                if not self._admit_prefill(job, budget):
                    break
                n = min(job.prefill_target - job.computed, budget)
                chunks.append((job, n))
                budget -= n
            else:
                if not self._grow(job, job.computed + 1):
                    break
                decodes.append(job)
                budget -= 1
            waiting.popleft()
            running.append(job)
        if chunks or (decodes and len(decodes) < len(running)):
            self._start_iteration(now, chunks, decodes)  # budget left some out
        elif not decodes:
            self._idle()
        else:
            started = self._start_run(now)
            assert started, "each sequence holds its next token's block"

    def _schedule_continuous(self, now: float) -> None:
        """vLLM V0 without chunking: whole prompts of queued requests in a prefill
        iteration that takes priority; otherwise the running batch decodes."""
        config = self.config
        running, waiting = self.running, self.waiting
        chunks: list[tuple[Job, int]] = []
        tokens = 0
        while waiting and len(running) < config.max_num_seqs:
            job = waiting[0]
            if job.needs_prefill:
                if chunks and tokens + job.prefill_target - job.computed > (
                    config.max_num_batched_tokens
                ):
                    break
                if not self._admit_prefill(job, 0):
                    break
                n = job.prefill_target - job.computed
                chunks.append((job, n))
                tokens += n
            elif not self._grow(job, job.computed + 1):
                break
            waiting.popleft()
            running.append(job)
        if chunks:
            self._start_iteration(now, chunks, [])
        elif not self._decode_all(now):
            self._idle()

    def _schedule_batch(self, now: float) -> None:
        """Static and dynamic batching: a batch runs to its end before the next starts."""
        config = self.config
        if self._decode_all(now):
            return
        self._seats = self._frozen_context = 0
        waiting = self.waiting
        if not waiting:
            self._idle()
            return
        deadline = _INF
        if config.strategy is Strategy.DYNAMIC:
            deadline = waiting[0].queued_s + config.batch_window_s
        if len(waiting) < config.batch_size and not self.closed and now < deadline:
            self._idle(deadline)
            return
        chunks: list[tuple[Job, int]] = []
        batch: list[Job] = []
        while waiting and len(batch) < config.batch_size:
            job = waiting[0]
            if job.needs_prefill:
                if not self._admit_prefill(job, 0):
                    break
                chunks.append((job, job.prefill_target - job.computed))
            elif not self._grow(job, job.computed + 1):
                break
            waiting.popleft()
            batch.append(job)
        if not batch:
            self._idle()
            return
        self.running = batch
        self._seats = len(batch)
        if chunks:
            self._start_iteration(now, chunks, [])
        else:
            self._decode_all(now)
