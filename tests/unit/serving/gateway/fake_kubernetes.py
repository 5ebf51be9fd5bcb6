"""A fake Kubernetes API server on loopback, standing in for a cluster (none runs here).

It serves what the gateway's pod watcher reads: ``GET /api/v1/namespaces/NS/pods``, the
list (``{"kind": "PodList", "metadata": {"resourceVersion"}, "items"}``) or, with
``watch=1``, a watch stream of newline-delimited JSON events that the test writes
(:meth:`FakeKubernetes.send`, :meth:`FakeKubernetes.send_raw`) and ends
(:meth:`FakeKubernetes.end_watch`). ``list_status`` / ``watch_status`` make the next calls
fail with that HTTP status (a ``Status`` body, as the API server sends). Every call's
query is kept in ``lists`` and ``watches``. ``PATCH .../pods/NAME`` (a JSON merge patch
of the labels, as a worker's relabelling sends) changes the stored pod and, while a watch is
open, sends it as a ``MODIFIED`` event; each is kept in ``patches`` (name, content type,
body), and ``patch_status`` makes the next ones fail (403 with the message the API server
gives a missing right). Plain ``http.server`` in a thread (HTTP/1.0:
the watch's body ends when the connection closes, as a chunked one ends with its last
chunk).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

_END = b""


def pod(
    name: str,
    role: str | None = "prefill",
    *,
    ip: str | None = "10.0.0.1",
    ready: bool = True,
    terminating: bool = False,
    rv: str = "1",
    namespace: str = "goodput",
) -> dict[str, Any]:
    """A pod object shaped like the API server's (the fields the watcher reads, and a few)."""
    labels = {"app.kubernetes.io/name": "goodput", "app.kubernetes.io/component": "worker"}
    if role is not None:
        labels["goodput.dev/role"] = role
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels,
                            "resourceVersion": rv, "uid": f"uid-{name}"}  # fmt: skip
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {
        "phase": "Running",
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True" if ready else "False"},
        ],
    }
    if ip is not None:
        status["podIP"] = ip
    return {"kind": "Pod", "apiVersion": "v1", "metadata": meta, "status": status}


class FakeKubernetes:
    """The fake API server (see the module docstring); ``url`` once started."""

    def __init__(self, namespace: str = "goodput") -> None:
        self.namespace = namespace
        self.pods: dict[str, dict[str, Any]] = {}
        self.resource_version = 100
        self.list_status: list[int] = []  # statuses the next lists answer with
        self.watch_status: list[int] = []  # statuses the next watches answer with
        self.lists: list[dict[str, list[str]]] = []
        self.watches: list[dict[str, list[str]]] = []
        self.headers: list[dict[str, str]] = []
        self.patch_status: list[int] = []  # statuses the next patches answer with
        self.patches: list[dict[str, Any]] = []
        self._streams: list[queue.Queue[bytes]] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> FakeKubernetes:
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            for stream in self._streams:
                stream.put(_END)
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    # -- what the test drives --

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Store a pod (for the next list) with a fresh resourceVersion; the stored copy."""
        self.resource_version += 1
        obj = json.loads(json.dumps(obj))
        obj["metadata"]["resourceVersion"] = str(self.resource_version)
        self.pods[obj["metadata"]["name"]] = obj
        return obj

    def send(self, kind: str, obj: dict[str, Any]) -> None:
        """One watch event on the open watch: ``ADDED``/``MODIFIED`` store the pod,
        ``DELETED`` forgets it, ``BOOKMARK`` and ``ERROR`` send ``obj`` as is."""
        if kind in ("ADDED", "MODIFIED"):
            obj = self.put(obj)
        elif kind == "DELETED":
            self.pods.pop(obj["metadata"]["name"], None)
            self.resource_version += 1
            obj = json.loads(json.dumps(obj))
            obj["metadata"]["resourceVersion"] = str(self.resource_version)
        self.send_raw(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

    def send_raw(self, data: bytes) -> None:
        self._current().put(data)

    def end_watch(self) -> None:
        self._current().put(_END)

    @property
    def num_streams(self) -> int:
        """Watches that were answered 200 (each one's events go to the newest)."""
        with self._lock:
            return len(self._streams)

    def _current(self) -> queue.Queue[bytes]:
        with self._lock:
            assert self._streams, "no watch is open"
            return self._streams[-1]

    # -- the server --

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                query = parse_qs(url.query)
                fake.headers.append(dict(self.headers.items()))
                if url.path != f"/api/v1/namespaces/{fake.namespace}/pods":
                    self._status(404, "NotFound")
                    return
                if query.get("watch") == ["1"]:
                    fake.watches.append(query)
                    if fake.watch_status:
                        self._status(fake.watch_status.pop(0), "Expired")
                        return
                    self._watch()
                    return
                fake.lists.append(query)
                if fake.list_status:
                    self._status(fake.list_status.pop(0), "InternalError")
                    return
                body = {
                    "kind": "PodList",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(fake.resource_version)},
                    "items": list(fake.pods.values()),
                }
                self._json(200, body)

            def _watch(self) -> None:
                stream: queue.Queue[bytes] = queue.Queue()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.flush()
                with fake._lock:
                    fake._streams.append(stream)
                while (data := stream.get()) != _END:
                    try:
                        self.wfile.write(data)
                        self.wfile.flush()
                    except OSError:
                        return

            def do_PATCH(self) -> None:
                prefix = f"/api/v1/namespaces/{fake.namespace}/pods/"
                path = urlsplit(self.path).path
                fake.headers.append(dict(self.headers.items()))
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                name = path[len(prefix) :] if path.startswith(prefix) else ""
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = None
                fake.patches.append({"name": name, "body": body,
                                     "content_type": self.headers.get("Content-Type")})  # fmt: skip
                if fake.patch_status:
                    code = fake.patch_status.pop(0)
                    if code != 403:
                        self._status(code, "InternalError")
                        return
                    message = (
                        f'pods "{name}" is forbidden: User "system:serviceaccount:'
                        f'{fake.namespace}:goodput-worker" cannot patch resource "pods" in '
                        f'API group "" in the namespace "{fake.namespace}"'
                    )
                    self._status(code, "Forbidden", message)
                    return
                if self.headers.get("Content-Type") != "application/merge-patch+json":
                    self._status(415, "UnsupportedMediaType")
                    return
                if name not in fake.pods:
                    self._status(404, "NotFound", f'pods "{name}" not found')
                    return
                labels = (body or {}).get("metadata", {}).get("labels", {})
                updated = json.loads(json.dumps(fake.pods[name]))
                for key, value in labels.items():
                    if value is None:
                        updated["metadata"]["labels"].pop(key, None)
                    else:
                        updated["metadata"]["labels"][key] = value
                if fake.num_streams:
                    fake.send("MODIFIED", updated)
                else:
                    fake.put(updated)
                self._json(200, fake.pods[name])

            def _status(self, code: int, reason: str, message: str = "") -> None:
                status = {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                          "reason": reason, "code": code}  # fmt: skip
                if message:
                    status["message"] = message
                self._json(code, status)

            def _json(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


def wait_for(check: Callable[[], bool], timeout_s: float = 10.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what or check}"
        time.sleep(0.01)
