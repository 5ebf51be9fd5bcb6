"""``goodput gateway``: serve the PD gateway with uvicorn (docs/gateway.md)."""

from __future__ import annotations

import dataclasses
import gc
import logging
from pathlib import Path
from typing import Annotated

import typer

from serving.gateway.config import KVHandoff, PoolSource
from serving.gateway.kubernetes import DEFAULT_SELECTOR

__all__ = ["gateway"]


def _api_keys(path: Path | None) -> dict[str, str]:
    """``KEY: TENANT`` lines of a YAML mapping (or ``{}`` without a file)."""
    if path is None:
        return {}
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise typer.BadParameter(f"cannot read {path}: {exc}", param_hint="--api-keys") from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise typer.BadParameter(
            f"{path} must be a YAML mapping of API key to tenant name", param_hint="--api-keys"
        )
    return data


def gateway(
    *,
    port: Annotated[int, typer.Option(min=0, max=65535, help="port to serve on")] = 8080,
    host: Annotated[str, typer.Option(help="address to serve on")] = "127.0.0.1",
    prefill: Annotated[
        list[str] | None, typer.Option(help="prefill instance URL (repeat for more)")
    ] = None,
    decode: Annotated[
        list[str] | None, typer.Option(help="decode instance URL (repeat for more)")
    ] = None,
    colocated: Annotated[
        list[str] | None,
        typer.Option(help="instance URL serving whole requests, no PD (repeat for more)"),
    ] = None,
    control_plane: Annotated[
        str | None, typer.Option(help="control-plane URL: records, fleet registry")
    ] = None,
    agent_key: Annotated[
        str | None,
        typer.Option(help="agent key: register in the fleet", envvar="GOODPUT_AGENT_KEY"),
    ] = None,
    ingest_key: Annotated[
        str | None, typer.Option(help="ingest key: ship records", envvar="GOODPUT_INGEST_KEY")
    ] = None,
    viewer_key: Annotated[
        str | None,
        typer.Option(
            help="key to read the fleet registry (default: the agent key)",
            envvar="GOODPUT_VIEWER_KEY",
        ),
    ] = None,
    gateway_id: Annotated[str | None, typer.Option(help="fleet id and exporter id")] = None,
    fleet_tenant: Annotated[
        str | None, typer.Option(help="tenant whose pool this gateway serves (fleet registry)")
    ] = None,
    api_keys: Annotated[
        Path | None, typer.Option(help="YAML mapping of client API key to tenant")
    ] = None,
    default_tenant: Annotated[str, typer.Option(help="tenant of requests without a key")] = "",
    chunk_timeout: Annotated[
        float, typer.Option(min=0.1, help="seconds allowed between two chunks of a stream")
    ] = 60.0,
    prefill_timeout: Annotated[
        float, typer.Option(min=0.1, help="seconds allowed for a whole prefill call")
    ] = 120.0,
    cooldown: Annotated[
        float, typer.Option(min=0, help="seconds a failed instance is skipped")
    ] = 5.0,
    fleet_refresh: Annotated[
        float, typer.Option(min=0.1, help="seconds between fleet-registry reads")
    ] = 5.0,
    command_poll: Annotated[
        float,
        typer.Option(
            min=0.1, help="seconds between polls of the gateway's commands (admission policies)"
        ),
    ] = 1.0,
    kv_handoff: Annotated[
        KVHandoff,
        typer.Option(
            help="how decode instances get the prefill's KV: folder (ExampleConnector, a "
            "shared folder) or params (NixlConnector: kv_transfer_params from the prefill "
            "response to the decode request)"
        ),
    ] = KVHandoff.FOLDER,
    pools_from: Annotated[
        PoolSource,
        typer.Option(
            help="where the pools' members come from: fleet (the control plane's fleet "
            "registry) or kubernetes (the worker pods' goodput.dev/role label, watched; the "
            "fleet sync is then off)"
        ),
    ] = PoolSource.FLEET,
    kubernetes_namespace: Annotated[
        str,
        typer.Option(
            help="namespace of the worker pods (default: the service account's)",
            envvar="POD_NAMESPACE",
        ),
    ] = "",
    kubernetes_selector: Annotated[
        str, typer.Option(help="label selector of the worker pods")
    ] = DEFAULT_SELECTOR,
    kubernetes_api: Annotated[
        str | None,
        typer.Option(
            help="API server URL, used without a token (kubectl proxy); default: in-cluster"
        ),
    ] = None,
    worker_port: Annotated[
        int, typer.Option(min=1, max=65535, help="port the worker pods serve on")
    ] = 8000,
    engine_priority: Annotated[
        str,
        typer.Option(
            help="send each request's class to the engines as vLLM's priority (lower first; "
            "the engines must run --scheduling-policy priority): off, policy (the admission "
            "policy's class order: never-shed classes first, then by shed order) or "
            "CLASS=N pairs, e.g. critical=0,standard=1,sheddable=2,*=3"
        ),
    ] = "off",
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING, ERROR")] = "INFO",
) -> None:
    """Serve the OpenAI-compatible PD gateway (or a colocated proxy with --colocated)."""
    import uvicorn

    from serving.gateway.config import GatewayConfig, GatewayConfigError
    from serving.gateway.kubernetes import KubernetesError
    from serving.gateway.service import create_app

    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # httpx logs every upstream call at INFO: a line per request on the serving path.
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    try:
        config = GatewayConfig(
            prefill=tuple(prefill or ()),
            decode=tuple(decode or ()),
            colocated=tuple(colocated or ()),
            host=host,
            port=port,
            control_plane=control_plane,
            agent_key=agent_key,
            ingest_key=ingest_key,
            viewer_key=viewer_key,
            fleet_tenant=fleet_tenant,
            api_keys=_api_keys(api_keys),
            default_tenant=default_tenant,
            chunk_timeout_s=chunk_timeout,
            prefill_timeout_s=prefill_timeout,
            cooldown_s=cooldown,
            fleet_refresh_s=fleet_refresh,
            command_poll_s=command_poll,
            kv_handoff=kv_handoff,
            pools_from=pools_from,
            kubernetes_namespace=kubernetes_namespace,
            kubernetes_selector=kubernetes_selector,
            kubernetes_api=kubernetes_api,
            worker_port=worker_port,
            engine_priority=engine_priority,
        )
        if gateway_id:
            config = dataclasses.replace(config, gateway_id=gateway_id)
        app = create_app(config)
    except (GatewayConfigError, KubernetesError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    # Keep the objects of start-up (modules, the app) out of the collector's scans: a full
    # collection over them would stall every stream the gateway relays (as vLLM's server,
    # the gateway freezes them once, before serving).
    gc.collect()
    gc.freeze()
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,  # a line per request is per-request I/O on the serving path
        timeout_graceful_shutdown=5,
    )
