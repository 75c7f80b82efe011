"""Change capture from one Postgres source into the stream store.

One replication session: hold the slot against the store's checkpoint (core/sources/pg/slot.py),
START_REPLICATION with pgoutput, decode every message, gather whole transactions, and commit
them with the LSN checkpoint in one store transaction; only then confirm the flush LSN to
Postgres. A transaction at or below the stored checkpoint is skipped, so a change is stored
exactly once even when Postgres sends it again after a crash.

The stream itself is core/sources/pg/stream.py; batches go to the store on a thread of their own
(core/sources/pg/store_thread.py), so decoding the next batch overlaps the store's work on this one.
Batching is natural: a batch is committed when the socket has nothing more to read and the
store thread is idle, or when it reaches ``max_batch`` changes or ``max_batch_wait``. A long
transaction is written in chunks into the one open store transaction, so memory stays bounded.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable
from typing import Any

import psycopg

from core.config.sources import PostgresSource
from core.failures import AWAY, for_good, postgres_unreachable
from core.ids import lsn_to_str
from core.metrics import Metrics
from core.redact import said
from core.sources.pg import snapshot
from core.sources.pg.encoding import REPLICATION_CLIENT_ENCODING, unreadable_name
from core.sources.pg.errors import SlotBusyError, SourceSetupError
from core.sources.pg.pgoutput import start_replication
from core.sources.pg.relations import Relations, SourceSchemaError
from core.sources.pg.setup import capturable_tables, prepare
from core.sources.pg.slot import SlotGapError, check_slot, slot_lock, unreadable
from core.sources.pg.stream import SlotPosition, Stream
from core.sources.pg.tables import UNREADABLE_NAME, tables_wanted
from core.sources.pg.values import SESSION_OPTIONS
from core.store import Store
from core.store.change import UnstorableChange
from core.store.writer import SourceWriter, WriterBusyError

log = logging.getLogger("weir.source")

FATAL = (SourceSetupError, SourceSchemaError, WriterBusyError, UnstorableChange)


class PostgresCapture:
    """Captures one ``postgres`` source until ``stop`` is set.

    ``run`` reconnects with exponential backoff and jitter after the source or the store goes
    away; a problem only the user can fix (see ``FATAL``) is raised instead.
    """

    def __init__(self, src: PostgresSource, store: Store, metrics: Metrics | None = None) -> None:
        self.src = src
        self.store = store
        self.position = SlotPosition((metrics or Metrics()).changes.labels(src.name))
        self.state = "starting"
        self.detail = ""  # why, when reconnecting or failed

    @property
    def stored_changes(self) -> int:
        """Changes written to the store so far (progress, benchmarks)."""
        return self.position.stored_changes

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
            except UNREADABLE_NAME as e:  # only names are converted
                self.state, self.detail = "failed", unreadable_name(self.src.name, e)
                raise SourceSetupError(self.detail) from e
            except (*AWAY, SlotBusyError) as e:
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
                delay = min(delay * 2, 25.0)  # said at least every 30 s

    def _unreadable(self, error: str) -> bool:
        """The slot can never be read past where it is (core/sources/pg/slot.py ``unreadable``)."""
        try:
            with snapshot.connect(self.src.url.get_secret_value(), "weir-catalog") as conn:
                return unreadable(conn, self.src, error)
        except AWAY:
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
            self._connect(lambda: snapshot.connect(url, "weir-catalog")) as catalog,
            self.store.connect() as store_conn,
        ):  # fmt: skip
            writer = SourceWriter(store_conn, self.store, src.sync_id, src.on_unstorable)
            # Step 1: one capture per source, whatever the slot says.
            writer.lock(src.name)
            # Step 2
            waiting = prepare(catalog, src)
            writer.collections.request_backfills(
                waiting, f"until it is in publication {src.publication}", again=False
            )
            # Step 3
            start = self._hold_slot(catalog, writer)
            # Step 4. Text comes as the database holds it, unconverted (one character no UTF-8
            # client can read would end a converting stream at every start), and is read as a
            # UTF-8 client reads it: core/sources/pg/encoding.py.
            store_schema = self.store.schema if _same_database(catalog, store_conn) else None
            wanted = tables_wanted(src, store_schema)
            relations = Relations(catalog, src.key_columns, wanted, src.name)
            # Not a `with` block: psycopg would try to COMMIT on a connection in COPY mode.
            repl = self._connect(lambda: psycopg.connect(
                url, autocommit=True, replication="database", options=SESSION_OPTIONS,
                client_encoding=REPLICATION_CLIENT_ENCODING, application_name=f"weir:{src.name}",
            ))  # fmt: skip
            try:
                self._start(repl, start)
                log.info("source %s: streaming from slot %s at %s", src.name, src.slot,
                         lsn_to_str(start))  # fmt: skip
                self.state, self.detail = "streaming", ""
                Stream(src, self.position, repl, catalog, writer, relations, stop).run()
                self.state = "stopped"
            finally:
                writer.rollback()
                repl.close()

    def _connect(self, connect: Callable[[], psycopg.Connection[Any]]) -> psycopg.Connection[Any]:
        """``connect()``, with a refusal for good (credentials, a database, role or right that
        is missing) as a FATAL error naming the fix: only the user can fix it."""
        try:
            return connect()
        except psycopg.OperationalError as e:
            url = self.src.url.get_secret_value()
            why = for_good(postgres_unreachable(e, url, f"source {self.src.name}"))
            if why is not None:
                raise SourceSetupError(why) from None
            raise

    def _hold_slot(self, catalog: psycopg.Connection[Any], writer: SourceWriter) -> int:
        """Check the slot against the checkpoint; store where capture starts, with a backfill
        of every table when changes were lost with the slot. Returns the start position."""
        src = self.src
        with slot_lock(catalog, src):  # a backfill making the slot notes it first
            cp = writer.checkpoint()
            start = check_slot(catalog, src, cp)
            if start.gap is not None:
                writer.collections.request_backfills(
                    capturable_tables(catalog, src, say=False), start.gap
                )
            if (
                start.gap is not None
                or not cp.tracked
                or start.lsn != cp.end_lsn
                or cp.slot != src.slot
            ):
                writer.advance(start.lsn, src.slot)
        self.position.flushed_lsn = max(self.position.flushed_lsn, start.lsn)
        return start.lsn

    def _start(self, repl: psycopg.Connection[Any], start_lsn: int) -> None:
        pgconn = repl.pgconn
        pgconn.send_query(start_replication(self.src.slot, self.src.publication, start_lsn))
        result = pgconn.get_result()
        if result is None or result.status != psycopg.pq.ExecStatus.COPY_BOTH:
            message = (result.error_message if result else b"").decode(errors="replace").strip()
            if "is active for PID" in message:
                raise SlotBusyError(
                    said(
                        "source %r: replication slot %r is in use by another process "
                        "(%s): stop it or use another slot name",
                        self.src.name,
                        self.src.slot,
                        message,
                    )
                )
            # Anything else (an invalidated slot among them) is looked at by the next
            # session's slot check.
            raise psycopg.OperationalError(said("START_REPLICATION failed: %s", message))


def _same_database(a: psycopg.Connection[Any], b: psycopg.Connection[Any]) -> bool:
    """Whether two connections are to one database of one server."""
    same = "SELECT current_database(), pg_postmaster_start_time(), inet_server_port()"
    return a.execute(same).fetchone() == b.execute(same).fetchone()
