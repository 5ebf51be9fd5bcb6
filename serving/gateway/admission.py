"""The admission seam: the gateway asks a hook, per request, whether to serve it.

The hook is a :class:`AdmissionHook` (``decide(info) -> Decision``). It runs on the event
loop once per request, so it must be cheap and must not block; a policy that needs remote
state keeps it fresh on its own schedule and decides from what it holds. :class:`AllowAll`
admits everything; the gateway's default is
:class:`serving.gateway.admission_policy.PolicyAdmission`, which applies the admission
policy the control plane pushes (``set_admission_policy`` commands,
``exporters.admission.AdmissionPolicy``) and admits everything until the first one arrives.

A request the hook rejects is answered with the decision's ``status_code`` (``429`` for
load, ``400`` for a request that can never meet its SLO's TTFT objective) with
``Retry-After`` when the decision has one, and recorded with status ``REJECTED`` (it counts
against the SLO's availability).

Example::

    class ShedBatch:
        def decide(self, info: RequestInfo) -> Decision:
            if info.priority == "batch":
                return Decision(admit=False, reason="shedding batch", retry_after_s=1.0)
            return ADMIT
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["ADMIT", "AdmissionHook", "AllowAll", "Decision", "RequestInfo"]


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """What the gateway knows of a request when it asks: its id, labels and size.

    ``engine_priority``: where the engines serve by priority (the gateway's
    ``--engine-priority``), the number the request is sent with (lower first; 0 for one sent
    with none); ``None`` where they serve in arrival order."""

    request_id: str
    model: str
    tenant: str
    slo: str
    priority: str
    prompt_tokens: int  # an estimate for text prompts (the gateway does not tokenize)
    max_tokens: int | None
    stream: bool
    arrival_s: float  # the gateway's monotonic clock
    engine_priority: int | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """Admit or reject; ``reason`` is recorded and sent to a rejected client.

    A rejection by a latency prediction also says which SLO and objective it protects
    (``slo``, ``objective``: ``"ttft"``, ``"itl"`` or ``"concurrency"``), the predicted and
    the allowed value (``predicted``, ``allowed``: seconds, or requests for
    ``"concurrency"``); ``reason`` spells the same out for people. ``status_code`` and
    ``error_type`` are the HTTP status and the body's ``type``: ``429``/``rate_limited``
    for load (retry later), ``400``/``infeasible_request`` for a request predicted to miss
    its SLO's TTFT objective even on an idle instance (``infeasible``: no retry helps, so
    no ``retry_after_s``).
    """

    admit: bool
    reason: str = ""
    retry_after_s: float | None = None
    slo: str = ""
    objective: str = ""
    predicted: float | None = None
    allowed: float | None = None
    status_code: int = 429
    error_type: str = "rate_limited"
    infeasible: bool = False

    def detail(self) -> dict[str, object]:
        """The fields a rejection sets, for the error body (beside ``message``)."""
        fields: tuple[tuple[str, object], ...] = (
            ("slo", self.slo),
            ("objective", self.objective),
            ("predicted", self.predicted),
            ("allowed", self.allowed),
            ("retry_after_s", self.retry_after_s),
            ("infeasible", self.infeasible or None),
        )
        return {key: value for key, value in fields if value not in ("", None)}


ADMIT = Decision(admit=True)


@runtime_checkable
class AdmissionHook(Protocol):
    """Decides, per request, whether the gateway serves it (see the module docstring)."""

    def decide(self, info: RequestInfo) -> Decision: ...


class AllowAll:
    """Admits every request."""

    def decide(self, info: RequestInfo) -> Decision:
        return ADMIT
