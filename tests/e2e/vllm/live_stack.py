"""Gateways in front of the session's vLLM workers, for the live control-loop tests.

:func:`gateways` starts ``goodput gateway`` processes (each in its own process group,
stopped at the end) naming the workers statically and shipping records to the session's
control plane: a gateway with ``agent=True`` registers and applies the admission policies
the control plane pushes; one without takes no commands (a stack without the loops).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from goodput._demo_processes import ChildProcess

from .conftest import ControlPlane, free_port


@contextmanager
def gateways(
    control_plane: ControlPlane,
    directory: Path,
    statics: list[str],
    specs: dict[str, bool],
    extra: tuple[str, ...] = (),
) -> Iterator[dict[str, str]]:
    """``specs``: gateway id → takes commands; ``extra``: more options for each gateway.
    Yields gateway id → URL."""
    children: list[ChildProcess] = []
    urls: dict[str, str] = {}
    keys = control_plane.keys
    try:
        for gateway_id, agent in specs.items():
            port = free_port()
            commands = ["--agent-key", keys["agent"], "--command-poll", "0.5"] if agent else []
            argv = [sys.executable, "-m", "goodput", "gateway", "--host", "127.0.0.1",
                    "--port", str(port), *statics, "--control-plane", control_plane.url,
                    "--ingest-key", keys["ingest"], "--viewer-key", keys["viewer"],
                    "--gateway-id", gateway_id, "--fleet-refresh", "1", *commands, *extra,
                    "--log-level", "WARNING"]  # fmt: skip
            child = ChildProcess(argv, dict(os.environ), directory / f"{gateway_id}.log")
            children.append(child)
            urls[gateway_id] = f"http://127.0.0.1:{port}"
            child.wait_http(f"{urls[gateway_id]}/health", gateway_id, timeout_s=60.0)
        yield urls
    finally:
        for child in reversed(children):
            child.stop(timeout_s=15.0)


def eventually(check: Callable[[], Any], what: str, timeout_s: float = 30.0) -> Any:
    """``check()`` once it is truthy; fails naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        time.sleep(0.25)


def api(control_plane: ControlPlane, path: str, role: str = "viewer", **params: Any) -> Any:
    response = httpx.get(
        f"{control_plane.url}{path}", params=params, headers=control_plane.headers(role),
        timeout=10,
    )  # fmt: skip
    assert response.status_code == 200, response.text
    return response.json()


def post(control_plane: ControlPlane, path: str, body: dict[str, Any], role: str = "admin") -> Any:
    response = httpx.post(
        f"{control_plane.url}{path}", json=body, headers=control_plane.headers(role), timeout=10
    )
    assert response.status_code in (200, 201), response.text
    return response.json()
