"""The discrete-event core: a fleet of instances replaying a workload in virtual time.

One heap orders every event by ``(virtual time, sequence)``: an instance's next
iteration boundary (stale entries are skipped by version), a KV cache landing on a decode
instance, and a periodic tick (samples, record flushes into the goodput engine, the
policy's plan, progress). Arrivals come from the workload's sorted columns and go first
at equal times. Each arrival is admitted by the policy, routed by the live gateway's
``choose`` (:class:`~serving.sim.cluster.router.Router`) and queued on its instance; a
PD request's prefill completes on its prefill instance, its KV cache crosses NVLink or
RDMA (``kv_transfer_s``, ``min(tp)`` streams) and it decodes on the instance chosen at
arrival. Finished requests become records (:class:`RecordBuilder`) that feed a
:class:`~controlplane.goodput.GoodputEngine` on the virtual clock; the report is its
answer over the whole run. The loop runs until every admitted request has finished.

Deterministic: the workload, the event order and every instance's jitter generator
(seeded by ``(seed, instance index)``) fix the result.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from controlplane.goodput.engine import GoodputEngine
from controlplane.goodput.spec import SLOSpec
from exporters.fleet import PoolRole
from exporters.records import RecordBatch, Status
from exporters.slo import Objective
from serving.gateway.admission import RequestInfo
from serving.gateway.routing import NoInstanceError
from serving.sim.cluster.policy import (
    ClusterSnapshot,
    InstanceView,
    NoControl,
    PolicyError,
    SimPolicy,
)
from serving.sim.cluster.records import RecordBuilder
from serving.sim.cluster.results import SimOptions, SimProgress, SimResult, TimeSeries
from serving.sim.cluster.router import Router
from serving.sim.cluster.spec import ClusterSpec
from serving.sim.cluster.workload import Workload
from serving.sim.coefficients import LinkFit
from serving.sim.instance import Instance, Job, JobMode
from serving.sim.kv import get_link
from serving.sim.latency_model import LatencyModel

__all__ = ["SLO_ID", "Simulator", "slo_spec"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
SLO_ID = "sim"
_STEP, _LANDED, _TICK = 0, 1, 2


def slo_spec(
    objectives: Sequence[Objective], target: float = 0.99, *, name: str = SLO_ID
) -> SLOSpec:
    """The simulator's one SLO: these objectives and target over every request."""
    return SLOSpec(
        id=SLO_ID, name=name, objectives=tuple(objectives), target=target, window_s=28 * 86400.0
    )


_PREFILL = JobMode.PREFILL


class Simulator:
    """A cluster replaying a workload (see the module docstring).

    Example::

        spec = parse_cluster("prefill=2,decode=6,model=llama3.1-8b")
        work = build_workload(load_trace("azure_conv"), rate_scale=2, duration_s=60)
        result = Simulator(spec, work, SimOptions(seed=1)).run()
        result.stats.goodput_rps, result.stats.ttft.p99_s
    """

    def __init__(
        self,
        spec: ClusterSpec,
        workload: Workload,
        options: SimOptions | None = None,
        policy: SimPolicy | None = None,
    ) -> None:
        self.spec = spec
        self.workload = workload
        self.options = options or SimOptions()
        self.policy: SimPolicy = policy or NoControl()
        self.latency = LatencyModel.for_profile(spec.profile)
        seed = self.options.seed
        if spec.colocated:
            names = [f"colocated-{k}" for k in range(spec.num_colocated)]
            roles = [PoolRole.BOTH] * spec.num_colocated
        else:
            names = [f"prefill-{k}" for k in range(spec.num_prefill)]
            names += [f"decode-{k}" for k in range(spec.num_decode)]
            roles = [PoolRole.PREFILL] * spec.num_prefill + [PoolRole.DECODE] * spec.num_decode
        self.instances = [
            Instance(spec.instance, self.latency, name=name, seed=(seed, k))
            for k, name in enumerate(names)
        ]
        self.router = Router(
            names, roles, colocated=spec.colocated, exact=self.options.exact_routing
        )
        model = self.latency.model
        per_gpu = self.latency.kv_bytes_per_token_per_gpu
        self._kv_bytes_per_token = per_gpu * spec.tensor_parallel
        self._per_stream_bytes_per_token = per_gpu  # one stream per rank pair
        self._links = {name: get_link(name) for name in ("nvlink", "rdma-400g")}
        self._nodes = [spec.node_of(k) for k in range(len(names))]
        self._pair_links: dict[tuple[int, int], LinkFit] = {}
        self.engine = GoodputEngine(
            clock=lambda: self.options.epoch_s, recent_rows_cap=1, itl_percentiles=()
        )
        self.engine.set_slos(
            [slo_spec(self.options.objectives, self.options.slo_target, name=f"{model.name} sim")]
        )
        self.records = RecordBuilder(
            epoch_s=self.options.epoch_s,
            model=model.name,
            route="colocated" if spec.colocated else "pd",
            request_id_prefix=self.options.request_id_prefix,
            itl_sample_every=self.options.itl_sample_every,
        )

    # -- helpers ----------------------------------------------------------------------------

    def _transfer_s(self, prompt_tokens: int, src: int, dst: int) -> float:
        link = self._pair_links.get((src, dst))
        if link is None:
            link_name = self.spec.link
            if link_name == "auto":
                link_name = "nvlink" if self._nodes[src] == self._nodes[dst] else "rdma-400g"
            link = self._pair_links[src, dst] = self._links[link_name]
        return link.setup_s + prompt_tokens * self._per_stream_bytes_per_token / link.bytes_per_s

    def _key(self, ids: Sequence[int] | None, prompt_tokens: int) -> str | None:
        """The affinity key of a prompt: its first prefix block, when it holds a whole one."""
        if ids and prompt_tokens >= self.spec.instance.prefix_block_tokens:
            return f"h{ids[0]}"
        return None

    def snapshot(self, now_s: float) -> ClusterSnapshot:
        router = self.router
        views = tuple(
            InstanceView(
                id=inst.name,
                role=router.roles[k],
                waiting=len(inst.waiting),
                running=len(inst.running),
                kv_used_ratio=1.0 - inst.kv.free / inst.kv.capacity,
                prefill_tokens=router.prefill_tokens[k],
                decode_streams=router.decode_streams[k],
            )
            for k, inst in enumerate(self.instances)
        )
        goodput = self.engine.summary(now=self.options.epoch_s + now_s, window="1m")
        return ClusterSnapshot(now_s=now_s, instances=views, goodput=goodput)

    def _apply_plan(self, plan: dict[str, PoolRole]) -> None:
        roles = list(self.router.roles)
        for instance_id, role in plan.items():
            k = self.router.index.get(instance_id)
            if k is None:
                raise PolicyError(f"plan: unknown instance {instance_id!r}")
            try:
                roles[k] = PoolRole(role)
            except ValueError:
                raise PolicyError(
                    f"plan: role of {instance_id} must be one of "
                    f"{[r.value for r in PoolRole]}, got {role!r}"
                ) from None
        if self.spec.colocated and any(r is not PoolRole.BOTH for r in roles):
            raise PolicyError("plan: instances of a colocated cluster keep the role 'both'")
        self.router.set_roles(roles)

    def _sample(self, series: TimeSeries, now_s: float) -> None:
        series.time_s.append(now_s)
        sizes = dict.fromkeys(series.pool_size, 0)
        waiting = dict.fromkeys(series.pool_size, 0)
        running = dict.fromkeys(series.pool_size, 0)
        for pool, inst in zip(self.router.pool_names, self.instances, strict=True):
            sizes[pool] += 1
            waiting[pool] += len(inst.waiting)
            running[pool] += len(inst.running)
        for pool in series.pool_size:
            series.pool_size[pool].append(sizes[pool])
            series.waiting[pool].append(waiting[pool])
            series.running[pool].append(running[pool])

    def _flush(self, now_s: float, kept: list[RecordBatch] | None) -> None:
        if not len(self.records):
            return
        batch = self.records.build()
        self.engine.ingest(batch, validate=False, now=self.options.epoch_s + now_s)
        if kept is not None:
            kept.append(batch)

    # -- the loop ---------------------------------------------------------------------------

    def run(self, progress: Callable[[SimProgress], None] | None = None) -> SimResult:
        """Run to the end (every admitted request finished) and return the result.

        Cyclic garbage collection is paused meanwhile: the loop allocates millions of
        short-lived acyclic objects (jobs, heap entries, small arrays) that reference
        counting frees, and the collector's passes over them cost about 12 % of the run
        while finding next to nothing (docs/simulator.md, Speed). It is re-enabled after.
        """
        enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run(progress)
        finally:
            if enabled:
                gc.enable()

    def _run(self, progress: Callable[[SimProgress], None] | None) -> SimResult:
        wall0 = time.perf_counter()
        options, spec, work = self.options, self.spec, self.workload
        insts, router, records = self.instances, self.router, self.records
        policy = self.policy
        controlled = not isinstance(policy, NoControl)
        plan_every = float(policy.interval_s)
        next_plan = plan_every if math.isfinite(plan_every) else math.inf
        arrivals: list[float] = work.arrival_s.tolist()
        prompts: list[int] = work.prompt_tokens.tolist()
        outputs: list[int] = work.output_tokens.tolist()
        hashes = work.hash_ids
        total = len(arrivals)
        span = arrivals[-1] if arrivals else 0.0
        sample_every = options.sample_interval_s or max(span / 500.0, 1e-3)
        kept: list[RecordBatch] | None = [] if options.keep_records else None
        series = TimeSeries()
        colocated = spec.colocated
        mode = JobMode.FULL if colocated else JobMode.PREFILL
        max_context = insts[0].capacity_tokens  # Instance.fits, inlined
        inf = math.inf
        key_of = self._key
        ids = router.ids
        kv_per_token = self._kv_bytes_per_token
        model_name = self.latency.model.name
        heap: list[tuple[float, int, int, Any, int]] = []  # Any: an instance index or a Job
        push, pop = heapq.heappush, heapq.heappop
        seq = itertools.count()
        push(heap, (0.0, next(seq), _TICK, None, 0))
        next_flush = options.flush_interval_s
        i = in_flight = finished = rejected = errors = events = 0
        now = 0.0
        closed = False
        while True:
            if i < total and (not heap or arrivals[i] <= heap[0][0]):
                now = arrivals[i]
                prompt, output = prompts[i], outputs[i]
                block_ids = hashes[i] if hashes is not None else None
                key = key_of(block_ids, prompt) if block_ids else None
                job = Job(i, now, prompt, output, mode=mode, hash_ids=block_ids)
                i += 1
                if controlled:
                    decision = policy.admit(
                        RequestInfo(
                            request_id=f"{options.request_id_prefix}{job.index}",
                            model=model_name,
                            tenant="",
                            slo="",
                            priority="",
                            prompt_tokens=prompt,
                            max_tokens=output,
                            stream=True,
                            arrival_s=now,
                        )
                    )
                    if not decision.admit:
                        job.finished_s = now
                        records.add(job, Status.REJECTED, decision.reason or "rejected")
                        rejected += 1
                        continue
                if prompt + output > max_context:
                    job.finished_s = now
                    records.add(
                        job,
                        Status.ERROR,
                        f"prompt {prompt} + output {output} tokens exceed the KV capacity of "
                        f"{insts[0].capacity_tokens} tokens",
                    )
                    errors += 1
                    continue
                try:
                    prefill, decode = router.route(prompt, key, now)
                except NoInstanceError as exc:
                    job.finished_s = now
                    records.add(job, Status.ERROR, str(exc))
                    errors += 1
                    continue
                in_flight += 1
                job.tag = decode
                if colocated:
                    router.add_decode_streams(decode, 1)
                    router.pin(key, "", ids[decode])
                    target = decode
                else:
                    router.add_prefill_tokens(prefill, prompt)
                    target = prefill
                inst = insts[target]
                version = inst.version
                inst.submit(job, now)
                if inst.version != version and inst.next_event_s < inf:
                    push(heap, (inst.next_event_s, next(seq), _STEP, target, inst.version))
                continue
            if i == total and not closed:
                # The trace has ended: static and dynamic batches stop waiting to fill.
                closed = True
                for k, inst in enumerate(insts):
                    version = inst.version
                    inst.close(now)
                    if inst.version != version and inst.next_event_s < math.inf:
                        push(heap, (inst.next_event_s, next(seq), _STEP, k, inst.version))
            if not heap:
                break
            at, _, kind, payload, version = pop(heap)
            if kind == _STEP:
                k = payload
                inst = insts[k]
                if version != inst.version:
                    continue  # stale: the instance was replanned (its time is not an event)
            now = at
            events += 1
            if kind == _STEP:
                for job in inst.step(now):
                    if job.mode is _PREFILL:
                        decode = job.tag
                        router.add_prefill_tokens(k, -job.prompt_tokens)
                        router.add_decode_streams(decode, 1)
                        if job.hash_ids:
                            router.pin(key_of(job.hash_ids, job.prompt_tokens), ids[k], ids[decode])
                        job.hand_off(now)
                        job.kv_bytes = job.prompt_tokens * kv_per_token
                        landed = now + self._transfer_s(job.prompt_tokens, k, decode)
                        push(heap, (landed, next(seq), _LANDED, job, 0))
                    else:
                        router.add_decode_streams(k, -1)
                        records.add(job)
                        in_flight -= 1
                        finished += 1
                if inst.next_event_s < math.inf:
                    push(heap, (inst.next_event_s, next(seq), _STEP, k, inst.version))
            elif kind == _LANDED:
                job = payload
                job.kv_end_s = now
                target = job.tag
                inst = insts[target]
                version = inst.version
                inst.submit(job, now)
                if inst.version != version and inst.next_event_s < math.inf:
                    push(heap, (inst.next_event_s, next(seq), _STEP, target, inst.version))
            else:
                self._sample(series, now)
                if now >= next_flush:
                    self._flush(now, kept)
                    next_flush = now + options.flush_interval_s
                if now >= next_plan:
                    self._apply_plan(dict(policy.plan(self.snapshot(now))))
                    next_plan = now + plan_every
                if progress is not None:
                    progress(SimProgress(now, i, finished + rejected + errors, total))
                if i < total or in_flight:
                    push(heap, (now + sample_every, next(seq), _TICK, None, 0))
        end_s = max(now, span)
        self._flush(end_s, kept)
        if progress is not None:
            progress(SimProgress(end_s, i, finished + rejected + errors, total))
        return self._result(
            end_s=end_s,
            wall_s=time.perf_counter() - wall0,
            num_finished=finished,
            num_rejected=rejected,
            num_errors=errors,
            num_events=events,
            series=series,
            kept=kept,
        )

    def _result(
        self,
        *,
        end_s: float,
        wall_s: float,
        num_finished: int,
        num_rejected: int,
        num_errors: int,
        num_events: int,
        series: TimeSeries,
        kept: list[RecordBatch] | None,
    ) -> SimResult:
        work, insts = self.workload, self.instances
        window = min(max(math.ceil(end_s) + 60.0, 1.0), 28 * 86400.0)
        stats = self.engine.query(SLO_ID, window, now=self.options.epoch_s + end_s)
        busy = sum(inst.stats.busy_s for inst in insts)
        ttft = self.records.ttft_samples
        itl = self.records.itl_samples
        return SimResult(
            spec=self.spec,
            options=self.options,
            workload_name=work.name,
            stats=stats,
            num_requests=len(work),
            num_finished=num_finished,
            num_rejected=num_rejected,
            num_errors=num_errors,
            prompt_tokens=int(work.prompt_tokens.sum()),
            cached_tokens=sum(inst.stats.cached_tokens for inst in insts),
            output_tokens=stats.output_tokens,
            num_preemptions=sum(inst.stats.num_preemptions for inst in insts),
            num_iterations=sum(inst.stats.num_iterations for inst in insts),
            num_runs=sum(inst.stats.num_runs for inst in insts),
            num_events=num_events,
            busy_ratio=busy / (end_s * len(insts)) if end_s > 0 else 0.0,
            end_s=end_s,
            wall_s=wall_s,
            series=series,
            ttft_s=np.concatenate(ttft) if ttft else np.zeros(0),
            itl_sample_s=np.concatenate(itl) if itl else np.zeros(0),
            records=kept,
        )
