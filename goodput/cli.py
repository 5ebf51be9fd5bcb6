"""The ``goodput`` command line.

    goodput controlplane serve [--host H] [--port P] [--no-migrate]
    goodput db upgrade [--revision REV]
    goodput admin create-key --role ROLE [--name N] [--tenant T]
    goodput slo apply -f FILE.yaml
    goodput slo list [--include-deleted]
    goodput dashboards export DIR / goodput rules export FILE  (docs/dashboards.md)
    goodput demo [--duration S]  (docs/demo.md)
    goodput gateway --port P --prefill URL --decode URL | --colocated URL  (docs/gateway.md)
    goodput bench --url URL --trace NAME --rate-scale X --duration S --slo ttft=0.2,itl=0.05
    goodput sim --trace NAME --cluster 'prefill=N,decode=M,model=...' ...  (docs/simulator.md)
    goodput model build-tiny [DIR] [--seed N]  (docs/serving.md)
    goodput worker --engine vllm --model DIR --role R --port P ...  (docs/serving.md)

Settings come from ``GOODPUT_*`` environment variables (``controlplane.settings``);
``--database-url`` overrides ``GOODPUT_DATABASE_URL``. Commands that touch the database use
the same services as the API, in one transaction each, audited with actor ``cli``.
Exit codes: 0 success, 1 error from the registry (conflict, not found), 2 invalid input.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from sqlalchemy.ext.asyncio import AsyncSession

from controlplane import openslo
from controlplane.db import create_engine_for, session_factory, utcnow
from controlplane.errors import GoodputError, InvalidInputError
from controlplane.models import KeyRole
from controlplane.services import keys as key_service
from controlplane.services import slos as slo_service
from controlplane.settings import Settings
from dashboards.cli import register as register_dashboard_commands
from goodput.demo import demo as demo_command
from serving.bench.cli import bench as bench_command
from serving.gateway.cli import gateway as gateway_command
from serving.model.cli import register as register_model_commands
from serving.sim.cli import sim as sim_command
from serving.workers.cli import register as register_worker_commands

__all__ = ["app", "main"]

CLI_ACTOR = "cli"
T = TypeVar("T")

app = typer.Typer(
    name="goodput",
    help="Goodput: SLO control plane for LLM inference with prefill/decode disaggregation.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
controlplane_app = typer.Typer(help="Run the control plane.", no_args_is_help=True)
db_app = typer.Typer(help="Manage the registry database.", no_args_is_help=True)
admin_app = typer.Typer(help="Administration: API keys.", no_args_is_help=True)
slo_app = typer.Typer(help="SLO definitions.", no_args_is_help=True)
app.add_typer(controlplane_app, name="controlplane")
app.add_typer(db_app, name="db")
app.add_typer(admin_app, name="admin")
app.add_typer(slo_app, name="slo")
app.command("demo")(demo_command)
app.command("gateway")(gateway_command)
app.command("bench")(bench_command)
app.command("sim")(sim_command)
register_model_commands(app)
register_worker_commands(app)
register_dashboard_commands(app)


@app.callback()
def root(
    ctx: typer.Context,
    database_url: Annotated[
        str | None,
        typer.Option(help="SQLAlchemy URL; default: GOODPUT_DATABASE_URL or ./var/goodput.db"),
    ] = None,
) -> None:
    ctx.obj = Settings(database_url=database_url) if database_url else Settings()


def _settings(ctx: typer.Context) -> Settings:
    settings: Settings = ctx.ensure_object(Settings)
    return settings


def _fail(exc: GoodputError) -> typer.Exit:
    typer.echo(f"error: {exc.message}", err=True)
    return typer.Exit(code=2 if isinstance(exc, InvalidInputError) else 1)


def _in_transaction(settings: Settings, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
    """Run ``work`` in one transaction on a fresh engine (a CLI command is one unit of work)."""

    async def run() -> T:
        engine = create_engine_for(settings.database_url)
        try:
            async with session_factory(engine)() as session, session.begin():
                return await work(session)
        finally:
            await engine.dispose()

    try:
        return asyncio.run(run())
    except GoodputError as exc:
        raise _fail(exc) from None


@controlplane_app.command("serve")
def serve(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option(help="default: GOODPUT_HOST")] = None,
    port: Annotated[int | None, typer.Option(help="default: GOODPUT_PORT")] = None,
    migrate: Annotated[
        bool,
        typer.Option(
            help="upgrade the database first; use --no-migrate when several replicas start at "
            "once and run `goodput db upgrade` from the deploy job instead"
        ),
    ] = True,
) -> None:
    """Serve the control plane with uvicorn (one worker; scale out with more processes)."""
    import uvicorn

    from controlplane.allocator import fix_mmap_threshold, start_trimming
    from controlplane.main import configure_logging, create_app

    settings = _settings(ctx)
    configure_logging(settings)
    # Before the app allocates anything large (controlplane/allocator.py).
    fix_mmap_threshold(settings.malloc_mmap_threshold, os.environ)
    start_trimming(settings.malloc_trim_interval_s)
    if migrate:
        from migrations import upgrade

        upgrade(settings.database_url)
    uvicorn.run(
        create_app(settings),
        host=host or settings.host,
        port=settings.port if port is None else port,
        workers=1,
        log_config=None,  # keep the root logging configured above (plain or JSON)
        server_header=False,  # no "Server: uvicorn" (docs/api.md, *Hardening*)
        h11_max_incomplete_event_size=settings.max_header_bytes,
    )


@db_app.command("upgrade")
def db_upgrade(
    ctx: typer.Context,
    revision: Annotated[str, typer.Option(help="target revision")] = "head",
) -> None:
    """Apply migrations up to ``revision`` (creates the SQLite file and its folder if needed)."""
    from migrations import upgrade

    settings = _settings(ctx)
    upgrade(settings.database_url, revision)
    typer.echo(f"database at {revision}", err=True)


@admin_app.command("create-key")
def create_key(
    ctx: typer.Context,
    role: Annotated[KeyRole, typer.Option(help="what the key may do", case_sensitive=False)],
    name: Annotated[str, typer.Option(help="a label shown in key lists")] = "",
    tenant: Annotated[str | None, typer.Option(help="scope the key to one tenant")] = None,
) -> None:
    """Mint an API key and print it once on stdout (audited with actor "cli")."""
    from pydantic import ValidationError

    from controlplane.errors import format_validation_errors
    from controlplane.schemas.keys import APIKeyCreate

    try:
        body = APIKeyCreate(name=name or f"{role.value}-key", role=role, tenant=tenant)
    except ValidationError as exc:
        messages = [e["msg"] for e in format_validation_errors(exc.errors(include_url=False))]
        typer.echo(f"error: {'; '.join(messages)}", err=True)
        raise typer.Exit(code=2) from None

    async def work(session: AsyncSession) -> tuple[str, str, str]:
        key, secret = await key_service.create_key(
            session,
            name=body.name,
            role=body.role,
            tenant=body.tenant,
            actor=CLI_ACTOR,
            now=utcnow(),
        )
        return secret, str(key.id), key.prefix

    secret, key_id, prefix = _in_transaction(_settings(ctx), work)
    typer.echo(secret)
    typer.echo(
        f"created {role.value} key {body.name!r} (id {key_id}, prefix {prefix}); "
        "store it now: it is not shown again",
        err=True,
    )


@slo_app.command("apply")
def slo_apply(
    ctx: typer.Context,
    file: Annotated[
        Path, typer.Option("--file", "-f", help="YAML: OpenSLO v1 SLOs or Goodput SLOs; - = stdin")
    ],
) -> None:
    """Create or update SLOs by name from a YAML file (all or nothing)."""
    try:
        text = sys.stdin.read() if str(file) == "-" else file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        typer.echo(f"error: cannot read {file}: {exc}", err=True)
        raise typer.Exit(code=2) from None
    try:
        definitions = openslo.parse_documents(text)
    except InvalidInputError as exc:
        raise _fail(exc) from None

    async def work(session: AsyncSession) -> list[tuple[str, str, int]]:
        now = utcnow()
        results: list[tuple[str, str, int]] = []
        for definition in definitions:
            action, slo = await slo_service.apply_slo(session, definition, actor=CLI_ACTOR, now=now)
            results.append((action, slo.name, slo.version))
        return results

    for action, slo_name, version in _in_transaction(_settings(ctx), work):
        typer.echo(f"{action} {slo_name} (version {version})")


@slo_app.command("list")
def slo_list(
    ctx: typer.Context,
    include_deleted: Annotated[bool, typer.Option(help="also list deleted SLOs")] = False,
) -> None:
    """One line per SLO: name, version, target, window, objectives."""

    async def work(session: AsyncSession) -> list[str]:
        where = slo_service.SLOFilter(include_deleted=include_deleted)
        rows, count = await slo_service.list_slos(session, where, limit=500, offset=0)
        while len(rows) < count:
            page, _ = await slo_service.list_slos(session, where, limit=500, offset=len(rows))
            if not page:
                break
            rows.extend(page)
        lines = []
        for slo in rows:
            objectives = ", ".join(
                f"{o['metric']}"
                + ("" if o.get("statistic", "max") == "max" else f":{o['statistic']}")
                + f"<={o['threshold_s']:g}s"
                for o in slo.objectives
            )
            deleted = "  (deleted)" if slo.deleted_at else ""
            lines.append(
                f"{slo.name}\tv{slo.version}\ttarget={slo.target:g}\t"
                f"window={openslo.format_duration(slo.window_s)}\t{objectives or '-'}{deleted}"
            )
        return lines

    lines = _in_transaction(_settings(ctx), work)
    if not lines:
        typer.echo("no SLOs", err=True)
    for line in lines:
        typer.echo(line)


def main() -> None:
    """Console-script entry point (``goodput = "goodput.cli:main"``)."""
    app()
