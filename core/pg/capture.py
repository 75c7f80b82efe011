"""Change capture from one Postgres source into the stream store.

One replication session: START_REPLICATION with pgoutput, decode every message, gather whole
transactions, and commit them with the LSN checkpoint in one store transaction; only then
confirm the flush LSN to Postgres. A transaction at or below the stored checkpoint is skipped,
so a change is stored exactly once even when Postgres sends it again after a crash.

Batches go to the store on a thread of their own (``_StoreThread``; one thread and one FIFO, so
they commit in order), and decoding the next batch overlaps the store's work on this one.
Batching is natural: a batch is committed when the socket has nothing more to read and the store
thread is idle, or when it reaches ``max_batch`` changes or ``max_batch_wait``. A long
transaction is written in chunks into the one open store transaction, so memory stays bounded.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import selectors
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from core.config import PostgresSource
from core.metrics import Metrics
from core.pg.pgoutput import (
    XLOG_HEADER,
    decode,
    decode_copy_data,
    lsn_to_str,
    standby_status,
    start_replication,
)
from core.pg.relations import Relations, SourceSchemaError, change_of
from core.pg.setup import SlotBusyError, SourceSetupError, prepare
from core.pg.values import SESSION_OPTIONS
from core.store import Store
from core.store.writer import Change, SourceWriter, WriterBusyError

log = logging.getLogger("weir.source")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

FATAL = (SourceSetupError, SourceSchemaError, WriterBusyError)
BUSY_WAIT = 0.002  # seconds between looks at a busy store thread while a batch waits


class _StoreThread:
    """Writes the capture's batches into the store on a thread, in the order given.

    ``submit`` hands over changes, with the (commit_lsn, end_lsn) checkpoint to commit them
    with, or None for a chunk of a long transaction. On this thread ``on_stored(n)`` runs after
    each write and ``on_commit(end_lsn)`` after each commit. A store error is raised in the
    capture thread at its next call. At most ``DEPTH`` batches wait, so memory stays bounded.
    """

    DEPTH = 2

    def __init__(
        self,
        writer: SourceWriter,
        on_stored: Callable[[int], None],
        on_commit: Callable[[int], None],
    ) -> None:
        self.writer = writer
        self.on_stored = on_stored
        self.on_commit = on_commit
        self.queue: queue.Queue[tuple[list[Change], tuple[int, int] | None] | None] = queue.Queue(
            self.DEPTH
        )
        self.error: BaseException | None = None
        self.submitted = 0  # written by the capture thread only
        self.done = 0  # written by the store thread only
        self.abandon = False
        self.thread = threading.Thread(target=self._run, name="weir-store-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (item := self.queue.get()) is not None and not self.abandon:
            changes, committed = item
            try:
                self.writer.write(changes)
                self.on_stored(len(changes))
                if committed is not None:
                    self.writer.commit(*committed)
                    self.on_commit(committed[1])
            except BaseException as e:
                self.error = e
                return
            self.done += 1

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def _put(self, item: tuple[list[Change], tuple[int, int] | None] | None) -> None:
        while True:
            self._check()
            try:
                self.queue.put(item, timeout=0.5)
                return
            except queue.Full:
                continue

    def submit(self, changes: list[Change], committed: tuple[int, int] | None) -> None:
        self.submitted += 1
        self._put((changes, committed))

    def idle(self) -> bool:
        """Everything submitted is in the store."""
        self._check()
        return self.done == self.submitted

    def finish(self) -> None:
        """Wait until everything submitted is in the store."""
        self._put(None)
        self.thread.join()
        self._check()

    def abort(self) -> None:
        """Stop after the batch in hand; what is not committed is dropped (sent again later)."""
        self.abandon = True
        while True:
            try:
                self.queue.get_nowait()
            except queue.Empty:
                break
        with contextlib.suppress(queue.Full):
            self.queue.put_nowait(None)
        self.thread.join()


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

    # -- supervision --------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        delay = 0.5
        while not stop.is_set():
            try:
                self.session(stop)
                return
            except FATAL:
                self.state = "failed"
                raise
            except (psycopg.OperationalError, SlotBusyError) as e:
                self.state = "reconnecting"
                first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                log.warning(
                    "source %s: %s; reconnecting in %.1fs",
                    self.src.name,
                    first_line,
                    delay,
                    exc_info=log.isEnabledFor(logging.DEBUG),
                )
                stop.wait(delay * random.uniform(0.8, 1.2))
                delay = min(delay * 2, 30.0)

    # -- one replication session --------------------------------------------------------------

    def session(self, stop: threading.Event) -> None:
        src = self.src
        url = src.url.get_secret_value()
        with (
            psycopg.connect(url, autocommit=True, application_name="weir-catalog") as catalog,
            self.store.connect() as store_conn,
        ):
            writer = SourceWriter(store_conn, self.store, src.sync_id)
            writer.lock(src.name)  # first: one capture per source, whatever the slot says
            prepare(catalog, src)
            commit_lsn, end_lsn = writer.checkpoint()
            relations = Relations(catalog, src.key_columns)
            # Not a `with` block: psycopg would try to COMMIT on a connection in COPY mode.
            repl = psycopg.connect(
                url,
                autocommit=True,
                replication="database",
                options=SESSION_OPTIONS,
                application_name=f"weir:{src.name}",
            )
            try:
                self._start(repl, end_lsn)
                log.info(
                    "source %s: streaming from slot %s at %s",
                    src.name,
                    src.slot,
                    lsn_to_str(max(end_lsn, self.flushed_lsn)),
                )
                self.state = "streaming"
                self._stream(repl, catalog, writer, relations, commit_lsn, stop)
            finally:
                writer.rollback()
                repl.close()

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
            raise psycopg.OperationalError(f"START_REPLICATION failed: {message}")

    def _stream(
        self,
        repl: psycopg.Connection[Any],
        catalog: psycopg.Connection[Any],
        writer: SourceWriter,
        relations: Relations,
        checkpoint_lsn: int,
        stop: threading.Event,
    ) -> None:
        src = self.src
        pgconn = repl.pgconn
        sel = selectors.DefaultSelector()
        sel.register(pgconn.socket, selectors.EVENT_READ)
        max_batch, max_wait = src.max_batch, src.max_batch_wait.total_seconds()
        status_every = src.status_interval.total_seconds()
        heartbeat_every = src.heartbeat_interval.total_seconds()
        by_id = relations.by_id

        pending: list[Change] = []  # changes not yet written to the store
        complete = 0  # pending[:complete] belong to transactions whose Commit has arrived
        committed: tuple[int, int] | None = None  # (commit_lsn, end_lsn) of the last of those
        in_txn = False  # inside Begin..Commit
        skip = False  # this transaction is already in the store
        txn_lsn = 0
        txn_ts = ""
        idx = 0
        batch_started = 0.0
        last_status = last_data = time.monotonic()

        uncommitted = 0

        def stored(n: int) -> None:
            nonlocal uncommitted
            self.stored_changes += n
            uncommitted += n

        def confirmed(end_lsn: int) -> None:
            nonlocal uncommitted
            self.flushed_lsn = max(self.flushed_lsn, end_lsn)
            self.changes.inc(uncommitted)
            uncommitted = 0

        store = _StoreThread(writer, stored, confirmed)

        def flush() -> None:
            """Commit the complete transactions with their checkpoint (on the store thread);
            the flush LSN moves once they are committed, and goes out with the next status.
            """
            nonlocal committed, complete
            assert committed is not None
            store.submit(pending[:complete], committed)
            del pending[:complete]
            committed, complete = None, 0
            self._send_status(pgconn)

        try:
            while not stop.is_set():
                nbytes, data = pgconn.get_copy_data(1)
                if nbytes > 0:
                    if data[0] == 107:  # 'k' keepalive
                        _, wal_end, reply = decode_copy_data(bytes(data))
                        if not in_txn and committed is None and store.idle():
                            # Everything sent before this point is stored: let the slot move on.
                            self.flushed_lsn = max(self.flushed_lsn, wal_end)
                        if reply:
                            self._send_status(pgconn)
                            last_status = time.monotonic()
                        continue
                    m = decode(bytes(data[XLOG_HEADER:]))  # XLogData
                    tag = m[0]
                    if tag in ("I", "U", "D"):
                        if not skip:
                            pending.append(change_of(m, by_id[m[1]], txn_lsn, idx, txn_ts))
                            idx += 1
                            if len(pending) >= max_batch:
                                # A long transaction: commit the finished ones, then write this
                                # one in chunks into the open store transaction.
                                if committed is not None:
                                    flush()
                                store.submit(pending[:], None)
                                pending.clear()
                    elif tag == "B":
                        in_txn = True
                        txn_lsn, txn_ts, idx = m[1], _iso(m[2]), 0
                        skip = txn_lsn <= checkpoint_lsn
                        if committed is None:
                            batch_started = time.monotonic()
                    elif tag == "C":
                        in_txn = False
                        last_data = time.monotonic()
                        if not skip:
                            committed, complete = (m[2], m[3]), len(pending)
                            if complete >= max_batch or last_data - batch_started >= max_wait:
                                flush()
                    elif tag == "T":
                        if not skip:
                            for relid in m[2]:
                                rel = by_id[relid]
                                pending.append(
                                    Change(
                                        "truncate",
                                        rel.collection_id,
                                        None,
                                        None,
                                        None,
                                        False,
                                        None,
                                        txn_lsn,
                                        idx,
                                        txn_ts,
                                    )
                                )
                                idx += 1
                    elif tag == "R":
                        relations.add(m)
                    elif (
                        tag == "M" and not m[1] and not in_txn and committed is None
                        and store.idle()
                    ):  # fmt: skip
                        # A non-transactional message (our heartbeat): nothing is pending here.
                        self.flushed_lsn = max(self.flushed_lsn, m[2])
                    continue  # 'Y' types and 'O' origins need nothing
                if nbytes == 0:
                    # Nothing more to read right now: commit what is complete (latency) and
                    # wait. While the store thread is busy a batch gains nothing by going
                    # early: it grows instead (to max_batch_wait), so a backlog is written in
                    # large batches rather than one per gap in the stream.
                    now = time.monotonic()
                    if committed is not None and (store.idle() or now - batch_started >= max_wait):
                        flush()
                    if now - last_status >= status_every or self.flushed_lsn > self.sent_lsn:
                        self._send_status(pgconn)  # periodic, or a commit is to confirm
                        last_status = now
                    if now - last_data >= heartbeat_every and not in_txn:
                        catalog.execute(
                            "SELECT pg_logical_emit_message(false, 'weir_heartbeat', now()::text)"
                        )
                        last_data = now
                    sel.select(BUSY_WAIT if committed else min(status_every, heartbeat_every, 1.0))
                    pgconn.consume_input()
                    continue
                result = pgconn.get_result()
                message = result.error_message.decode(errors="replace") if result else ""
                raise psycopg.OperationalError(f"replication stream ended: {message.strip()}")

            # Stop: keep what is complete, drop the partial transaction (it will be sent again).
            if committed is not None:
                flush()
            store.finish()
            self._send_status(pgconn)
            self.state = "stopped"
        except BaseException:
            store.abort()
            raise

    def _send_status(self, pgconn: Any) -> None:
        lsn = self.sent_lsn = self.flushed_lsn
        pgconn.put_copy_data(standby_status(lsn, lsn, _now_us()))
        pgconn.flush()
