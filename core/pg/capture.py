"""Change capture from one Postgres source into the stream store.

One replication session: START_REPLICATION with pgoutput, decode every message, gather whole
transactions, and commit them with the LSN checkpoint in one store transaction; only then
confirm the flush LSN to Postgres. A transaction at or below the stored checkpoint is skipped,
so a change is stored exactly once even when Postgres sends it again after a crash.

Batching is natural: a batch is committed when the socket has nothing more to read, or when it
reaches ``max_batch`` changes or ``max_batch_wait``. A long transaction is written in chunks into
the one open store transaction, so memory stays bounded.
"""

from __future__ import annotations

import logging
import random
import selectors
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from core.config import PostgresSource
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
from core.store import Store
from core.store.writer import Change, SourceWriter, WriterBusyError

log = logging.getLogger("weir.source")

# Session settings that make the text of every value predictable (see core.pg.values).
SESSION_OPTIONS = (
    "-c TimeZone=UTC -c DateStyle=ISO,YMD -c IntervalStyle=iso_8601 "
    "-c extra_float_digits=3 -c bytea_output=hex"
)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

FATAL = (SourceSetupError, SourceSchemaError, WriterBusyError)


def _iso(us: int) -> str:
    return (_EPOCH + timedelta(microseconds=us)).isoformat()


def _now_us() -> int:
    return time.time_ns() // 1000


class PostgresCapture:
    """Captures one ``postgres`` source until ``stop`` is set.

    ``run`` reconnects with exponential backoff and jitter after the source or the store goes
    away; a problem only the user can fix (see ``FATAL``) is raised instead.
    """

    def __init__(self, src: PostgresSource, store: Store) -> None:
        self.src = src
        self.store = store
        self.flushed_lsn = 0  # confirmed to Postgres
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

        def flush() -> None:
            """Commit the complete transactions with their checkpoint, then confirm them."""
            nonlocal committed, complete
            assert committed is not None
            writer.write(pending[:complete])
            writer.commit(*committed)
            self.stored_changes += complete
            del pending[:complete]
            self.flushed_lsn = max(self.flushed_lsn, committed[1])
            committed, complete = None, 0
            self._send_status(pgconn)

        while not stop.is_set():
            nbytes, data = pgconn.get_copy_data(1)
            if nbytes > 0:
                if data[0] == 107:  # 'k' keepalive
                    _, wal_end, reply = decode_copy_data(bytes(data))
                    if not in_txn and committed is None:
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
                            writer.write(pending)
                            self.stored_changes += len(pending)
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
                elif tag == "M" and not m[1] and not in_txn and committed is None:
                    # A non-transactional message (our heartbeat): nothing is pending here.
                    self.flushed_lsn = max(self.flushed_lsn, m[2])
                continue  # 'Y' types and 'O' origins need nothing
            if nbytes == 0:
                # Nothing more to read right now: commit what is complete (latency) and wait.
                if committed is not None:
                    flush()
                now = time.monotonic()
                if now - last_status >= status_every:
                    self._send_status(pgconn)
                    last_status = now
                if now - last_data >= heartbeat_every and not in_txn:
                    catalog.execute(
                        "SELECT pg_logical_emit_message(false, 'weir_heartbeat', now()::text)"
                    )
                    last_data = now
                sel.select(min(status_every, heartbeat_every, 1.0))
                pgconn.consume_input()
                continue
            result = pgconn.get_result()
            message = result.error_message.decode(errors="replace") if result else ""
            raise psycopg.OperationalError(f"replication stream ended: {message.strip()}")

        # Stop: keep what is complete, drop the partial transaction (it will be sent again).
        if committed is not None:
            flush()
        self._send_status(pgconn)
        self.state = "stopped"

    def _send_status(self, pgconn: Any) -> None:
        lsn = self.flushed_lsn
        pgconn.put_copy_data(standby_status(lsn, lsn, _now_us()))
        pgconn.flush()
