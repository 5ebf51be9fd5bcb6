"""Field validators for the command contract: each returns the checked value or raises
:class:`CommandError` naming the field path, the value and what is allowed.

Private: the public names are in :mod:`exporters.commands`.
"""

from __future__ import annotations

import math
import uuid
from enum import StrEnum
from typing import Any, TypeVar

from exporters._wire_schema import INT64_MAX, WireError, require_map

COMMAND_VERSION = 1  # the JSON layout's version ("v"), not a command's own `version`
SUPPORTED_COMMAND_VERSIONS: tuple[int, ...] = (COMMAND_VERSION,)
MAX_NAME_CHARS = 256


class CommandError(WireError):
    """A command, policy or ack that breaks the contract; ``str(e) == f"{field}: {reason}"``."""


def check_int(value: Any, path: str, low: int = 0, high: int = INT64_MAX) -> int:
    if type(value) is not int or not low <= value <= high:
        raise CommandError(path, f"must be an integer in [{low}, {high}], got {value!r}")
    return value


def check_name(value: Any, path: str, max_chars: int = MAX_NAME_CHARS) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= max_chars:
        raise CommandError(
            path, f"must be a non-empty string of at most {max_chars} characters, got {value!r}"
        )
    return value


def check_seconds(value: Any, path: str) -> float:
    if type(value) not in (int, float) or not (math.isfinite(value) and value > 0):
        raise CommandError(path, f"must be a number of seconds > 0, got {value!r}")
    return float(value)


def check_optional_seconds(value: Any, path: str) -> float | None:
    if value is None:
        return None
    if type(value) not in (int, float) or not (math.isfinite(value) and value > 0):
        raise CommandError(path, f"must be a number of seconds > 0 or null, got {value!r}")
    return float(value)


def check_bool(value: Any, path: str) -> bool:
    if type(value) is not bool:
        raise CommandError(path, f"must be true or false, got {value!r}")
    return value


E = TypeVar("E", bound=StrEnum)


def check_enum(value: Any, path: str, enum: type[E]) -> E:
    try:
        return enum(value)
    except ValueError:
        raise CommandError(
            path, f"unknown value {value!r}; allowed: {[e.value for e in enum]}"
        ) from None


def check_uuid(value: Any, path: str) -> str:
    """``value`` if it is a UUID in canonical form: ids are compared as strings downstream."""
    try:
        canonical = str(uuid.UUID(value)) if isinstance(value, str) else None
    except ValueError:
        canonical = None
    if canonical is None or canonical != value:
        raise CommandError(path, f"must be a lower-case hyphenated UUID string, got {value!r}")
    return canonical


def check_v(obj: Any, what: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise CommandError(what, f"expected a JSON object, got {type(obj).__name__}")
    if obj.get("v") not in SUPPORTED_COMMAND_VERSIONS or type(obj.get("v")) is not int:
        raise CommandError(
            "v",
            f"unsupported command version {obj.get('v')!r}; "
            f"supported versions: {list(SUPPORTED_COMMAND_VERSIONS)}",
        )
    return obj


def check_fields(
    obj: Any, path: str, keys: tuple[str, ...], *, top_level: bool = False
) -> dict[str, Any]:
    try:
        return require_map(obj, path, keys, top_level=top_level)
    except WireError as exc:
        raise CommandError(exc.field, exc.reason) from None
