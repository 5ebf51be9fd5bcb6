"""SLO wire models: ``SLOCreate`` / ``SLOUpdate`` in, ``SLOPublic`` / ``SLOsPublic`` out."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from controlplane.goodput.spec import measurement_warnings
from controlplane.models.enums import SLOVantage
from controlplane.schemas.common import (
    Interval,
    Label,
    Name,
    Text,
    WireModel,
    non_nullable_in_schema,
)
from exporters.slo import Metric
from exporters.slo import Objective as CoreObjective

__all__ = [
    "MAX_WINDOW_S",
    "MIN_WINDOW_S",
    "E2ELObjective",
    "ITLObjective",
    "Objective",
    "SLOApplied",
    "SLOCreate",
    "SLOImportResult",
    "SLOPublic",
    "SLOUpdate",
    "SLOVersionPublic",
    "SLOVersionsPublic",
    "SLOsPublic",
    "Selector",
    "TPOTObjective",
    "TTFTObjective",
]

MIN_WINDOW_S = 60  # one rollup minute
MAX_WINDOW_S = 366 * 86_400
MAX_THRESHOLD_S = 3_600.0
# "max", or a per-request ITL percentile p1 … p99.999 or p100 (exporters.slo.Objective).
ITL_STATISTIC_PATTERN = r"^(max|p100|p[1-9][0-9]?(\.[0-9]{1,3})?)$"


def _not_uuid(name: str) -> str:
    # SLOs are addressed by id or by name in one path segment: a name must not look like an id.
    try:
        uuid.UUID(name)
    except ValueError:
        return name
    raise ValueError("must not be a UUID (UUIDs address SLOs by id)")


SLOName = Annotated[Name, AfterValidator(_not_uuid)]
Threshold = Annotated[
    float, Interval(0, MAX_THRESHOLD_S, low_open=True), Field(description="seconds, inclusive")
]
Ratio = Annotated[float, Interval(0, 1, low_open=True, high_open=True)]
WindowS = Annotated[int, Interval(MIN_WINDOW_S, MAX_WINDOW_S), Field(description="seconds")]
#: What admission does with a request it predicts can never meet the TTFT objective, even on
#: an idle instance (docs/admission.md): ``admit`` it as best effort, counted apart, or
#: ``reject`` it at once (HTTP 400, no Retry-After: retrying cannot help).
Infeasible = Annotated[
    Literal["admit", "reject"],
    Field(
        description="what admission does with a request predicted to miss the TTFT "
        "objective even on an idle instance: admit (best effort, counted apart) or "
        "reject (400 at once)"
    ),
]


# One model per metric, so the published discriminator maps each tag to its own schema (a
# tag-to-schema mapping that is one-to-one is what OpenAPI tools read reliably).
class TTFTObjective(WireModel):
    """Time to first token of each request must be ``<= threshold_s``."""

    metric: Literal["ttft"]
    threshold_s: Threshold
    statistic: Literal["max"] = "max"


class TPOTObjective(WireModel):
    """Time per output token after the first, per request, must be ``<= threshold_s``."""

    metric: Literal["tpot"]
    threshold_s: Threshold
    statistic: Literal["max"] = "max"


class E2ELObjective(WireModel):
    """End-to-end latency of each request must be ``<= threshold_s``."""

    metric: Literal["e2el"]
    threshold_s: Threshold
    statistic: Literal["max"] = "max"


class ITLObjective(WireModel):
    """ITL of each request: every gap (``max``) or a per-request percentile (``p99``)."""

    metric: Literal["itl"]
    threshold_s: Threshold
    statistic: str = Field(default="max", pattern=ITL_STATISTIC_PATTERN)


Objective = Annotated[
    TTFTObjective | TPOTObjective | E2ELObjective | ITLObjective, Field(discriminator="metric")
]


# A request is good when it meets every objective, so two objectives on the same metric and
# statistic are allowed and mean the stricter one (services.slos.to_spec merges them).
Objectives = Annotated[list[Objective], Field(max_length=16)]


class Selector(WireModel):
    """Which requests an SLO judges: every given label must match (``{}`` selects all)."""

    model: Label | None = None
    tenant: Label | None = None
    priority: Label | None = None
    slo: Label | None = None
    route: Label | None = None


class SLOCreate(WireModel):
    """A new SLO. Example: 99 % of chat requests with TTFT <= 200 ms and ITL <= 50 ms, 28 days::

    {"name": "chat", "selector": {"model": "llama"}, "target": 0.99, "window_s": 2419200,
     "objectives": [{"metric": "ttft", "threshold_s": 0.2},
                    {"metric": "itl", "threshold_s": 0.05}]}
    """

    name: SLOName
    description: Text = ""
    selector: Selector = Field(default_factory=Selector)
    objectives: Objectives
    target: Ratio
    window_s: WindowS = 28 * 86_400
    vantage: SLOVantage = SLOVantage.GATEWAY
    availability_target: Ratio | None = None
    infeasible: Infeasible = "admit"


_REQUIRED_ON_CREATE = (
    "name",
    "description",
    "selector",
    "objectives",
    "target",
    "window_s",
    "vantage",
    "infeasible",
)


class SLOUpdate(WireModel):
    """A partial update: only the fields sent change; ``null`` is allowed only for
    ``availability_target`` (it removes the availability objective)."""

    # Only omission means "unchanged": null is refused, and left out of the published schema.
    model_config = ConfigDict(json_schema_extra=non_nullable_in_schema(_REQUIRED_ON_CREATE))

    name: SLOName | None = None
    description: Text | None = None
    selector: Selector | None = None
    objectives: Objectives | None = None
    target: Ratio | None = None
    window_s: WindowS | None = None
    vantage: SLOVantage | None = None
    availability_target: Ratio | None = None
    infeasible: Infeasible | None = None

    @field_validator(*_REQUIRED_ON_CREATE, mode="before")
    @classmethod
    def _not_null(cls, value: object) -> object:
        if value is None:
            raise ValueError("must not be null (omit the field to keep its current value)")
        return value


class ObjectivePublic(BaseModel):
    metric: str
    threshold_s: float
    statistic: str


class SLOPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: uuid.UUID
    name: str
    description: str
    selector: dict[str, str]
    objectives: list[ObjectivePublic]
    target: float
    window_s: int
    vantage: SLOVantage
    availability_target: float | None
    #: Version snapshots written before the field existed read as the default.
    infeasible: Literal["admit", "reject"] = "admit"
    version: int
    created_at: datetime
    updated_at: datetime
    deleted_at: datetime | None
    #: What the SLO cannot measure at its vantage (an ITL objective at ``engine``: vLLM's
    #: records carry no inter-token gaps), one sentence each; derived from ``vantage`` and
    #: ``objectives``, never stored. A warning refuses nothing: it says which objectives the
    #: goodput API will report as unmeasured (``measured_ratio``) instead of passing them.
    warnings: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _derive_warnings(self) -> SLOPublic:
        self.warnings = measurement_warnings(
            self.vantage.value,
            [CoreObjective(Metric(o.metric), o.threshold_s, o.statistic) for o in self.objectives],
        )
        return self


class SLOsPublic(BaseModel):
    """A page of SLOs; ``count`` is the number matching the filters across all pages."""

    data: list[SLOPublic]
    count: int


class SLOVersionPublic(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    slo_id: uuid.UUID
    version: int
    snapshot: SLOPublic
    actor: str
    created_at: datetime


class SLOVersionsPublic(BaseModel):
    data: list[SLOVersionPublic]
    count: int


class SLOApplied(BaseModel):
    """One SLO of an import: whether it was created, updated or already as given."""

    action: Literal["created", "updated", "unchanged"]
    slo: SLOPublic


class SLOImportResult(BaseModel):
    data: list[SLOApplied]
    count: int
