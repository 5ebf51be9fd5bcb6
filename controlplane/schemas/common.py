"""Shared wire types: safe text, error bodies and the error responses routes document."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

__all__ = [
    "ERROR_RESPONSES",
    "NAME_PATTERN",
    "ErrorPublic",
    "Interval",
    "Label",
    "Name",
    "Text",
    "ValidationErrorEntry",
    "ValidationErrorPublic",
    "WireModel",
    "non_nullable_in_schema",
    "responses",
]

# Names of SLOs and keys: lowercase, URL- and Prometheus-label-safe.
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"
# Free text: anything but NUL, which PostgreSQL cannot store in text or JSONB.
TEXT_PATTERN = r"^[^\x00]*$"


class WireModel(BaseModel):
    """Base of request bodies: unknown fields are errors, non-finite numbers too."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# pydantic-core itself refuses unpaired surrogates ("\ud800"), which no database stores.
Text = Annotated[str, Field(max_length=2000, pattern=TEXT_PATTERN)]
Label = Annotated[str, Field(min_length=1, max_length=200, pattern=TEXT_PATTERN)]
Name = Annotated[str, Field(min_length=1, max_length=200, pattern=NAME_PATTERN)]


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@dataclass(frozen=True, slots=True)
class Interval:
    """``Annotated`` metadata limiting a number to an interval, whose error states the whole
    interval (``"must be in (0, 1)"``) rather than the one bound that failed; the JSON schema
    gets the matching ``minimum``/``exclusiveMinimum``/... keywords.

    >>> Ratio = Annotated[float, Interval(0, 1, low_open=True, high_open=True)]
    """

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    @property
    def shown(self) -> str:
        left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
        return f"{left}{_num(self.low)}, {_num(self.high)}{right}"

    def check(self, value: float) -> float:
        below = value <= self.low if self.low_open else value < self.low
        above = value >= self.high if self.high_open else value > self.high
        if below or above:
            raise ValueError(f"must be in {self.shown}")
        return value

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema["exclusiveMinimum" if self.low_open else "minimum"] = self.low
        json_schema["exclusiveMaximum" if self.high_open else "maximum"] = self.high
        return json_schema


def non_nullable_in_schema(fields: Sequence[str]) -> Callable[[dict[str, Any]], None]:
    """A ``json_schema_extra`` hook that drops ``null`` from the listed optional fields.

    For PATCH bodies: a field may be omitted (unchanged) but not sent as null, and the
    published schema should say so.
    """

    def strip(schema: dict[str, Any]) -> None:
        for name in fields:
            prop = schema.get("properties", {}).get(name)
            if prop is None or "anyOf" not in prop:
                continue
            kept = [s for s in prop["anyOf"] if s.get("type") != "null"]
            if len(kept) == 1:
                extra = {k: v for k, v in prop.items() if k not in ("anyOf", "default")}
                schema["properties"][name] = {**kept[0], **extra}

    return strip


class ErrorPublic(BaseModel):
    """The body of every error except 422: ``{"detail": "what went wrong"}``."""

    detail: str


class ValidationErrorEntry(BaseModel):
    loc: list[str | int]
    field: str
    msg: str
    type: str


class ValidationErrorPublic(BaseModel):
    """A 422 body: one entry per invalid field."""

    detail: list[ValidationErrorEntry]


def responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for the given error status codes."""
    descriptions = {
        401: "Missing, unknown or revoked API key",
        403: "The key's role may not call this route",
        404: "No such object",
        409: "Conflicts with the current state",
        413: "Request body too large",
        415: "Unsupported content type",
        422: "Invalid input; each entry names the field, what is allowed and the value",
        429: "Too many failed authentications from this address, or requests with this key",
        503: "The database is unavailable",
    }
    return {
        code: {
            "model": ValidationErrorPublic if code == 422 else ErrorPublic,
            "description": descriptions[code],
        }
        for code in codes
    }


# What every guarded route may answer besides its own codes.
ERROR_RESPONSES = responses(401, 403, 422, 429, 503)
