"""Which tables of a source capture takes: those the config names and those of the schemas it
follows (their names as a UTF-8 client reads them), and why one cannot be captured (the rule the
follow trigger keeps too).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psycopg

from core.redact import Said, said
from core.sources.pg.errors import SourceSetupError
from core.sources.pg.follow import identity_sql
from core.store.migrations import STORE_MARK, STORE_TABLES
from core.tables import parse_table

if TYPE_CHECKING:  # for annotations only: a seed task does not import the config models
    from core.config.sources import PostgresSource

log = logging.getLogger("weir.source")


# What decides whether a table can be captured (table_problem; the follow trigger keeps the same
# rule). A deferrable primary key is no replica identity: Postgres refuses the updates and
# deletes of a published table keyed only so, unless its identity is FULL.
TABLE_INFO_SQL = f"""
SELECT c.oid::bigint, c.relreplident, c.relkind, c.relpersistence,
       obj_description(c.oid, 'pg_class') = '{STORE_MARK}',
       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary),
       EXISTS (SELECT 1 FROM pg_index i
               WHERE i.indrelid = c.oid AND i.indisprimary AND i.indimmediate),
       EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisreplident),
       (SELECT l.oid::regclass::text FROM pg_partition_tree(c.oid) pt
        JOIN pg_class l ON l.oid = pt.relid
        WHERE pt.isleaf AND l.oid <> c.oid AND NOT {identity_sql("l")} ORDER BY 1 LIMIT 1)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relname = %s
"""

# The tables of a schema Weir follows: ordinary and partitioned ones; a partition's rows are
# published under its root (publish_via_partition_root), so partitions are not listed. Unlogged
# and temporary tables write no WAL, so there is nothing of theirs to capture. The store's own
# tables (a store kept in a followed schema) are never the source's.
SCHEMA_TABLES_SQL = f"""
SELECT {{}}
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND c.relpersistence = 'p'
  AND obj_description(c.oid, 'pg_class') IS DISTINCT FROM '{STORE_MARK}'
ORDER BY c.relname
"""
# A name no UTF-8 client can read: a SQL_ASCII database's bytes that are not UTF-8, or a
# character the database's encoding has and Postgres converts to no UTF-8.
UNREADABLE_NAME = (psycopg.errors.CharacterNotInRepertoire, psycopg.errors.UntranslatableCharacter)


# Every table of the database (not the system's), for the closest name to a misspelt one.
ALL_TABLES_SQL = """
SELECT {} FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema')
"""


def readable_tables(
    conn: psycopg.Connection[Any], query: str, params: tuple[Any, ...] = ()
) -> tuple[list[tuple[str, str]], list[tuple[int, Exception]]]:
    """The (schema, table) names of the tables ``query`` lists (formatted with the columns it
    reads), and the oid and error of each whose name no UTF-8 client can read: one legacy name
    must not hide the others (it stopped capture of the whole database)."""
    try:
        with conn.transaction():
            return conn.execute(query.format("n.nspname, c.relname"), params).fetchall(), []
    except UNREADABLE_NAME:
        pass
    names: list[tuple[str, str]] = []
    unreadable: list[tuple[int, Exception]] = []
    for (oid,) in conn.execute(query.format("c.oid"), params).fetchall():
        try:
            with conn.transaction():
                row = conn.execute("SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace"
                                   " n ON n.oid = c.relnamespace WHERE c.oid = %s",
                                   (oid,)).fetchone()  # fmt: skip
        except UNREADABLE_NAME as e:
            unreadable.append((oid, e))
            continue
        if row is not None:
            names.append((row[0], row[1]))
    return names, unreadable


def _schema_tables(conn: psycopg.Connection[Any], src: PostgresSource,
                   schema: str) -> list[tuple[str, str]]:  # fmt: skip
    """The capturable tables of ``schema``, but those whose name no UTF-8 client can read:
    each is left out, saying so."""
    names, unreadable = readable_tables(conn, SCHEMA_TABLES_SQL, (schema,))
    for oid, e in unreadable:
        log.warning("%s", said("source %r: a table of schema %s (oid %d) is left out: its name "
                               "has a character no UTF-8 client can read (%s); rename it to "
                               "capture it", src.name, schema, oid, e))  # fmt: skip
    return names


def tables_of(conn: psycopg.Connection[Any], src: PostgresSource) -> list[tuple[str, str]]:
    tables = [parse_table(t) for t in src.tables]
    for schema in src.schemas:
        rows = _schema_tables(conn, src, schema)
        if (
            not rows
            and not conn.execute(
                "SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)
            ).fetchone()
        ):
            raise SourceSetupError(
                said("source %r: schema %r does not exist (check 'schemas:')", src.name, schema)
            )
        tables += [(r[0], r[1]) for r in rows if (r[0], r[1]) not in tables]
    return tables


def table_problem(src: PostgresSource, name: str, row: tuple[Any, ...] | None) -> str | None:
    """Why ``name`` (``TABLE_INFO_SQL``'s row) cannot be captured, or None when it can.

    The rule the schema-following trigger (``FOLLOW_SQL``) keeps too: updates and deletes of
    the table must be publishable, and its rows need a key.
    """
    if row is None:
        return said("table %s does not exist (check 'tables:' in the config)", name)
    _, replident, relkind, persistence, store, has_pk, immediate_pk, identity_index, leaf = row
    if relkind not in ("r", "p"):
        return said("%s is not a table", name)
    if store:
        return said("%s is one of Weir's store tables: Weir never captures its own writes", name)
    if persistence != "p":
        return said("table %s is UNLOGGED (or temporary): its changes are not in the WAL", name)
    if replident == "n" or (replident == "i" and not identity_index):
        return said(
            "table %s has REPLICA IDENTITY NOTHING (or its identity index is "
            "gone), so its updates and deletes cannot be captured: ALTER "
            "TABLE %s REPLICA IDENTITY DEFAULT",
            name,
            name,
        )
    if replident == "d" and not immediate_pk:
        deferrable = Said(" (only a DEFERRABLE one)" if has_pk else "")
        return said(
            "table %s has no primary key%s, so Postgres refuses its updates "
            "and deletes once it is published: add one, or ALTER TABLE %s "
            "REPLICA IDENTITY FULL and set key_columns: {%s: [...]} in the "
            "source's config",
            name,
            deferrable,
            name,
            name,
        )
    if replident == "f" and not has_pk and name not in src.key_columns:
        return said("table %s has no primary key: set key_columns: {%s: [...]}", name, name)
    if leaf is not None:
        return said(
            "partition %s of table %s has no replica identity (REPLICA "
            "IDENTITY NOTHING, a dropped identity index, or a deferrable "
            "key), so Postgres refuses its updates and deletes once %s is "
            "published: ALTER TABLE %s REPLICA IDENTITY DEFAULT (or FULL)",
            leaf,
            name,
            name,
            leaf,
        )
    return None


def tables_wanted(src: PostgresSource, store_schema: str | None) -> Callable[[str, str], bool]:
    """Whether capture takes a table's changes: one the config names, or of a schema it
    follows, and never one of the store's own tables (in ``store_schema``, when the store lives
    in the source's database: capturing its writes would write them again, for ever). A
    publication may hold more (made by a DBA, for all tables): those are left out."""
    listed = {parse_table(t) for t in src.tables}
    schemas = set(src.schemas)

    def wanted(schema: str, table: str) -> bool:
        if schema == store_schema and table in STORE_TABLES:
            return False
        return schema in schemas or (schema, table) in listed

    return wanted
