"""The database unreachable during ingest and admin writes: ingest goes on (the engine is in
memory, the write-ahead log on disk), admin writes answer a clear 503 with Retry-After,
rollup writes are kept and retried, and nothing is lost once the database is back.

The control plane reaches PostgreSQL through a TCP proxy that the test cuts (every
connection reset, new ones refused) and restores."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

from exporters.recorder import RequestRecorder
from exporters.records import Labels, Vantage
from exporters.transport import ControlPlaneExporter
from serving.workers.load import metric_sum
from tests.faults.conftest import ControlPlane
from tests.integration.controlplane.conftest import PG_URL, create_schema, drop_schema, schema_url

pytestmark = pytest.mark.faults

OUTAGE_S = 30.0  # as long as a managed PostgreSQL failover can take


class CuttableProxy:
    """A TCP proxy on loopback to ``target``; :meth:`cut` resets every connection and
    refuses new ones until :meth:`restore`."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open = True
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.open:
                client.close()
                continue
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.open = False
        with self.lock:
            for conn in self.conns:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            self.conns.clear()

    def restore(self) -> None:
        self.open = True

    def close(self) -> None:
        self.cut()
        self.listener.close()


@pytest.fixture
def proxied_database() -> Iterator[tuple[CuttableProxy, str]]:
    schema = create_schema()
    url = httpx.URL(PG_URL.replace("postgresql+psycopg", "http"))
    proxy = CuttableProxy((url.host, url.port or 5432))
    try:
        yield proxy, schema_url(schema).replace(f":{url.port or 5432}/", f":{proxy.port}/")
    finally:
        proxy.close()
        drop_schema(schema)


def test_a_database_outage_loses_nothing(
    tmp_path: Path, proxied_database: tuple[CuttableProxy, str]
) -> None:
    proxy, database_url = proxied_database
    plane = ControlPlane(tmp_path)
    plane.prepare(
        database_url=database_url, rollup_interval_s="1", wal_dir=str(tmp_path / "wal"),
        key_cache_ttl_s="1", database_retry_max_s="1",
    ).start()  # fmt: skip
    exporter = ControlPlaneExporter(
        plane.url, api_key=plane.keys["ingest"], flush_interval_s=0.05, backoff_initial_s=0.05,
        backoff_max_s=0.5, registry=CollectorRegistry(),
    )  # fmt: skip
    recorder = RequestRecorder(Vantage.GATEWAY, exporter)
    sent = 0

    def burst(n: int) -> None:
        nonlocal sent
        for _ in range(n):
            trace = recorder.start(f"r{sent}", Labels(model="llama"))
            trace.token()
            trace.finish()
            sent += 1

    try:
        burst(500)
        assert exporter.force_flush(30)
        proxy.cut()
        outage_end = time.monotonic() + OUTAGE_S
        with plane.admin() as http:
            while time.monotonic() < outage_end:
                burst(100)
                write = http.post(
                    "/api/v1/slos",
                    json={"name": f"o{sent}", "objectives": [{"metric": "ttft", "threshold_s": 1}],
                          "target": 0.9},
                )  # fmt: skip
                assert write.status_code == 503, write.text  # never a 500, never a lie
                assert write.headers["retry-after"]
                time.sleep(0.5)
        proxy.restore()
        burst(500)
        assert exporter.force_flush(60)
        exporter.shutdown(10)
        stats = exporter.stats()
        assert stats.num_dropped_records == stats.num_rejected_records == 0, stats
        assert stats.num_exported_records == sent
        assert plane.requests_counted() == sent
        deadline = time.monotonic() + 30
        while True:  # the rollups held back during the outage are written once it ends
            metrics = httpx.get(f"{plane.url}/metrics", timeout=10).text
            if metric_sum(metrics, "goodput_rollup_rows_pending") == 0:
                break
            assert time.monotonic() < deadline, "rollups still pending"
            time.sleep(0.5)
        assert metric_sum(metrics, "goodput_rollup_write_failures_total") > 0
    finally:
        plane.stop()
