"""Table backfills in the engine: keyset pages of a table into the records stream, beside live
capture (the README's opening; docs/operations.md “Backfill and seed”).

Each page is read by COPY in keyset order, staged, and merged with the snapshot version guard
(core.sources.pg.snapshot), and the keyset position of its last row is committed in the same store
transaction: a backfill killed at any point resumes after the last page it committed, and a
page written twice changes nothing (same version: not newer).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg import sql

from core.config.sources import BackfillConfig, PostgresSource
from core.progress import Progress
from core.redact import first_line, said
from core.sources.pg import snapshot
from core.sources.pg.copy_out import copy_rows
from core.sources.pg.errors import SourceSetupError
from core.sources.pg.grants import cannot_read, say_unreadable
from core.sources.pg.relations import SourceSchemaError
from core.sources.pg.setup import capturable_tables, published_tables
from core.store import Conn, Store
from core.store.backfills import Backfills
from core.store.change import REFUSED
from core.store.snapshot_writer import SnapshotWriter
from core.tables import parse_table, table_name

log = logging.getLogger("weir.backfill")


@dataclass
class BackfillResult:
    table: str
    rows_read: int
    rows_written: int  # the others equal their record, or a newer live change replaced them
    finished: bool


class Backfill:
    """The backfill of one table of a source; ``run`` starts it or resumes it."""

    def __init__(
        self,
        src: PostgresSource,
        store: Store,
        table: str,
        *,
        page_size: int | None = None,
        sort_column: str | None = None,
    ) -> None:
        """``page_size`` and ``sort_column`` default to the source's ``backfill:`` settings."""
        settings = src.backfill or BackfillConfig()
        self.src = src
        self.store = store
        self.table = table_name(*parse_table(table))  # as sort_columns are written
        self.page_size = page_size or settings.page_size
        self.sort_column = sort_column or settings.sort_columns.get(self.table)
        self._backfills = Backfills(store, src.sync_id)

    def run(
        self, stop: threading.Event, *, new: str = "if-none", since: datetime | None = None
    ) -> BackfillResult:
        """Resume the table's unfinished backfill, or start a new one: ``new`` is ``if-none``
        (``backfill:`` in ``weir run``: each table once), ``if-finished`` (``weir backfill``)
        or ``always`` (``weir backfill --restart``); and when the backfill there is older than
        ``since`` (a request). Returns when the table is done or ``stop`` is set.

        When it is done, the records of the table that are older than its snapshot and were
        not read (rows deleted while nothing captured them) become tombstones.
        """
        sid = self.src.sync_id
        with (
            snapshot.connect(self.src.url.get_secret_value()) as conn,
            self.store.connect() as store_conn,
        ):
            snapshot.ensure_capture(conn, self.src, self.store)
            plan = snapshot.table_plan(conn, self.src, self.table, self.sort_column)
            rel = plan.rel
            keyset = [rel.names[i] for i in plan.order]
            st = self._backfills.state(store_conn, rel.collection_id)
            if st is not None and not st.finished and new != "always" and st.keyset != keyset:
                raise SourceSetupError(
                    said(
                        "backfill of %s was started paging by %s, now by %s: go back to "
                        "the first, or start again (weir backfill --restart)",
                        self.table,
                        st.keyset,
                        keyset,
                    )
                )
            if (
                st is None
                or new == "always"
                or (st.finished and new == "if-finished")
                or (since is not None and st.started_at < since)
            ):
                point = snapshot.snapshot_point(conn, lambda m: log.info("%s: %s", self.table, m))
                total = snapshot.count_rows(conn, plan)
                self._backfills.start(
                    store_conn, rel.collection_id, keyset, point.version, point.at, total
                )
                store_conn.commit()
                st = self._backfills.state(store_conn, rel.collection_id)
                assert st is not None
            last, read, written = st.last_key, st.rows_read, st.rows_written
            if st.finished:
                return BackfillResult(self.table, read, written, True)
            log.info(
                "backfill %s: %s at version %d, %d of ~%d rows done",
                self.table, "resuming" if last else "starting", st.version, read, st.rows_total,
            )  # fmt: skip
            writer = SnapshotWriter(store_conn, self.store, sid, st.version, st.snapshot_at)
            with Progress("backfill", st.rows_total, name=self.table) as progress:
                progress.update(read)
                while not stop.is_set():
                    query = plan.page_query(last, self.page_size)
                    rows = list(copy_rows(conn, query, plan.copy_options))
                    if not rows:
                        gone = writer.sweep(rel.collection_id)
                        key = [rel.names[i] for i in rel.key]
                        self._backfills.finish(store_conn, rel.collection_id, key, rel.relid,
                                               rel.shape)  # fmt: skip
                        store_conn.commit()
                        swept = f", {gone:,} gone from the table" if gone else ""
                        progress.finish(f"{read:,} rows read, {written:,} written{swept}")
                        return BackfillResult(self.table, read, written, True)
                    lines = list(snapshot.records_of(rel, rows))
                    accepted = self._write(store_conn, writer, rel.collection_id, lines)
                    last = plan.key_of(rows[-1])
                    self._backfills.step(store_conn, rel.collection_id, last, len(rows), accepted)
                    store_conn.commit()
                    read += len(rows)
                    written += accepted
                    progress.update(read)
            return BackfillResult(self.table, read, written, False)

    def _write(
        self, conn: Conn, writer: SnapshotWriter, collection: str, lines: list[tuple[str, bytes]]
    ) -> int:
        """Write a page; when the store refuses it (a value or size it cannot hold), a row at a
        time, and those it refuses go to the source's failed list. Returns how many were
        accepted."""
        try:
            with conn.transaction():  # a savepoint
                return writer.write(collection, lines)[1]
        except psycopg.Error as e:
            if (e.sqlstate or "")[:2] not in REFUSED:
                raise
            if len(lines) > 1:
                return sum(self._write(conn, writer, collection, [line]) for line in lines)
            record_id = lines[0][0]
            writer.refuse(collection, record_id, f"the store refused the row of {collection} "
                          f"record {record_id} read by a backfill: {first_line(e)}")  # fmt: skip
            return 0


def configured_tables(src: PostgresSource) -> list[str]:
    """The tables the source's ``backfill:`` option names (all of the source's by default),
    which its role must be able to read: else SourceSetupError names those it may not, with
    the GRANT, before any is read."""
    with snapshot.connect(src.url.get_secret_value()) as conn:
        if src.backfill is not None and src.backfill.tables:
            tables = [parse_table(t) for t in src.backfill.tables]
        else:
            tables = capturable_tables(conn, src, say=False)
        if why := cannot_read(conn, src, tables):
            raise SourceSetupError(why)
    return [table_name(s, t) for s, t in tables]


def run_configured(src: PostgresSource, store: Store, stop: threading.Event) -> None:
    """``backfill:`` in ``weir run``: every named table not backfilled yet, or not finished."""
    assert src.backfill is not None
    for table in configured_tables(src):
        if stop.is_set():
            return
        Backfill(src, store, table).run(stop)


def run_requested(src: PostgresSource, store: Store, stop: threading.Event) -> None:
    """The backfills capture asked for (sources/pg/capture.py): each table's request is done when
    a backfill started after it finishes. A table that is gone ends its request with an error
    in the log; one the role may not read waits for the GRANT (said once: sources/pg/grants.py)."""
    backfills = Backfills(store, src.sync_id)
    with store.connect(autocommit=True) as conn:
        rows = backfills.requests(conn)
        published, unreadable = _waiting(src, [(s, t) for s, t, _ in rows]) if rows else (None, [])
        for schema, table, requested_at in rows:
            if stop.is_set():
                return
            if published is not None and (schema, table) not in published:
                continue  # one a DBA is to add to the publication (core/sources/pg/setup.py)
            if (schema, table) in unreadable:
                continue  # the GRANT is named: the request is done once the role may read it
            name = table_name(schema, table)
            try:
                finished = Backfill(src, store, name).run(stop, since=requested_at).finished
            except (SourceSetupError, SourceSchemaError, psycopg.Error) as e:
                if isinstance(e, psycopg.Error) and _lost(e):
                    raise  # resumed at its last page after a pause (core/runtime/service.py)
                if _exists(src, schema, table):
                    log.error("backfill of %s asked for by capture: %s; not retried (run weir "
                              "backfill --table %s once that is fixed)", name, str(e).strip(),
                              name)  # fmt: skip
                else:  # dropped, renamed or moved on since: capture follows it under its name
                    log.info("backfill of %s asked for by capture: the table is no longer there "
                             "(dropped, renamed or moved), nothing to do", name)  # fmt: skip
                finished = True
            if finished:
                backfills.request_done(conn, schema, table, requested_at)


def _lost(e: psycopg.Error) -> bool:
    """Whether the error is a connection lost (or a server going down), not the work's own."""
    return isinstance(e, psycopg.OperationalError) and (e.sqlstate or "08")[:2] in ("08", "57")


def _waiting(
    src: PostgresSource, tables: list[tuple[str, str]]
) -> tuple[set[tuple[str, str]] | None, list[tuple[str, str]]]:
    """What the requested ``tables`` wait for: the tables the publication publishes (None when
    it is Weir's: it holds them all), and those the role may not read, named once."""
    with snapshot.connect(src.url.get_secret_value()) as conn:
        published = None if src.create_publication else published_tables(conn, src.publication)
        return published, say_unreadable(conn, src, tables)


def _exists(src: PostgresSource, schema: str, table: str) -> bool:
    with snapshot.connect(src.url.get_secret_value()) as conn:
        name = sql.Identifier(schema, table).as_string(conn)
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (name,)).fetchone()
    return bool(row and row[0])
