"""Change capture from one Postgres source into the stream store.

One replication session: hold the slot against the store's checkpoint (core/pg/slot.py),
START_REPLICATION with pgoutput, decode every message, gather whole transactions, and commit
them with the LSN checkpoint in one store transaction; only then confirm the flush LSN to
Postgres. A transaction at or below the stored checkpoint is skipped, so a change is stored
exactly once even when Postgres sends it again after a crash.

Batches go to the store on a thread of their own (core/pg/store_thread.py), so decoding the
next batch overlaps the store's work on this one. Batching is natural: a batch is committed when
the socket has nothing more to read and the store thread is idle, or when it reaches
``max_batch`` changes or ``max_batch_wait``. A long transaction is written in chunks into the
one open store transaction, so memory stays bounded.
"""

from __future__ import annotations

import logging
import random
import selectors
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import psycopg

from core.config import PostgresSource
from core.ids import collection_id_of
from core.metrics import Metrics
from core.pg import snapshot
from core.pg.pgoutput import (
    XLOG_HEADER,
    decode,
    decode_copy_data,
    lsn_to_str,
    standby_status,
    start_replication,
)
from core.pg.relations import Relations, SourceSchemaError, change_of, old_row
from core.pg.setup import (
    BACKFILL_PREFIX,
    DROPPED_PREFIX,
    SlotBusyError,
    SourceSetupError,
    capturable_tables,
    prepare,
    tables_wanted,
)
from core.pg.slot import SlotGapError, check_slot, unreadable
from core.pg.store_thread import StoreThread
from core.pg.values import SESSION_OPTIONS
from core.store import Store
from core.store.change import Change, UnstorableChange
from core.store.writer import SourceWriter, WriterBusyError
from core.tables import table_name

log = logging.getLogger("weir.source")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

FATAL = (SourceSetupError, SourceSchemaError, WriterBusyError, UnstorableChange)
BUSY_WAIT = 0.002  # seconds between looks at a busy store thread while a batch waits
ADVANCE_EVERY = 1.0  # seconds between positions written for the slot while nothing is captured


class CaptureError(SourceSchemaError):
    """A change could not be read; the message names the table and LSN."""


def _iso(us: int) -> str:
    return (_EPOCH + timedelta(microseconds=us)).isoformat()


def _now_us() -> int:
    return time.time_ns() // 1000


class PostgresCapture:
    """Captures one ``postgres`` source until ``stop`` is set.

    ``run`` reconnects with exponential backoff and jitter after the source or the store goes
    away; a problem only the user can fix (see ``FATAL``) is raised instead.
    """

    def __init__(self, src: PostgresSource, store: Store, metrics: Metrics | None = None) -> None:
        self.src = src
        self.store = store
        self.changes = (metrics or Metrics()).changes.labels(src.name)
        self.flushed_lsn = 0  # stored, so it may be confirmed to Postgres
        self.sent_lsn = 0  # confirmed to Postgres
        self.stored_changes = 0
        self.state = "starting"
        self.detail = ""  # why, when reconnecting or failed

    # -- supervision --------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        delay = 0.5
        while not stop.is_set():
            try:
                self.session(stop)
                return
            except FATAL as e:
                self.state, self.detail = "failed", str(e)
                raise
            except (psycopg.OperationalError, SlotBusyError) as e:
                if self._unreadable(str(e)):
                    continue  # the slot was dropped: the next session makes it and backfills
                first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                self.state, self.detail = "reconnecting", first_line
                log.warning(
                    "source %s: %s; reconnecting in %.1fs",
                    self.src.name,
                    first_line,
                    delay,
                    exc_info=log.isEnabledFor(logging.DEBUG),
                )
                stop.wait(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, 30.0)

    def _unreadable(self, error: str) -> bool:
        """The slot can never be read past where it is (core/pg/slot.py ``unreadable``)."""
        try:
            with snapshot.connect(self.src.url.get_secret_value(), "weir-catalog") as conn:
                return unreadable(conn, self.src, error)
        except psycopg.OperationalError:
            return False  # the source is away: the next session looks again
        except SlotGapError as e:
            self.state, self.detail = "failed", str(e)
            raise

    # -- one replication session --------------------------------------------------------------

    def session(self, stop: threading.Event) -> None:
        """Steps, in order: 1. own the source's writer lock; 2. check the tables and complete
        the publication; 3. hold the slot against the checkpoint (and tell the store where
        capture starts, with any backfill a lost slot or a late table calls for); 4. stream.
        """
        src = self.src
        url = src.url.get_secret_value()
        with (
            snapshot.connect(url, "weir-catalog") as catalog,
            self.store.connect() as store_conn,
        ):  # fmt: skip
            writer = SourceWriter(store_conn, self.store, src.sync_id)
            # Step 1: one capture per source, whatever the slot says.
            writer.lock(src.name)
            # Step 2
            prepare(catalog, src, slot=False)
            # Step 3
            start = self._hold_slot(catalog, writer)
            # Step 4. Text comes in the database's own encoding, unconverted: the server cannot
            # convert every byte a database may hold (core/pg/values.py decodes it).
            row = catalog.execute("SHOW server_encoding").fetchone()
            encoding = str(row[0]) if row else "UTF8"
            store_schema = self.store.schema if _same_database(catalog, store_conn) else None
            wanted = tables_wanted(src, store_schema)
            relations = Relations(catalog, src.key_columns, encoding, wanted, src.name)
            # Not a `with` block: psycopg would try to COMMIT on a connection in COPY mode.
            repl = psycopg.connect(
                url,
                autocommit=True,
                replication="database",
                options=SESSION_OPTIONS,
                client_encoding=encoding,
                application_name=f"weir:{src.name}",
            )
            try:
                self._start(repl, start)
                log.info("source %s: streaming from slot %s at %s", src.name, src.slot,
                         lsn_to_str(start))  # fmt: skip
                self.state, self.detail = "streaming", ""
                _Stream(self, repl, catalog, writer, relations, stop).run()
            finally:
                writer.rollback()
                repl.close()

    def _hold_slot(self, catalog: psycopg.Connection[Any], writer: SourceWriter) -> int:
        """Check the slot against the checkpoint; store where capture starts, with a backfill
        of every table when changes were lost with the slot. Returns the start position."""
        src = self.src
        cp = writer.checkpoint()
        start = check_slot(catalog, src, cp)
        if start.gap is not None:
            writer.request_backfills(capturable_tables(catalog, src), start.gap)
        if start.gap is not None or not cp.tracked or start.lsn != cp.end_lsn:
            writer.advance(start.lsn)
        self.flushed_lsn = max(self.flushed_lsn, start.lsn)
        return start.lsn

    def _start(self, repl: psycopg.Connection[Any], start_lsn: int) -> None:
        pgconn = repl.pgconn
        pgconn.send_query(start_replication(self.src.slot, self.src.publication, start_lsn))
        result = pgconn.get_result()
        if result is None or result.status != psycopg.pq.ExecStatus.COPY_BOTH:
            message = (result.error_message if result else b"").decode(errors="replace").strip()
            if "is active for PID" in message:
                raise SlotBusyError(
                    f"source {self.src.name!r}: replication slot {self.src.slot!r} is in use "
                    f"by another process ({message}): stop it or use another slot name"
                )
            # Anything else (an invalidated slot among them) is looked at by the next
            # session's slot check.
            raise psycopg.OperationalError(f"START_REPLICATION failed: {message}")

    def send_status(self, pgconn: Any) -> None:
        lsn = self.sent_lsn = self.flushed_lsn
        pgconn.put_copy_data(standby_status(lsn, lsn, _now_us()))
        pgconn.flush()


class _Stream:
    """One session's stream: decodes messages and hands whole transactions to the store.

    ``pending`` holds changes not yet handed over; ``pending[:complete]`` belong to
    transactions whose Commit has arrived, the last of them ``committed`` (commit_lsn,
    end_lsn). A position no commit carries (keepalives and heartbeats while nothing is
    captured) is written to the store before it is confirmed, so the slot never passes it.
    """

    def __init__(
        self,
        capture: PostgresCapture,
        repl: psycopg.Connection[Any],
        catalog: psycopg.Connection[Any],
        writer: SourceWriter,
        relations: Relations,
        stop: threading.Event,
    ) -> None:
        self.capture = capture
        self.src = src = capture.src
        self.pgconn = repl.pgconn
        self.catalog = catalog
        self.relations = relations
        self.checkpoint_lsn = writer.checkpoint().commit_lsn
        self.stop = stop
        self.max_batch, self.max_wait = src.max_batch, src.max_batch_wait.total_seconds()
        self.status_every = src.status_interval.total_seconds()
        self.heartbeat_every = src.heartbeat_interval.total_seconds()
        self.pending: list[Change] = []
        self.complete = 0
        self.committed: tuple[int, int] | None = None
        self.in_txn = False
        self.skip = False  # this transaction is already in the store
        self.txn_lsn = 0
        self.txn_ts = ""
        self.idx = 0
        self.batch_started = 0.0
        self.last_status = self.last_data = self.last_advance = time.monotonic()
        self.uncommitted = 0  # changes written to the store and not yet committed
        self.store = StoreThread(writer, self._stored, self._confirmed)

    def _stored(self, n: int) -> None:
        self.capture.stored_changes += n
        self.uncommitted += n

    def _confirmed(self, end_lsn: int) -> None:
        cap = self.capture
        cap.flushed_lsn = max(cap.flushed_lsn, end_lsn)
        cap.changes.inc(self.uncommitted)
        self.uncommitted = 0

    def run(self) -> None:
        pgconn = self.pgconn
        sel = selectors.DefaultSelector()
        sel.register(pgconn.socket, selectors.EVENT_READ)
        try:
            while not self.stop.is_set():
                nbytes, data = pgconn.get_copy_data(1)
                if nbytes > 0:
                    if data[0] == 107:  # 'k' keepalive
                        self._keepalive(bytes(data))
                    else:
                        self._message(decode(bytes(data[XLOG_HEADER:])))  # XLogData
                elif nbytes == 0:
                    self._idle(sel)
                else:
                    result = pgconn.get_result()
                    message = result.error_message.decode(errors="replace") if result else ""
                    raise psycopg.OperationalError(f"replication stream ended: {message.strip()}")
            # Stop: keep what is complete, drop the partial transaction (it will be sent again).
            if self.committed is not None:
                self._flush()
            self.store.finish()
            self.capture.send_status(pgconn)
            self.capture.state = "stopped"
        except BaseException:
            self.store.abort()
            raise

    # -- messages -------------------------------------------------------------------------------

    def _keepalive(self, data: bytes) -> None:
        _, wal_end, reply = decode_copy_data(data)
        self._advance(wal_end)
        if reply:
            self.capture.send_status(self.pgconn)
            self.last_status = time.monotonic()

    def _message(self, m: tuple[Any, ...]) -> None:
        tag = m[0]
        if tag in ("I", "U", "D"):
            if not self.skip:
                self._change(m)
        elif tag == "B":
            self.in_txn = True
            self.txn_lsn, self.txn_ts, self.idx = m[1], _iso(m[2]), 0
            self.skip = self.txn_lsn <= self.checkpoint_lsn
            if self.committed is None:
                self.batch_started = time.monotonic()
        elif tag == "C":
            self.in_txn = False
            self.last_data = time.monotonic()
            if not self.skip:
                self.committed, self.complete = (m[2], m[3]), len(self.pending)
                if (self.complete >= self.max_batch
                        or self.last_data - self.batch_started >= self.max_wait):  # fmt: skip
                    self._flush()
        elif tag == "T":
            if not self.skip:
                for relid in m[2]:
                    rel = self.relations.by_id[relid]
                    if rel.ignored:
                        continue
                    self._append(Change("truncate", rel.collection_id, None, None, None, (), None,
                                        self.txn_lsn, self.idx, self.txn_ts))  # fmt: skip
        elif tag == "R":
            self.relations.add(m)
        elif tag == "M" and not m[1]:  # a non-transactional message: our heartbeat
            self._advance(m[2])
        elif tag == "M" and m[3] in (BACKFILL_PREFIX, DROPPED_PREFIX) and not self.skip:
            self._table_message(m[3], bytes(m[4]))
        # 'Y' types and 'O' origins need nothing

    def _table_message(self, prefix: str, content: bytes) -> None:
        """A message of Weir's event trigger or setup (core/pg/setup.py): a table joined the
        publication with rows of its own (backfill it), or was dropped (its records are gone).
        Any role may write such a message, so only a table of this source's is taken."""
        try:
            schema, table = orjson.loads(content)
            if not (isinstance(schema, str) and isinstance(table, str)):
                raise ValueError(content)
        except (ValueError, TypeError):
            log.warning("source %s: ignored a %s message that names no table, in the "
                        "transaction at %s", self.src.name, prefix,
                        lsn_to_str(self.txn_lsn))  # fmt: skip
            return
        wanted = self.relations.wanted
        if wanted is not None and not wanted(schema, table):
            return
        if prefix == BACKFILL_PREFIX:
            self.store.submit("backfill", (schema, table))
            return
        # Dropped: after the changes before it in its transaction, every record a tombstone.
        if self.committed is not None:
            self._flush()
        if self.pending:
            self.store.submit("write", self.pending[:])
            self.pending.clear()
        collection = collection_id_of(schema, table)
        self.store.submit("drop", (collection, self.txn_lsn, self.idx, self.txn_ts))
        self.idx += 1

    def _change(self, m: tuple[Any, ...]) -> None:
        rel = self.relations.by_id[m[1]]
        if rel.ignored:
            return
        try:
            if rel.problem is not None:
                raise SourceSchemaError(rel.problem)
            ch = change_of(m, rel, self.txn_lsn, self.idx, self.txn_ts)
        except Exception as e:
            name = table_name(rel.schema, rel.table)
            raise CaptureError(
                f"source {self.src.name!r}: cannot read a change of table {name} in the "
                f"transaction at {lsn_to_str(self.txn_lsn)}: {e}"
            ) from e
        if ch.old_record_id is not None and ch.old_record_id != ch.record_id:
            # The key changed: the old record is gone (a delete), the new one appears.
            old, missing = old_row(m, rel)
            self._append(Change("delete", ch.collection_id, ch.old_record_id, old, None, missing,
                                None, ch.version, self.idx, ch.committed_at))  # fmt: skip
            ch = ch._replace(action="insert", changes=None, idx=self.idx)
        pending = self.pending
        if rel.partition_key is not None and ch.action == "insert" and pending:
            prev = pending[-1]
            if (prev.action == "delete" and prev.version == ch.version
                    and prev.collection_id == ch.collection_id
                    and prev.record_id == ch.record_id
                    and _other_partition(rel.partition_key, prev, ch)):  # fmt: skip
                pending[-1] = _moved(prev, ch)  # a row moved to another partition
                return
        self._append(ch)

    def _append(self, ch: Change) -> None:
        pending = self.pending
        pending.append(ch)
        self.idx += 1
        if len(pending) > self.max_batch:
            # A long transaction: commit the finished ones, then write this one in chunks into
            # the open store transaction. The last change stays, to meet a move's insert.
            if self.committed is not None:
                self._flush()
            self.store.submit("write", pending[:-1])
            del pending[:-1]

    def _flush(self) -> None:
        """Commit the complete transactions with their checkpoint (on the store thread); the
        flush LSN moves once they are committed, and goes out with the next status.
        """
        assert self.committed is not None
        self.store.submit("write", self.pending[: self.complete])
        self.store.submit("commit", self.committed)
        del self.pending[: self.complete]
        self.committed, self.complete = None, 0
        self.capture.send_status(self.pgconn)

    def _advance(self, lsn: int) -> None:
        """Everything before ``lsn`` is in the store: let the slot move there, once the store
        has it too (rate-limited: a position a second at most)."""
        now = time.monotonic()
        if (not self.in_txn and self.committed is None and lsn > self.capture.flushed_lsn
                and now - self.last_advance >= ADVANCE_EVERY and self.store.idle()):  # fmt: skip
            self.last_advance = now
            self.store.submit("advance", lsn)

    def _idle(self, sel: selectors.BaseSelector) -> None:
        """Nothing more to read right now: commit what is complete (latency) and wait. While
        the store thread is busy a batch gains nothing by going early: it grows instead (to
        max_batch_wait), so a backlog is written in large batches rather than one per gap."""
        cap, now = self.capture, time.monotonic()
        if self.committed is not None and (
            self.store.idle() or now - self.batch_started >= self.max_wait
        ):
            self._flush()
        if now - self.last_status >= self.status_every or cap.flushed_lsn > cap.sent_lsn:
            cap.send_status(self.pgconn)  # periodic, or a commit is to confirm
            self.last_status = now
        if now - self.last_data >= self.heartbeat_every and not self.in_txn:
            self.catalog.execute(
                "SELECT pg_logical_emit_message(false, 'weir_heartbeat', now()::text)"
            )
            self.last_data = now
        timeout = BUSY_WAIT if self.committed else min(self.status_every, self.heartbeat_every, 1.0)
        sel.select(timeout)
        self.pgconn.consume_input()


def _same_database(a: psycopg.Connection[Any], b: psycopg.Connection[Any]) -> bool:
    """Whether two connections are to one database of one server."""
    same = "SELECT current_database(), pg_postmaster_start_time(), inet_server_port()"
    return a.execute(same).fetchone() == b.execute(same).fetchone()


def _other_partition(key: tuple[str, ...], delete: Change, insert: Change) -> bool:
    """Whether the inserted row's partition key differs from the deleted one's: a row moved
    between partitions, not one deleted and inserted anew (unknown for an expression key)."""
    old, new = delete.record or {}, insert.record or {}
    return not key or any(k in old and k in new and old[k] != new[k] for k in key)


def _moved(delete: Change, insert: Change) -> Change:
    """A row moved between partitions (a delete and an insert of one record, one after the
    other in a transaction) is an update of the record (DESIGN.md section 3)."""
    changes = None
    if not delete.missing and delete.record is not None and insert.record is not None:
        old, new = delete.record, insert.record
        changes = {k: v for k, v in old.items() if k in new and new[k] != v}
    return insert._replace(action="update", changes=changes, idx=delete.idx)
