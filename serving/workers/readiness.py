"""The worker's readiness for Kubernetes: ``GET /ready`` answers 200 only while it serves.

On Kubernetes a pod that is not Ready leaves the gateways' pools (docs/deploy.md, "Roles
are labels"), so the pod's readinessProbe points here instead of at the engine's
``/health``: the answer is 200 while the worker's fleet state is ``ready``, and 503 while
it is ``starting``, ``draining``, ``drained`` or ``down``. A drained worker thus leaves
the pools without being killed (requests in flight finish; the liveness probe stays on the
engine's ``/health``), and ``resume`` brings it back. The body names the state.
``GET /health`` answers 200 while this server runs.

Plain ``http.server`` on its own thread and port (``--ready-port``), so it answers while
the engine is starting or busy.

Example::

    ready = ReadinessServer(lambda: supervisor.status().state, host="0.0.0.0", port=8001)
    ready.start()
    ...
    ready.stop()
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from exporters.fleet import FleetState

__all__ = ["ReadinessServer"]

logger = logging.getLogger(__name__)


class ReadinessServer:
    """Serves ``/ready`` from ``state()`` (see the module docstring); ``port`` 0 picks a
    free one (:attr:`port` says which)."""

    def __init__(
        self, state: Callable[[], FleetState], *, host: str = "0.0.0.0", port: int = 8001
    ) -> None:
        self._state = state
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="goodput-worker-ready", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving; idempotent."""
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(5)
            self._thread = None
        self._server.server_close()

    def answer(self) -> tuple[int, str]:
        """The status code and body of ``/ready`` now."""
        try:
            state = FleetState(self._state())
        except Exception:  # a failing state source is not ready, and must not kill serving
            logger.exception("readiness: the worker's state could not be read")
            return 503, "unknown"
        return (200 if state is FleetState.READY else 503), state.value

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return  # a line per probe would drown the worker's log

            def do_GET(self) -> None:
                if self.path == "/ready":
                    code, text = server.answer()
                elif self.path == "/health":
                    code, text = 200, "ok"
                else:
                    code, text = 404, "not found: GET /ready or /health"
                data = f"{text}\n".encode()
                self.send_response(code)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
