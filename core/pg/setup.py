"""Checks a source database before capture, and creates its publication and slot when missing.

Every problem a user can fix is a :class:`SourceSetupError` with one line saying what to do.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from core.tables import parse_table, table_name

if TYPE_CHECKING:  # for annotations only: a seed task does not import the config models
    from core.config import PostgresSource


log = logging.getLogger("weir.source")


class SourceSetupError(RuntimeError):
    """The source database is not ready for capture; retrying will not help."""


class SlotBusyError(RuntimeError):
    """The replication slot is used by another connection; this may pass (e.g. a restart)."""


TABLE_INFO_SQL = """
SELECT c.oid::bigint, c.relreplident, c.relkind,
       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s
"""


def tables_of(conn: psycopg.Connection[Any], src: PostgresSource) -> list[tuple[str, str]]:
    tables = [parse_table(t) for t in src.tables]
    for schema in src.schemas:
        rows = conn.execute(
            "SELECT schemaname, tablename FROM pg_tables WHERE schemaname = %s ORDER BY 2",
            (schema,),
        ).fetchall()
        if (
            not rows
            and not conn.execute(
                "SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)
            ).fetchone()
        ):
            raise SourceSetupError(
                f"source {src.name!r}: schema {schema!r} does not exist (check 'schemas:')"
            )
        tables += [(r[0], r[1]) for r in rows if (r[0], r[1]) not in tables]
    return tables


def check_table(
    conn: psycopg.Connection[Any], src: PostgresSource, schema: str, table: str
) -> None:
    row = conn.execute(TABLE_INFO_SQL, (schema, table)).fetchone()
    name = table_name(schema, table)
    if row is None:
        raise SourceSetupError(
            f"source {src.name!r}: table {name} does not exist (check 'tables:' in the config)"
        )
    _, replident, relkind, has_pk = row
    if relkind not in ("r", "p"):
        raise SourceSetupError(f"source {src.name!r}: {name} is not a table")
    if replident == "n":
        raise SourceSetupError(
            f"source {src.name!r}: table {name} has REPLICA IDENTITY NOTHING, so its updates "
            f"and deletes cannot be captured: ALTER TABLE {name} REPLICA IDENTITY DEFAULT"
        )
    if not has_pk and name not in src.key_columns and replident != "i":
        raise SourceSetupError(
            f"source {src.name!r}: table {name} has no primary key: add one, or set "
            f"REPLICA IDENTITY FULL and key_columns: {{{name}: [...]}} in the source's config"
        )


def prepare(conn: psycopg.Connection[Any], src: PostgresSource) -> None:
    """Check the server and the tables, then create the publication and slot if missing.

    ``conn`` is an ordinary autocommit connection to the source database.
    """
    wal_level = conn.execute("SHOW wal_level").fetchone()
    if not wal_level or wal_level[0] != "logical":
        level = wal_level[0] if wal_level else "?"
        raise SourceSetupError(
            f"source {src.name!r}: wal_level is {level!r} but capture needs 'logical': run "
            "ALTER SYSTEM SET wal_level = logical; and restart PostgreSQL"
        )
    tables = tables_of(conn, src)
    for schema, table in tables:
        check_table(conn, src, schema, table)
    _ensure_publication(conn, src, tables)
    _ensure_slot(conn, src)


def _ensure_publication(
    conn: psycopg.Connection[Any], src: PostgresSource, tables: list[tuple[str, str]]
) -> None:
    pub = sql.Identifier(src.publication)
    exists = conn.execute(
        "SELECT 1 FROM pg_publication WHERE pubname = %s", (src.publication,)
    ).fetchone()
    if not exists and not src.create_publication:
        raise SourceSetupError(
            f"source {src.name!r}: publication {src.publication!r} does not exist and "
            "create_publication is false: CREATE PUBLICATION it, or let Weir create it"
        )
    published = {
        (r[0], r[1])
        for r in conn.execute(
            "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s",
            (src.publication,),
        ).fetchall()
    }
    missing = [t for t in tables if t not in published]
    idents = sql.SQL(", ").join(sql.Identifier(s, t) for s, t in missing)
    if not exists:
        if missing:
            conn.execute(sql.SQL("CREATE PUBLICATION {} FOR TABLE {}").format(pub, idents))
        else:
            conn.execute(sql.SQL("CREATE PUBLICATION {}").format(pub))
        log.info("source %s: created publication %s", src.name, src.publication)
    elif missing and src.create_publication:
        conn.execute(sql.SQL("ALTER PUBLICATION {} ADD TABLE {}").format(pub, idents))
        log.info(
            "source %s: added %s to publication %s",
            src.name,
            ", ".join(table_name(s, t) for s, t in missing),
            src.publication,
        )


def _ensure_slot(conn: psycopg.Connection[Any], src: PostgresSource) -> None:
    row = conn.execute(
        "SELECT plugin, active_pid, database = current_database() FROM pg_replication_slots "
        "WHERE slot_name = %s",
        (src.slot,),
    ).fetchone()
    if row is None:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (src.slot,))
        log.info("source %s: created replication slot %s", src.name, src.slot)
        return
    plugin, active_pid, same_db = row
    if plugin != "pgoutput" or not same_db:
        raise SourceSetupError(
            f"source {src.name!r}: replication slot {src.slot!r} exists but "
            + ("belongs to another database" if not same_db else f"uses plugin {plugin!r}")
            + ": give this source another slot name or drop that slot"
        )
    if active_pid is not None:
        raise SlotBusyError(
            f"source {src.name!r}: replication slot {src.slot!r} is in use by another "
            f"process (pid {active_pid}): stop the other consumer or use another slot name"
        )
