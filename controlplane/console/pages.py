"""The console's pages, sign-in and sign-out, and its mount on the app.

Pages are thin: the server renders the frame (navigation, who is signed in, and only the
controls the session's role may use) and each page's ES module reads the REST API with the
session cookie. Nothing here decides what a role may do beyond hiding controls: every
read and write goes through ``/api/v1`` and its role checks (``controlplane.api.auth``).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.applications import Starlette
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from controlplane.api.auth import grants
from controlplane.api.sessions import (
    COOKIE_NAME,
    OpenSession,
    cookie_options,
    find_session,
    redeem_link,
    sign_in,
    sign_out,
)
from controlplane.db import utcnow
from controlplane.models import KeyRole
from controlplane.services import keys as key_service

__all__ = ["CONSOLE_PREFIX", "STATIC_DIR", "mount_console"]

logger = logging.getLogger(__name__)

CONSOLE_PREFIX = "/console"
HERE = Path(__file__).parent
STATIC_DIR = HERE / "static"
_MAX_FORM_BYTES = 4096
_CONSOLE_ROLES = (KeyRole.VIEWER, KeyRole.OPERATOR, KeyRole.ADMIN)
templates = Jinja2Templates(directory=HERE / "templates")


async def _signed_in(request: Request) -> tuple[str, OpenSession] | None:
    token = request.cookies.get(COOKIE_NAME, "")
    if not token:
        return None
    async with request.app.state.sessions() as session:
        opened = await find_session(session, token, now=utcnow())
    return None if opened is None else (token, opened)


def frame(opened: OpenSession) -> dict[str, Any]:
    """What every page's frame shows for the signed-in key: its controls follow its role,
    and pausing the automation, which acts on the whole cluster, needs a key of no tenant."""
    can_operate = grants(opened.role, KeyRole.OPERATOR)
    return {
        "me": opened,
        "can_operate": can_operate,
        "can_operate_cluster": can_operate and opened.tenant is None,
        "is_admin": opened.role is KeyRole.ADMIN,
    }


def _render(
    request: Request, template: str, opened: OpenSession, status_code: int = 200, **context: Any
) -> Response:
    return templates.TemplateResponse(
        request, template, {**frame(opened), **context}, status_code=status_code
    )


def _to_sign_in(request: Request) -> Response:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"{CONSOLE_PREFIX}/sign-in?next={quote(target)}", status_code=303)


def page(path: str, template: str, title: str, needs: KeyRole = KeyRole.VIEWER) -> Route:
    """A page route: signed-in sessions whose role grants ``needs`` see ``template``;
    others are sent to sign in, or get a 403 page naming the role needed."""

    async def endpoint(request: Request) -> Response:
        found = await _signed_in(request)
        if found is None:
            return _to_sign_in(request)
        opened = found[1]
        if not grants(opened.role, needs):
            return _render(
                request, "forbidden.html", opened, 403, needs=needs.value, title="Not allowed"
            )
        return _render(request, template, opened, params=request.path_params, title=title)

    return Route(path, endpoint, methods=["GET"])


def _safe_next(value: str) -> str:
    """Only a path of the console (never another site) to go to after signing in."""
    if value.startswith(f"{CONSOLE_PREFIX}/") and not value.startswith("//"):
        return value
    return f"{CONSOLE_PREFIX}/"


def _same_origin(request: Request) -> bool:
    """Whether a form post comes from this site. A browser's ``Sec-Fetch-Site`` decides
    when it is sent: with ``Referrer-Policy: no-referrer`` Chromium posts ``Origin: null``
    even from our own page. Otherwise ``Origin``, when present, must be ours."""
    site = request.headers.get("sec-fetch-site")
    if site is not None:
        return site == "same-origin"
    origin = request.headers.get("origin")
    return origin is None or origin == f"{request.url.scheme}://{request.url.netloc}"


def _sign_in_page(request: Request, error: str = "", status_code: int = 200) -> Response:
    return templates.TemplateResponse(
        request,
        "sign_in.html",
        {"error": error, "next": _safe_next(request.query_params.get("next", "")), "me": None},
        status_code=status_code,
    )


def _start_session(request: Request, token: str, target: str) -> Response:
    response = RedirectResponse(target, status_code=303)
    ttl_s = request.app.state.settings.console_session_ttl_s
    response.set_cookie(COOKIE_NAME, token, **cookie_options(request, ttl_s))
    return response


async def sign_in_form(request: Request) -> Response:
    link = request.query_params.get("link")
    if not link:
        return _sign_in_page(request)
    ttl_s = request.app.state.settings.console_session_ttl_s
    async with request.app.state.sessions() as session, session.begin():
        redeemed = await redeem_link(session, link, now=utcnow(), ttl_s=ttl_s)
    if redeemed is None:
        return _sign_in_page(
            request, "this sign-in link was used already or has expired", status_code=401
        )
    return _start_session(request, redeemed[0], f"{CONSOLE_PREFIX}/")


async def sign_in_submit(request: Request) -> Response:
    if not _same_origin(request):
        return _sign_in_page(request, "sign-in refused: the form came from another site", 403)
    body = await request.body()
    if len(body) > _MAX_FORM_BYTES:
        return _sign_in_page(request, f"form must be at most {_MAX_FORM_BYTES} bytes", 413)
    form = parse_qs(body.decode("utf-8", "replace"))
    presented = form.get("api_key", [""])[0].strip()
    target = _safe_next(form.get("next", [""])[0])
    settings = request.app.state.settings
    now = utcnow()
    key = await key_service.authenticate_cached(
        request.app.state.sessions,
        key_service.key_cache(request.app.state.engine, ttl_s=settings.key_cache_ttl_s),
        presented,
        now=now,
        touch_after_s=settings.key_last_used_resolution_s,
    )
    if key is None:
        return _sign_in_page(request, "invalid API key: unknown or revoked", 401)
    if key.role not in _CONSOLE_ROLES:
        allowed = ", ".join(r.value for r in _CONSOLE_ROLES)
        return _sign_in_page(
            request,
            f"key {key.name!r} has role {key.role.value!r}; the console needs {allowed}",
            403,
        )
    async with request.app.state.sessions() as session, session.begin():
        token, _ = await sign_in(session, key, now=now, ttl_s=settings.console_session_ttl_s)
    return _start_session(request, token, target)


async def sign_out_submit(request: Request) -> Response:
    found = await _signed_in(request)
    response = RedirectResponse(f"{CONSOLE_PREFIX}/sign-in", status_code=303)
    if found is not None:
        token, opened = found
        form = parse_qs((await request.body())[:_MAX_FORM_BYTES].decode("utf-8", "replace"))
        if not opened.csrf_matches(form.get("csrf_token", [None])[0]):
            detail = "sign-out refused: missing or wrong CSRF token"
            return _render(request, "forbidden.html", opened, 403, title="Refused", detail=detail)
        async with request.app.state.sessions() as session, session.begin():
            await sign_out(session, token, now=utcnow())
    response.delete_cookie(COOKIE_NAME, path="/", httponly=True, samesite="strict")
    return response


def _routes() -> list[Route | Mount]:
    return [
        Route("/sign-in", sign_in_form, methods=["GET"]),
        Route("/sign-in", sign_in_submit, methods=["POST"]),
        Route("/sign-out", sign_out_submit, methods=["POST"]),
        page("/", "overview.html", "Overview"),
        page("/slos/new", "editor.html", "New SLO", KeyRole.OPERATOR),
        page("/slos/{ref}", "slo.html", "SLO"),
        page("/slos/{ref}/edit", "editor.html", "Edit SLO", KeyRole.OPERATOR),
        page("/fleet", "fleet.html", "Fleet"),
        page("/control", "control.html", "Control"),
        page("/audit", "audit.html", "Audit log", KeyRole.ADMIN),
        page("/keys", "keys.html", "API keys", KeyRole.ADMIN),
        Mount("/static", StaticFiles(directory=STATIC_DIR, check_dir=False), name="static"),
    ]


def mount_console(app: FastAPI) -> None:
    """Serve the console under ``/console`` (sharing the app's state), ``/`` as a redirect
    to it, and ``/docs`` with the locally built Swagger UI."""
    console = Starlette(routes=_routes())
    console.state = app.state  # the same settings, database and live runtime as the API
    app.mount(CONSOLE_PREFIX, console)

    async def home(request: Request) -> Response:
        return RedirectResponse(f"{CONSOLE_PREFIX}/", status_code=307)

    async def docs(request: Request) -> HTMLResponse:
        vendor = f"{CONSOLE_PREFIX}/static/vendor"
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{vendor}/swagger-ui-bundle.js",
            swagger_css_url=f"{vendor}/swagger-ui.css",
            swagger_favicon_url=f"{CONSOLE_PREFIX}/static/favicon.svg",
        )

    app.add_route("/", home, include_in_schema=False)
    app.add_route("/docs", docs, include_in_schema=False)
