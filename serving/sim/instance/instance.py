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

from serving.sim.instance._core import IDLE, ITERATION, RUN, TIMER, InstanceCore, InstanceStats
from serving.sim.instance._steps import Seed
from serving.sim.instance.config import InstanceConfig, Strategy
from serving.sim.instance.job import Job
from serving.sim.latency_model import LatencyModel

__all__ = ["Instance", "InstanceStats"]

_INF = math.inf


class Instance(InstanceCore):
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
        super().__init__(config, latency, name=name, seed=seed)
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
        if kind == RUN:
            if not self._batching and len(self.running) < self.config.max_num_seqs:
                self._truncate(now)
        elif kind != ITERATION:
            self._schedule(now)

    def close(self, now: float) -> None:
        """No more jobs will come: static and dynamic batching start a partial batch."""
        self.closed = True
        if self._kind in (IDLE, TIMER) and self.waiting:
            self._schedule(now)

    def step(self, now: float) -> list[Job]:
        """Commit what ends at ``now`` (= :attr:`next_event_s`), schedule the next work and
        return the jobs that completed."""
        if now != self.next_event_s:
            raise ValueError(f"step at {now!r}, but the next event is at {self.next_event_s!r}")
        kind = self._kind
        if kind == ITERATION:
            done = self._end_iteration(now)
        elif kind == RUN:
            done = self._end_run()
        else:
            done = []
        self._kind = IDLE
        self._schedule(now)
        return done

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
        bs = config.block_size
        chunks: list[tuple[Job, int]] = []
        decodes: list[Job] = []
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            job = running[i]
            left = job.prefill_target - job.computed
            if left > 0:
                n = left if left < budget else budget
                fits = self._grow(job, job.computed + n)
            else:  # a decode; _grow inlined: it mostly holds its next token's block already
                n = 1
                fits = -(-(job.computed + 1) // bs) <= job.shared_blocks + job.blocks or (
                    self._grow(job, job.computed + 1)
                )
            while not fits:
                victim = running.pop()
                self._preempt(victim)
                preempted = True
                if victim is job:
                    break
                fits = self._grow(job, job.computed + n)
            else:
                if left > 0:
                    chunks.append((job, n))
                else:
                    decodes.append(job)
                budget -= n
                i += 1
        max_seqs = config.max_num_seqs
        while not preempted and waiting and budget > 0 and len(running) < max_seqs:
            job = waiting[0]
            if job.computed < job.prefill_target:
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
