"""Reading a source table as records-stream rows: the Spark seed job and backfills.

A row read from a table must never overwrite a newer live change
(docs/operations.md “Backfill and seed”). Every row read here is written with the version ``(L,
-1)``, where L is a WAL position taken by :func:`snapshot_point` before any row is read, after every
transaction that could commit below L has ended. So:

- a change committed below L is visible to every later read, and the row read carries it;
- a change the read may have missed commits at L or above, and capture stores it with version
  ``(commit LSN, index ≥ 0)``, above ``(L, -1)``: it wins in the records stream whether it is
  written before or after the row.

The reads need no shared snapshot, so Spark partitions, JDBC readers and the pages of a
backfill resumed days later all keep this rule. The replication slot must exist before L is
taken (``ensure_capture``), or changes made during the read would be captured by no one.
The values go through the same converters as capture (core.sources.pg.values), from the same text.
Rows are read by COPY (core/sources/pg/copy_out.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from core.envelope import dumps
from core.redact import said
from core.sources.pg import encoding
from core.sources.pg.copy_out import copy_lines, copy_rows, unescape
from core.sources.pg.errors import SlotBusyError, SourceSetupError
from core.sources.pg.grants import cannot_read
from core.sources.pg.relations import (
    Relation,
    Relations,
    SourceSchemaError,
    record_id_for,
    row_values,
)
from core.sources.pg.setup import ensure_slot, prepare
from core.sources.pg.slot import slot_lock
from core.sources.pg.values import INT2, INT4, INT8, OID, SESSION_OPTIONS, UUID
from core.tables import parse_table, table_name

if TYPE_CHECKING:  # for annotations only: a seed task does not import the config models
    from core.config.sources import PostgresSource
    from core.store import Store


@dataclass(frozen=True)
class SnapshotPoint:
    version: int  # L, the WAL insert position
    at: datetime  # when L was taken: the rows' upstream_updated_at


def connect(url: str, name: str = "weir-snapshot") -> psycopg.Connection[Any]:
    """An autocommit connection to a source database with capture's session settings, in
    UTF-8 whatever the database's encoding (core/sources/pg/encoding.py)."""
    return encoding.connect(url, autocommit=True, options=SESSION_OPTIONS, application_name=name)


def ensure_capture(
    conn: psycopg.Connection[Any], src: PostgresSource, store: Store, say: bool = False
) -> None:
    """Check the source's tables and create its publication and slot when missing, so that
    every change from now on is captured (by ``weir run``, now or later); a slot made here is
    noted in the store as its own (core/sources/pg/slot.py ``check_slot``). ``say``: report
    the tables left out (capture's start does, so a backfill does not say it again)."""
    prepare(conn, src, say)
    with contextlib.suppress(SlotBusyError), slot_lock(conn, src):  # busy: capture reads it
        if ensure_slot(conn, src):
            store.slot_made(src.sync_id, src.slot)


def snapshot_point(conn: psycopg.Connection[Any], say: Callable[[str], None]) -> SnapshotPoint:
    """Take L and wait until no transaction that might commit below L is still running.

    ``conn`` is autocommit, so the snapshot below is taken after L was read: any transaction
    whose commit record lies below L is either visible in it or listed as running in it.
    """
    row = conn.execute(
        "SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint, clock_timestamp()"
    ).fetchone()
    assert row is not None
    running = [
        r[0]
        for r in conn.execute(
            "SELECT x::text FROM pg_snapshot_xip(pg_current_snapshot()) x"
        ).fetchall()
    ]
    started = said = time.monotonic()
    while running:
        time.sleep(0.1)
        running = [
            r[0]
            for r in conn.execute(
                "SELECT x::text FROM unnest(%s::xid8[]) x WHERE pg_xact_status(x) = 'in progress'",
                (running,),
            ).fetchall()
        ]
        if running and time.monotonic() - said >= 30:
            say(f"waiting for {len(running)} transactions that were running to end "
                f"({time.monotonic() - started:.0f}s so far)")  # fmt: skip
            said = time.monotonic()
    return SnapshotPoint(int(row[0]), row[1])


COLUMNS_SQL = """
SELECT c.oid::bigint, c.relreplident::text, a.attname, a.atttypid::bigint,
       format_type(a.atttypid, a.atttypmod), a.attnotnull,
       CASE c.relreplident
           WHEN 'f' THEN true
           WHEN 'd' THEN a.attnum = ANY (SELECT unnest(i.indkey) FROM pg_index i
                                         WHERE i.indrelid = c.oid AND i.indisprimary)
           WHEN 'i' THEN a.attnum = ANY (SELECT unnest(i.indkey) FROM pg_index i
                                         WHERE i.indrelid = c.oid AND i.indisreplident)
           ELSE false END
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
WHERE n.nspname = %s AND c.relname = %s AND a.attgenerated = ''
ORDER BY a.attnum
"""


@dataclass(frozen=True)
class TablePlan:
    """How to read one table: its relation (as capture sees it) and the keyset to page by.

    Picklable (cloudpickle), so the Spark job ships it to its executors.
    """

    rel: Relation
    types: tuple[str, ...]  # SQL type of each column, to cast keyset values back
    order: tuple[int, ...]  # keyset columns: the sort column (if any), then the key columns
    # Per column, the SQL that renders its JSON value (TypeCatalog.json_sql), when the source
    # server can render every value and the record id; else None and Python converts the text.
    rendered: tuple[str, ...] | None

    @property
    def name(self) -> str:
        return table_name(self.rel.schema, self.rel.table)

    def select(self) -> sql.Composed:
        cols = sql.SQL(", ").join(sql.Identifier(n) for n in self.rel.names)
        return sql.SQL("SELECT {} FROM {}").format(
            cols, sql.Identifier(self.rel.schema, self.rel.table)
        )

    def after(self, op: str, key: list[str]) -> sql.Composed:
        """``(keyset columns) op (key)``: the row of the keyset against one position."""
        cols = [sql.Identifier(self.rel.names[i]) for i in self.order]
        vals = [
            sql.SQL("{}::" + self.types[i]).format(v) for i, v in zip(self.order, key, strict=True)
        ]
        return sql.SQL("({}) {} ({})").format(
            sql.SQL(", ").join(cols), sql.SQL(op), sql.SQL(", ").join(vals)
        )

    def ordered(self) -> sql.Composed:
        return sql.SQL(" ORDER BY {}").format(
            sql.SQL(", ").join(sql.Identifier(self.rel.names[i]) for i in self.order)
        )

    def range_where(self, lo: list[str] | None, hi: list[str] | None) -> sql.Composable:
        """lo < keyset <= hi (an open end where None)."""
        conds = [self.after(op, k) for op, k in ((">", lo), ("<=", hi)) if k is not None]
        return sql.SQL(" AND ").join(conds) if conds else sql.SQL("true")

    def range_query(self, lo: list[str] | None, hi: list[str] | None) -> sql.Composed:
        """The rows with lo < keyset <= hi."""
        return self.select() + sql.SQL(" WHERE {}").format(self.range_where(lo, hi))

    def records_query(self, lo: list[str] | None, hi: list[str] | None) -> sql.Composed | None:
        """The rows with lo < keyset <= hi as (record id, record JSON) rendered by the source
        server, as capture's converters and ``record_id_of`` make them; None if it cannot."""
        if self.rendered is None:
            return None
        names = [sql.Identifier(n) for n in self.rel.names]
        # The columns in the table's order, as capture writes a record's fields.
        values = sql.SQL(", ").join(
            sql.SQL("{} AS {}").format(sql.SQL(expr).format(c=name), name)
            for expr, name in zip(self.rendered, names, strict=True)
        )
        keys = [sql.SQL("weir_row.{}::text").format(names[i]) for i in self.rel.key]
        record_id = (
            keys[0]
            if len(keys) == 1
            else sql.SQL("concat_ws(',', {})").format(sql.SQL(", ").join(keys))
        )
        return sql.SQL(
            "SELECT {}, row_to_json(weir_row.*) FROM (SELECT {} FROM {} WHERE {}) weir_row"
        ).format(
            record_id,
            values,
            sql.Identifier(self.rel.schema, self.rel.table),
            self.range_where(lo, hi),
        )

    def page_query(self, last: list[str] | None, limit: int) -> sql.Composed:
        """The next ``limit`` rows after ``last`` in keyset order."""
        return self.range_query(last, None) + self.ordered() + sql.SQL(f" LIMIT {int(limit)}")

    def key_of(self, row: list[bytes | None]) -> list[str]:
        """The keyset position of a row read by COPY (its columns' text, which the next page's
        query sends back: so it must be text a UTF-8 client can read)."""
        key = [self.rel.text.read(row[i]) for i in self.order]  # type: ignore[arg-type]
        if None in key:
            raise SourceSchemaError(
                said(
                    "table %s: cannot page by a key that holds text no UTF-8 client "
                    "can read (docs/design.md “Values”), after %s",
                    self.name,
                    key,
                )
            )
        return key  # type: ignore[return-value]

    @property
    def copy_options(self) -> str:
        """The options of the COPY that reads its rows: unconverted, for ``rel.text``."""
        return encoding.copy_options(self.rel.text)


def table_plan(
    conn: psycopg.Connection[Any], src: PostgresSource, name: str, sort_column: str | None = None
) -> TablePlan:
    """The plan of ``schema.table``, keyed as capture keys it (primary key or key_columns)."""
    schema, table = parse_table(name)
    name = table_name(schema, table)  # as key_columns are written
    rows = conn.execute(COLUMNS_SQL, (schema, table)).fetchall()
    if not rows:
        raise SourceSetupError(said("source %r: table %s does not exist", src.name, name))
    relid, replident = rows[0][0], rows[0][1]
    if why := cannot_read(conn, src, [(schema, table)]):
        raise SourceSetupError(why)
    cols = [(1 if r[6] else 0, r[2], r[3], -1) for r in rows]
    relations = Relations(conn, {name: src.key_columns[name]} if name in src.key_columns else {})
    rel = relations.add(("R", relid, schema, table, replident, cols), sent=False)
    if rel.problem is not None:
        raise SourceSchemaError(rel.problem)
    order = list(rel.key)
    if sort_column is not None:
        names = [r[2] for r in rows]
        if sort_column not in names:
            raise SourceSetupError(
                said("table %s: sort column %r does not exist", name, sort_column)
            )
        i = names.index(sort_column)
        if not rows[i][5]:
            raise SourceSetupError(
                said(
                    "table %s: sort column %r must be NOT NULL (keyset pagination "
                    "skips null values)",
                    name,
                    sort_column,
                )
            )
        order = [i, *(k for k in order if k != i)]
    exprs = [e for e in (relations.types.json_sql(r[3]) for r in rows) if e is not None]
    # A record id the server can print: NOT NULL key columns whose text is their subject token
    # (integers, uuids: digits, hex and "-"), joined by "," as record_id_of joins them.
    id_types = {INT2, INT4, INT8, OID, UUID}
    keyed = all(rows[i][5] and relations.types.resolve(rows[i][3]) in id_types for i in rel.key)
    # The server renders records only from a UTF-8 database: from others the rows come
    # unconverted, for the text rule of core/sources/pg/encoding.py (a SQL_ASCII one may hold
    # any bytes).
    utf8 = relations.text.encoding == "UTF8"
    return TablePlan(
        rel,
        tuple(r[4] for r in rows),
        tuple(order),
        tuple(exprs) if keyed and utf8 and len(exprs) == len(rows) else None,
    )


def count_rows(conn: psycopg.Connection[Any], plan: TablePlan) -> int:
    row = conn.execute(
        sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(plan.rel.schema, plan.rel.table))
    ).fetchone()
    return int(row[0]) if row else 0


def key_ranges(
    conn: psycopg.Connection[Any], plan: TablePlan, total: int, parts: int
) -> list[tuple[list[str] | None, list[str] | None]]:
    """``parts`` keyset ranges of about equal row counts covering the table of ``total`` rows
    (``count_rows``); the last range is open, so rows added since are in it."""
    step = max(1, -(-total // max(1, parts)))
    cols = sql.SQL(", ").join(sql.Identifier(plan.rel.names[i]) for i in plan.order)
    texts = sql.SQL(", ").join(
        sql.SQL("{}::text").format(sql.Identifier(plan.rel.names[i])) for i in plan.order
    )
    query = sql.SQL(
        "SELECT {texts} FROM (SELECT {cols}, row_number() OVER (ORDER BY {cols}) AS n FROM {t}) s"
        " WHERE n % {step} = 0 AND n < {total} ORDER BY n"
    ).format(
        texts=texts,
        cols=cols,
        t=sql.Identifier(plan.rel.schema, plan.rel.table),
        step=sql.Literal(step),
        total=sql.Literal(total),
    )
    bounds: list[list[str] | None] = [list(r) for r in conn.execute(query).fetchall()]
    edges = [None, *bounds, None]
    return [(edges[i], edges[i + 1]) for i in range(len(edges) - 1)]


def records_of(
    rel: Relation, rows: Iterable[Sequence[bytes | None]]
) -> Iterator[tuple[str, bytes]]:
    """Each row's (record id, record JSON) (what ``SnapshotWriter.write`` takes), with the
    values an insert of the row would carry."""
    for values in rows:
        rec, _ = row_values(rel, values)
        yield record_id_for(rel, rec), dumps(rec)


def read_records(
    conn: psycopg.Connection[Any], plan: TablePlan, lo: list[str] | None, hi: list[str] | None
) -> Iterator[tuple[str, bytes]]:
    """The rows with lo < keyset <= hi as ``records_of`` pairs: rendered by the source server
    when the plan allows it, else converted here from their text. Rendered records are taken
    as the server wrote them: a one-process load of 1M rows spent ~1.2 us of Python CPU a row
    instead of ~10, and ~2 us more in the source server."""
    query = plan.records_query(lo, hi)
    if query is not None:
        return (_pair(line) for line in copy_lines(conn, query))
    return records_of(plan.rel, copy_rows(conn, plan.range_query(lo, hi), plan.copy_options))


def _pair(line: bytes) -> tuple[str, bytes]:
    """A rendered ``record id <tab> record JSON`` line (its id's characters are subject-token
    ones, which COPY never escapes)."""
    record_id, _, record = line[:-1].partition(b"\t")
    if b"\\" in record:
        record = unescape(record)
    return record_id.decode(), record
