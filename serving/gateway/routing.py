"""The gateway's routing decision as a pure function: which prefill and decode instance.

:func:`choose` takes a snapshot of the instances (:class:`InstanceState`), what the gateway
knows of the request (:class:`RouteRequest`) and the time, and returns a
:class:`RouteDecision`. It does no I/O, keeps no state and reads no clock, so the same code
routes live traffic, unit tests and the cluster simulator (docs/architecture.md).

The rules, in order:

1. **Eligible**: an instance serves a pool when its ``role`` is that pool or ``both``, it is
   ``healthy``, it is not in ``request.exclude`` (instances that already failed this
   request), and its cool-down after a failure (``down_until_s``) has passed.
2. **Least outstanding work**: prefill work is the prompt tokens the instance still has to
   prefill (``prefill_tokens``); decode work is its running streams (``decode_streams``),
   each weighted by ``decode_stream_tokens`` (an average output length), plus the prompt
   tokens it is loading (``prefill_tokens``, which a decode instance also spends on KV
   loads or recompute). Ties go to the instance listed first.
3. **Prefix affinity**: a request whose ``affinity_key`` was routed before goes back to the
   same instance (:attr:`RouteRequest.affinity`), where its prefix is cached, unless that
   instance is ineligible or has more than ``affinity_slack_tokens`` of work beyond the
   least-loaded one (then the load wins and the caller re-pins the key).

In PD mode (``colocated=False``) the decision names a prefill and a decode instance; an
instance with role ``both`` may be picked for either, but never for both of one request
while another decode instance is eligible. In colocated mode only ``decode`` is set: one
instance serves the whole request.

Example::

    decision = choose(states, RouteRequest(prompt_tokens=900, affinity_key=key), now_s)
    prefill_url, decode_url = decision.prefill.url, decision.decode.url
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from exporters.fleet import PoolRole

__all__ = [
    "AFFINITY_BLOCK_TOKENS",
    "AFFINITY_PREFIX_CHARS",
    "InstanceState",
    "NoInstanceError",
    "RouteDecision",
    "RouteRequest",
    "affinity_key",
    "choose",
]

#: vLLM's CPU KV block: prefix caching and KV transfer work in whole blocks of this size.
AFFINITY_BLOCK_TOKENS = 128
#: Prompt text hashed for affinity when the prompt is text (≈ one 128-token block).
AFFINITY_PREFIX_CHARS = 512

_Work = Callable[["InstanceState"], int]  # the work an instance has, in tokens


class NoInstanceError(LookupError):
    """No eligible instance for a pool; the message names the pool and why."""


@dataclass(frozen=True, slots=True)
class InstanceState:
    """One upstream instance as the router sees it at one moment.

    ``prefill_tokens``: prompt tokens in flight on it (prefill requests, or loads on a
    decode instance); ``decode_streams``: streams it is decoding now. ``down_until_s``: it
    failed recently and is skipped until then (same clock as ``now_s``).
    """

    id: str
    url: str
    role: PoolRole = PoolRole.BOTH
    healthy: bool = True
    prefill_tokens: int = 0
    decode_streams: int = 0
    down_until_s: float = 0.0

    def serves(self, pool: PoolRole) -> bool:
        return self.role is PoolRole.BOTH or self.role is pool


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What routing needs to know of a request.

    ``prompt_tokens`` may be an estimate (the gateway does not tokenize text prompts).
    ``affinity`` maps an affinity key to the ``(prefill_id, decode_id)`` it was last routed
    to (``prefill_id`` is ``""`` in colocated mode).
    """

    prompt_tokens: int = 0
    affinity_key: str | None = None
    affinity: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    exclude: frozenset[str] = frozenset()
    colocated: bool = False


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """Where a request goes. ``prefill`` is ``None`` in colocated mode. ``affinity_hit``
    says whether the decode choice followed the request's affinity key."""

    prefill: InstanceState | None
    decode: InstanceState
    affinity_hit: bool = False


def choose(
    instances: Sequence[InstanceState],
    request: RouteRequest,
    now_s: float,
    *,
    decode_stream_tokens: int = 256,
    affinity_slack_tokens: int = 4096,
) -> RouteDecision:
    """Pick the instances for ``request`` (see the module docstring for the rules).

    Raises :class:`NoInstanceError` when a pool has no eligible instance.
    """
    pinned = request.affinity.get(request.affinity_key) if request.affinity_key else None

    def eligible(pool: PoolRole) -> list[InstanceState]:
        return [
            s
            for s in instances
            if s.serves(pool)
            and s.healthy
            and s.id not in request.exclude
            and s.down_until_s <= now_s
        ]

    def decode_work(s: InstanceState) -> int:
        return s.decode_streams * decode_stream_tokens + s.prefill_tokens

    def prefill_work(s: InstanceState) -> int:
        return s.prefill_tokens

    def pick(
        candidates: list[InstanceState], work: _Work, pinned_id: str | None, pool: PoolRole
    ) -> tuple[InstanceState, bool]:
        if not candidates:
            raise NoInstanceError(_why_none(instances, request, now_s, pool))
        best = min(candidates, key=work)  # min keeps the first of equals
        if pinned_id:
            for s in candidates:
                if s.id == pinned_id and work(s) - work(best) <= affinity_slack_tokens:
                    return s, True
        return best, False

    decoders = eligible(PoolRole.DECODE)
    if request.colocated:
        decode, hit = pick(decoders, decode_work, pinned[1] if pinned else None, PoolRole.DECODE)
        return RouteDecision(prefill=None, decode=decode, affinity_hit=hit)
    prefill, _ = pick(
        eligible(PoolRole.PREFILL), prefill_work, pinned[0] if pinned else None, PoolRole.PREFILL
    )
    # Disaggregation means two instances: keep the prefill one out of the decode choice
    # when any other decode instance can take the request.
    others = [s for s in decoders if s.id != prefill.id] or decoders
    decode, hit = pick(others, decode_work, pinned[1] if pinned else None, PoolRole.DECODE)
    return RouteDecision(prefill=prefill, decode=decode, affinity_hit=hit)


def _why_none(
    instances: Sequence[InstanceState], request: RouteRequest, now_s: float, pool: PoolRole
) -> str:
    serving = [s for s in instances if s.serves(pool)]
    if not serving:
        return f"no {pool.value} instance is configured (instances: {[s.id for s in instances]})"
    reasons = []
    for s in serving:
        if not s.healthy:
            reasons.append(f"{s.id}: unhealthy")
        elif s.id in request.exclude:
            reasons.append(f"{s.id}: already failed this request")
        else:
            reasons.append(f"{s.id}: cooling down for {s.down_until_s - now_s:.1f} s")
    return f"no eligible {pool.value} instance ({'; '.join(reasons)})"


def affinity_key(prompt: object) -> str | None:
    """The prefix-affinity key of a prompt, or ``None`` when it is too short to share.

    Token-id prompts (a list of ints) hash their whole leading 128-token blocks (the unit
    vLLM caches and transfers); text prompts hash their first
    :data:`AFFINITY_PREFIX_CHARS` characters (the gateway does not tokenize). Chat messages
    hash the text of the messages in order. Other shapes (several prompts) have no key.
    """
    if isinstance(prompt, str):
        if len(prompt) < AFFINITY_PREFIX_CHARS:
            return None
        data = prompt[:AFFINITY_PREFIX_CHARS].encode("utf-8", "surrogatepass")
        return "t" + hashlib.blake2b(data, digest_size=12).hexdigest()
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        whole = len(prompt) // AFFINITY_BLOCK_TOKENS * AFFINITY_BLOCK_TOKENS
        if not whole:
            return None
        # Only the first block: requests sharing a system prompt meet on one key.
        data = ",".join(map(str, prompt[:AFFINITY_BLOCK_TOKENS])).encode()
        return "k" + hashlib.blake2b(data, digest_size=12).hexdigest()
    return None
