"""Domain exceptions, and the one place that maps them (and every other error) to HTTP.

Services raise these; they never build HTTP responses. Every error body has the FastAPI
shape ``{"detail": ...}``: a string for 400/401/403/404/409/413/415/503, and for 422 a list of
``{"loc", "field", "msg", "type"}`` entries whose ``msg`` names the field, what is allowed and
the value received, e.g. ``"target must be in (0, 1), got 1.5"``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm.exc import StaleDataError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from exporters.slo import Metric

__all__ = [
    "BadRequestError",
    "ConflictError",
    "ForbiddenError",
    "GoodputError",
    "InvalidInputError",
    "NotFoundError",
    "PayloadTooLargeError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnsupportedMediaTypeError",
    "describe_error",
    "format_validation_errors",
    "install_error_handlers",
]

logger = logging.getLogger(__name__)

_MAX_SHOWN = 80  # characters of an offending value echoed back in a message
# Tags of the discriminated unions in our schemas (objective metrics), stripped from locs.
_UNION_TAGS = frozenset(m.value for m in Metric)
_TYPE_PHRASES = {
    "int_from_float": "must be a whole number",
    "int_parsing": "must be an integer",
    "int_type": "must be an integer",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "finite_number": "must be a finite number",
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "string_type": "must be a string",
    "uuid_parsing": "must be a UUID",
    "uuid_type": "must be a UUID",
    "dict_type": "must be an object",
    "model_type": "must be an object",
    "model_attributes_type": "must be an object",
    "list_type": "must be a list",
}
_FASTAPI_BODY_ERROR = "There was an error parsing the body"
_NO_VALUE = frozenset({"missing", "json_invalid", "union_tag_not_found"})


class GoodputError(Exception):
    """Base of the domain errors; ``status_code`` is the HTTP status it maps to."""

    status_code = 500

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class BadRequestError(GoodputError):
    """A request the route cannot take as it is, outside the wire schema's checks (HTTP 400):
    a query value the route checks itself (a goodput ``window``), a body that does not
    decode as what it claims to be."""

    status_code = 400


class NotFoundError(GoodputError):
    status_code = 404


class ConflictError(GoodputError):
    status_code = 409


class PayloadTooLargeError(GoodputError):
    status_code = 413


class UnsupportedMediaTypeError(GoodputError):
    status_code = 415


class UnavailableError(GoodputError):
    """Cannot serve now; ``retry_after_s`` (when given) becomes a ``Retry-After`` header."""

    status_code = 503

    def __init__(self, message: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class UnauthenticatedError(GoodputError):
    status_code = 401


class ForbiddenError(GoodputError):
    status_code = 403


class InvalidInputError(GoodputError):
    """Input that passed the wire schema but breaks a domain rule (or an imported document).

    ``loc`` locates the field as in pydantic errors, e.g. ``("body", "spec", "objectives", 0)``.
    """

    status_code = 422

    def __init__(self, message: str, loc: Sequence[str | int] = ("body",)) -> None:
        super().__init__(message)
        self.loc = tuple(loc)


def describe_error(exc: BaseException) -> str:
    """``"<type>: <message>"`` on one line, at most 200 characters of message, naming the
    driver's own error where SQLAlchemy wraps one (``OperationalError: connection failed
    ...``): for logs and for reasons given to clients (``/ready``)."""
    cause = getattr(exc, "orig", None) or exc
    return f"{type(cause).__name__}: {' '.join(str(cause).split())[:200]}"


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def _field_name(loc: Sequence[str | int]) -> str:
    """``("body", "objectives", 0, "threshold_s")`` → ``objectives[0].threshold_s``."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    name = ""
    for part in parts:
        if isinstance(part, int):
            name += f"[{part}]"
        else:
            name += f".{part}" if name else str(part)
    return name or (str(loc[0]) if loc else "request")


def _plain_loc(loc: Sequence[object]) -> list[str | int]:
    """The loc without pydantic's union-member steps: a tagged union adds the tag after the
    list index (``objectives, 0, "itl", threshold_s``), a plain union the member's type."""
    plain: list[str | int] = []
    for part in loc:
        if isinstance(part, int):
            plain.append(part)
            continue
        text = str(part)
        if "[" in text or (plain and isinstance(plain[-1], int) and text in _UNION_TAGS):
            continue
        plain.append(text)
    return plain


def _phrase(err: Mapping[str, Any]) -> str:
    """What is allowed, in words, for one pydantic error (without the field name)."""
    kind = str(err.get("type", ""))
    ctx: Mapping[str, Any] = err.get("ctx") or {}
    bounds = {
        "greater_than": ("> ", "gt"),
        "greater_than_equal": (">= ", "ge"),
        "less_than": ("< ", "lt"),
        "less_than_equal": ("<= ", "le"),
    }
    if kind in bounds:
        op, key = bounds[kind]
        return f"must be {op}{ctx.get(key)}"
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "is not an allowed field"
    if kind == "string_too_short":
        return f"must be at least {ctx.get('min_length')} characters"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters"
    if kind == "too_short":
        return f"must have at least {ctx.get('min_length')} item(s)"
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length')} item(s)"
    if kind == "union_tag_invalid":
        return f"must be one of {ctx.get('expected_tags')}"
    if kind == "union_tag_not_found":
        return "is required"  # the allowed tags are in the schema; pydantic doesn't give them
    if kind == "string_pattern_mismatch":
        return f"must match {ctx.get('pattern')}"
    if kind in ("enum", "literal_error"):
        return f"must be one of {ctx.get('expected')}"
    if kind in _TYPE_PHRASES:
        return _TYPE_PHRASES[kind]
    if kind == "string_unicode":
        return "must be valid Unicode text (no unpaired surrogates)"
    if kind == "json_invalid":
        return f"is not valid JSON ({ctx.get('error', 'decode error')})"
    if kind == "value_error":
        # Our validators raise ValueError("must be ...") with the allowed range already in it.
        return str(ctx.get("error", err.get("msg", "")))
    msg = str(err.get("msg", "is invalid"))
    return msg[:1].lower() + msg[1:]


def format_validation_errors(errors: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Pydantic/FastAPI error dicts → our ``detail`` entries (loc, field, msg, type).

    The message reads ``"<field> <what is allowed>, got <value>"`` (the value is left out
    when the field is missing or when it is a whole object).
    """
    detail: list[dict[str, Any]] = []
    for err in errors:
        loc = _plain_loc(err.get("loc", ()))
        kind = str(err.get("type", "value_error"))
        value = err.get("input")
        if kind in ("union_tag_invalid", "union_tag_not_found"):
            # Report the discriminator field itself, e.g. objectives[0].metric.
            ctx = err.get("ctx") or {}
            loc.append(str(ctx.get("discriminator", "type")).strip("'"))
            value = ctx.get("tag")
        field = _field_name(loc)
        msg = f"{field} {_phrase(err)}"
        if kind not in _NO_VALUE and not isinstance(value, dict | list):
            msg += f", got {_shown(value)}"
        detail.append({"loc": loc, "field": field, "msg": msg, "type": kind})
    return detail


def _json(status: int, detail: object, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=dict(headers or {}))


async def _on_domain_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, GoodputError)
    if isinstance(exc, InvalidInputError):
        loc = list(exc.loc)
        entry = {"loc": loc, "field": _field_name(loc), "msg": exc.message, "type": "value_error"}
        return _json(422, [entry])
    headers: dict[str, str] = {}
    if isinstance(exc, UnauthenticatedError):
        headers["WWW-Authenticate"] = "Bearer"
    if isinstance(exc, UnavailableError) and exc.retry_after_s is not None:
        headers["Retry-After"] = str(exc.retry_after_s)
    return _json(exc.status_code, exc.message, headers)


async def _on_validation_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return _json(422, format_validation_errors(exc.errors()))


def _allowed_methods(request: Request) -> str:
    """The methods served at this path by the path template Starlette matched first (its own
    405 names only the first *route's* methods, while ``GET /slos`` and ``POST /slos`` are
    two routes with one template)."""
    template: str | None = None
    methods: set[str] = set()
    for route in request.app.routes:
        match, _ = route.matches(request.scope)
        if match is Match.NONE:
            continue
        path = getattr(route, "path", None)
        template = path if template is None else template
        if path == template:
            methods.update(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


async def _on_http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and exc.detail == _FASTAPI_BODY_ERROR:
        # FastAPI's answer to a body that is not even text (e.g. invalid UTF-8): report it like
        # any other malformed JSON, as a 422 naming the body.
        entry = {
            "loc": ["body"],
            "field": "body",
            "msg": "body is not valid JSON (it could not be decoded as UTF-8 text)",
            "type": "json_invalid",
        }
        return _json(422, [entry])
    headers = dict(exc.headers or {})
    if exc.status_code == 405:
        headers["Allow"] = _allowed_methods(request)
    return _json(exc.status_code, exc.detail, headers)


async def _on_integrity_error(_: Request, exc: Exception) -> JSONResponse:
    # Services check uniqueness first; this is the race where two requests both passed.
    logger.info("integrity error mapped to 409: %s", exc)
    return _json(409, "the change conflicts with a concurrent change; retry the request")


async def _on_stale_data(_: Request, exc: Exception) -> JSONResponse:
    logger.info("stale data mapped to 409: %s", exc)
    return _json(409, "the object was changed by a concurrent request; retry the request")


async def _on_database_error(_: Request, exc: Exception) -> JSONResponse:
    logger.warning("database error: %s", exc)
    assert isinstance(exc, DBAPIError)
    if isinstance(exc, OperationalError) or exc.connection_invalidated:
        return _json(503, "the database is unavailable; retry later")
    return _json(503, f"the database refused the request ({type(exc.orig).__name__})")


async def _on_unexpected(_: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled error", exc_info=exc)
    return _json(500, "internal error; the control plane's log has the details")


def install_error_handlers(app: FastAPI) -> None:
    """Register the mapping above on ``app`` (called once by ``create_app``)."""
    app.add_exception_handler(GoodputError, _on_domain_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_exception)
    app.add_exception_handler(IntegrityError, _on_integrity_error)
    app.add_exception_handler(StaleDataError, _on_stale_data)
    app.add_exception_handler(DBAPIError, _on_database_error)
    app.add_exception_handler(Exception, _on_unexpected)
