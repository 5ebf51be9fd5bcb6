"""A real control-plane ingest endpoint on loopback, for the transport's integration tests.

``IngestServer`` is a stdlib ``ThreadingHTTPServer`` on 127.0.0.1 that decodes batches with
:func:`exporters.wire.decode_batch` and de-duplicates them by ``(exporter_id, seq)``, as the
control plane does. It can be stopped and started again on the same port, and scripted to
answer a status, or to store a batch and hang up without answering (a lost acknowledgement).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from exporters.records import RequestRecord
from exporters.transport import INGEST_PATH
from exporters.wire import WireError, decode_batch

LOST_ACK = -1  # scripted action: store the batch, then close without a response


@dataclass
class Receiver:
    """What the endpoint received, after de-duplication."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    seen: set[tuple[str, int]] = field(default_factory=set)
    records: list[RequestRecord] = field(default_factory=list)
    seqs: list[int] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    num_duplicates: int = 0
    num_invalid: int = 0
    # Scripted answers, one per request, then 200: a status code, (status, headers), LOST_ACK.
    script: deque[int | tuple[int, dict[str, str]]] = field(default_factory=deque)

    def request_ids(self) -> list[str]:
        with self.lock:
            return [r.request_id for r in self.records]

    def count(self) -> int:
        with self.lock:
            return len(self.records)


class IngestServer:
    """The endpoint, restartable on the same port (``url`` does not change)."""

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver
        self.port = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        assert self._server is None
        server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self.receiver))
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01})
        self._thread.start()

    def stop(self) -> None:
        assert self._server is not None and self._thread is not None
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self._server = self._thread = None


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with receiver.lock:
                receiver.headers.append(dict(self.headers.items()))
                action = receiver.script.popleft() if receiver.script else 200
            status, extra = action if isinstance(action, tuple) else (action, {})
            if self.path != INGEST_PATH:
                status = 404
            if status == 200 or status == LOST_ACK:
                try:
                    header, batch = decode_batch(body)
                except WireError as exc:
                    with receiver.lock:
                        receiver.num_invalid += 1
                    self._answer(400, {}, str(exc).encode())
                    return
                with receiver.lock:
                    key = (header.exporter_id, header.seq)
                    if key in receiver.seen:
                        receiver.num_duplicates += 1
                    else:
                        receiver.seen.add(key)
                        receiver.seqs.append(header.seq)
                        receiver.records.extend(batch.records())
            if status == LOST_ACK:
                self.close_connection = True  # hang up: the client never hears back
                return
            self._answer(status, extra, b"{}")

        def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet: the tests assert on what was received

    return Handler


WaitUntil = Callable[..., None]


def _wait_until(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Poll ``condition`` every few ms; fail the test if it is still false at the timeout."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout_s}s")
        time.sleep(0.005)


@pytest.fixture
def wait_until() -> WaitUntil:
    return _wait_until


@pytest.fixture
def receiver() -> Receiver:
    return Receiver()


@pytest.fixture
def server(receiver: Receiver) -> Iterator[IngestServer]:
    server = IngestServer(receiver)
    server.start()
    yield server
    if server._server is not None:
        server.stop()
