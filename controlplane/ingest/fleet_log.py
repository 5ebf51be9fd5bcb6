"""The fleet's ingest log: one PostgreSQL table that every control-plane replica appends
to and every replica reads, in one order, into its own goodput engine.

Replicas that share a database with ``GOODPUT_FLEET_INGEST`` do not count the batches they
receive: they append them to ``goodput_fleet_log`` (the write-ahead log's entry format,
:func:`controlplane.ingest.replay.log_entry`) and acknowledge once the row is committed.
Each replica's reader then applies every row, its own and the others', in the order of
the inserting transaction's id, so every engine sees the same records in the same order
and answers the same (docs/scale-out.md).

**Appending** is a group commit, as the local log's ``fsync``: a batch is queued under
the ingest lock (:meth:`FleetLog.append`), a writer thread inserts whatever is queued in
one transaction, and the request waits outside the lock for the commit that covers it
(:meth:`FleetLog.sync`). A failed commit fails the batches it carried (the exporters get
503 and resend); the log stays usable: the next commit may succeed.

**Own rows are not read back.** The writer keeps each committed row's decoded records in
memory by row id (at most :data:`MAX_OWN_ROWS`); the reader asks the database only for
the other replicas' entries and takes its own from memory, so the cross-replica path
adds to a replica's own batches one insert and no second decode. A row missing there
(after a restart, or evicted) is fetched whole.

**Reading in one order.** A ``bigserial`` is not a safe cursor: ids are handed out when a
transaction inserts, not when it commits, so a reader can see id 8 before id 7 commits.
Each row carries its transaction's id (``pg_current_xact_id()``), and the reader takes only
rows of transactions older than the oldest one still running
(``pg_snapshot_xmin(pg_current_snapshot())``): those have all committed or aborted, so
nothing can appear behind the cursor. Whole transactions are read at once (the cursor is
a transaction id). The cost: a transaction left open anywhere in the database cluster
holds every reader back until it ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import psycopg
import sqlalchemy as sa

from controlplane.db import sync_url
from controlplane.ingest.replay import entry_batch
from controlplane.ingest.wal import WalError, decode_entry
from exporters.records import RecordBatch

__all__ = ["FLEET_EPOCH", "FleetLog", "FleetRow"]

logger = logging.getLogger(__name__)

#: The checkpoint row's epoch in the fleet mode (the log has no epoch of its own: a
#: database reset empties the table with everything else).
FLEET_EPOCH = "fleet"
#: Rows committed in one transaction at most (bounds one read as well as one write).
MAX_ROWS_PER_COMMIT = 512
#: Transactions read at most per :meth:`FleetLog.read`.
MAX_TRANSACTIONS_PER_READ = 64
#: This replica's committed rows kept decoded until its reader reaches them.
MAX_OWN_ROWS = 8192

_INSERT = (
    "INSERT INTO goodput_fleet_log (txid, origin, max_finish_minute, entry) "
    "VALUES (pg_current_xact_id()::text::bigint, %(origin)s, %(max_finish_minute)s, "
    "%(entry)s) RETURNING id"
)
_READ = (
    "SELECT txid, id, CASE WHEN origin = %(origin)s THEN NULL ELSE entry END "
    "FROM goodput_fleet_log "
    "WHERE txid > %(after)s AND txid <= ("
    "  SELECT max(t) FROM (SELECT DISTINCT txid AS t FROM goodput_fleet_log"
    "    WHERE txid > %(after)s"
    "      AND txid < pg_snapshot_xmin(pg_current_snapshot())::text::bigint"
    "    ORDER BY t LIMIT %(transactions)s) AS ready"
    ") ORDER BY txid, id"
)
_ENTRIES = "SELECT id, entry FROM goodput_fleet_log WHERE id = ANY(%(ids)s)"
_RELEASE = sa.text(
    "DELETE FROM goodput_fleet_log WHERE txid <= :through AND max_finish_minute < :minute"
)


@dataclass(frozen=True, slots=True)
class FleetRow:
    """One row read back: its transaction id (the cursor), the batch's ``(exporter_id,
    seq)`` (``None`` for OTLP) and its records."""

    txid: int
    key: tuple[str, int] | None
    batch: RecordBatch

    @classmethod
    def of_entry(cls, txid: int, entry: dict[str, Any]) -> FleetRow:
        key = (entry["x"], entry["s"]) if "x" in entry else None
        return cls(txid, key, entry_batch(entry))


class _Ticket:
    __slots__ = ("batch", "done", "error", "key")

    def __init__(self, key: tuple[str, int] | None, batch: RecordBatch) -> None:
        self.key, self.batch = key, batch
        self.done = False
        self.error: str | None = None


class FleetLog:
    """Appends this replica's batches to ``goodput_fleet_log`` and reads everyone's.

    ``database_url``: the control plane's (PostgreSQL). ``origin``: this replica's id,
    stored with each row (what the log's metrics and an operator read; the readers apply
    every row alike). Thread-safe."""

    def __init__(self, database_url: str, origin: str) -> None:
        self.origin = origin
        self._engine = sa.create_engine(sync_url(database_url), pool_size=2, pool_pre_ping=True)
        if self._engine.dialect.name != "postgresql":
            self._engine.dispose()
            raise WalError("the fleet ingest log needs PostgreSQL (GOODPUT_FLEET_INGEST)")
        self._conninfo = self._engine.url.set(drivername="postgresql").render_as_string(
            hide_password=False
        )
        self._connection: psycopg.Connection[Any] | None = None
        #: The reader's connection (autocommit: one round trip a read, no ping, no
        #: rollback on return to a pool).
        self._reader: psycopg.Connection[Any] | None = None
        self._reader_lock = threading.Lock()
        self._own: OrderedDict[int, tuple[tuple[str, int] | None, RecordBatch]] = OrderedDict()
        self._own_lock = threading.Lock()
        self._cond = threading.Condition()
        self._queue: deque[tuple[_Ticket, dict[str, Any]]] = deque()
        self._closed = False
        self.num_commits = 0
        self.num_commit_failures = 0
        self.num_rows_appended = 0
        #: Called (from the writer thread) after each commit: the reader reads this
        #: replica's batches at once instead of at its next poll.
        self.on_commit: Callable[[], None] | None = None
        self._writer = threading.Thread(target=self._write_loop, name="fleet-log", daemon=True)
        self._writer.start()

    # -- appending --------------------------------------------------------------------

    def append(self, entry: dict[str, Any], max_finish_minute: int, batch: RecordBatch) -> _Ticket:
        """Queue one entry (whose records are ``batch``) for the next commit; :meth:`sync`
        waits for it."""
        ticket = _Ticket((entry["x"], entry["s"]) if "x" in entry else None, batch)
        row = {
            "origin": self.origin,
            "max_finish_minute": int(max_finish_minute),
            "entry": msgpack.packb(entry, use_bin_type=True),
        }
        with self._cond:
            if self._closed:
                raise WalError("the fleet ingest log is closed")
            self._queue.append((ticket, row))
            self._cond.notify_all()
        return ticket

    def sync(self, ticket: _Ticket, timeout_s: float = 30.0) -> None:
        """Wait until ``ticket``'s row is committed; :class:`WalError` if its commit failed
        or did not come within ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not ticket.done:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WalError(f"the fleet ingest log did not commit within {timeout_s} s")
                self._cond.wait(left)
        if ticket.error is not None:
            raise WalError(ticket.error)

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue and self._closed:
                    return
                count = min(len(self._queue), MAX_ROWS_PER_COMMIT)
                taken = [self._queue.popleft() for _ in range(count)]
            error = self._commit(taken)
            with self._cond:
                for ticket, _ in taken:
                    ticket.done, ticket.error = True, error
                self._cond.notify_all()

    def _commit(self, taken: list[tuple[_Ticket, dict[str, Any]]]) -> str | None:
        ids: list[int] = []
        try:
            connection = self._connection
            if connection is None or connection.closed:
                connection = self._connection = psycopg.connect(self._conninfo)
            with connection.cursor() as cursor:
                cursor.executemany(_INSERT, [row for _, row in taken], returning=True)
                while True:
                    ids.append(int(cursor.fetchone()[0]))  # type: ignore[index]
                    if not cursor.nextset():
                        break
            # Kept before the commit: the reader may reach the rows as soon as it is done.
            with self._own_lock:
                for row_id, (ticket, _) in zip(ids, taken, strict=True):
                    self._own[row_id] = (ticket.key, ticket.batch)
                while len(self._own) > MAX_OWN_ROWS:
                    self._own.popitem(last=False)
            connection.commit()
        except Exception as exc:  # the database is away: these batches are not acknowledged
            with self._own_lock:
                for row_id in ids:
                    self._own.pop(row_id, None)
            if self._connection is not None:
                self._connection.close()
                self._connection = None
            self.num_commit_failures += 1
            logger.warning("fleet ingest log: a commit of %d batch(es) failed: %s", len(taken), exc)
            return f"the fleet ingest log could not commit ({type(exc).__name__}); retry later"
        self.num_commits += 1
        self.num_rows_appended += len(taken)
        if self.on_commit is not None:
            try:
                self.on_commit()
            except Exception:  # the reader polls anyway
                logger.exception("fleet ingest log: the commit callback failed")
        return None

    # -- reading ----------------------------------------------------------------------

    def read(self, after_txid: int) -> list[FleetRow]:
        """The rows of up to :data:`MAX_TRANSACTIONS_PER_READ` whole transactions after
        ``after_txid`` that can no longer be joined by an earlier one, in order."""
        with self._reader_lock:
            connection = self._reader
            if connection is None or connection.closed:
                connection = self._reader = psycopg.connect(self._conninfo, autocommit=True)
            try:
                found = connection.execute(
                    _READ,
                    {
                        "after": after_txid,
                        "transactions": MAX_TRANSACTIONS_PER_READ,
                        "origin": self.origin,
                    },
                ).fetchall()
                own: dict[int, tuple[tuple[str, int] | None, RecordBatch]] = {}
                with self._own_lock:
                    for _, row_id, entry in found:
                        if entry is None and row_id in self._own:
                            own[row_id] = self._own.pop(row_id)
                missing = [
                    row_id for _, row_id, entry in found if entry is None and row_id not in own
                ]
                fetched: dict[int, bytes] = {}
                if missing:  # own rows not in memory (a restart): read them whole
                    fetched = dict(connection.execute(_ENTRIES, {"ids": missing}).fetchall())
            except Exception:  # the database is away: the next read connects again
                connection.close()
                self._reader = None
                raise
        rows = []
        for txid, row_id, entry in found:
            if row_id in own:
                key, batch = own[row_id]
                rows.append(FleetRow(int(txid), key, batch))
            else:
                payload = entry if entry is not None else fetched[row_id]
                rows.append(FleetRow.of_entry(int(txid), decode_entry(bytes(payload))))
        return rows

    def release(self, through_txid: int, covered_until_minute: int) -> int:
        """Delete the rows a checkpoint covers whole: up to ``through_txid`` and finishing
        before minute ``covered_until_minute``. Returns how many."""
        with self._engine.begin() as connection:
            result = connection.execute(
                _RELEASE, {"through": through_txid, "minute": covered_until_minute}
            )
            return int(result.rowcount or 0)

    def close(self) -> None:
        """Commit what is queued, stop the writer, close the connections."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._writer.join(timeout=10.0)
        if self._connection is not None:
            self._connection.close()
        with self._reader_lock:
            if self._reader is not None:
                self._reader.close()
        self._engine.dispose()
