"""The stream store's schema, created and upgraded by numbered migrations on startup.

Migrations run in one transaction under an advisory lock, so several Weir processes starting at
once apply each exactly once. A migration is never edited after it has shipped: add a new one.
The store's SQL functions are the exception: their current bodies live in core/store/functions.py
and are applied after the migrations on every start (migrations that made them are history).
"""

from __future__ import annotations

import logging
import re

import psycopg
from psycopg import sql

from core.redact import Said
from core.store.functions import FUNCTIONS
from core.store.history import MIGRATIONS
from core.store.shared import lock_key
from core.store.upgrade import CONVERSIONS

log = logging.getLogger("weir.store")

# The store's own tables, as the migrations make them: capture never takes their changes, when
# the store lives in a source's database (its writes would be captured and written again).
# Each bears STORE_MARK as its comment, so a source's catalog tells them apart
# (core/sources/pg/tables.py) and the store's DDL runs with the setting STORE_DDL on, which the
# follow trigger ignores.
STORE_TABLES = frozenset(
    [
        "schema_migrations",
        *re.findall(r"CREATE (?:UNLOGGED )?TABLE \{s\}\.(\w+)", "".join(m[2] for m in MIGRATIONS)),
    ]
)
# Every name the migrations give in the store's schema: its tables, their keys and indexes.
STORE_NAMES = (
    STORE_TABLES
    | {f"{t}_pkey" for t in STORE_TABLES}
    | set(re.findall(r"CREATE (?:UNIQUE )?INDEX (\w+)", "".join(m[2] for m in MIGRATIONS)))
)
STORE_MARK = "weir store"
STORE_DDL = "weir.store_ddl"


def foreign_tables(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> list[str]:
    """Tables (or indexes) of ``schema`` named as the store's own but not made by Weir (a Rails
    or Ecto ``schema_migrations`` in ``public``, a user's ``events``, an index ``records_pkey``
    left by a table renamed): the store cannot live there."""
    found: dict[object, object] = dict(
        conn.execute(  # type: ignore[arg-type]
            "SELECT c.relname, EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid"
            " AND a.attname = 'description' AND NOT a.attisdropped)"
            " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = ANY(%s)",
            (schema, sorted(STORE_NAMES)),
        ).fetchall()
    )
    if found.get("schema_migrations"):  # Weir's: it made the others it holds
        return []
    return sorted(str(t) for t in found)


def render(body: str, schema: str) -> sql.Composed:
    """A migration's or function's SQL, with {s} standing for the quoted schema name and
    {consume_lock} for the key of the Consume API's lock as a literal (core/store/shared.py)."""
    return sql.SQL(body.replace("{s}", "{schema}")).format(
        schema=sql.Identifier(schema), consume_lock=sql.Literal(lock_key(schema, "consume"))
    )


def migrate(conn: psycopg.Connection[tuple[object, ...]], schema: str) -> int:
    """Bring ``schema`` up to the newest migration. Returns the schema version.

    Called on startup by every process that uses the store; safe to run concurrently.
    """
    return migrate_to(conn, schema, MIGRATIONS[-1][0])


def migrate_to(conn: psycopg.Connection[tuple[object, ...]], schema: str, target: int) -> int:
    """Bring ``schema`` up to migration ``target`` (tests build older stores with it), and
    its functions to their current bodies when that is the newest migration."""
    s = sql.Identifier(schema)
    with conn.transaction():
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (lock_key(schema, "migrate"),)
        )
        conn.execute("SELECT set_config(%s, 'on', true)", (STORE_DDL,))
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(s))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {}.schema_migrations ("
                "version integer PRIMARY KEY, description text NOT NULL, "
                "applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(s)
        )
        row = conn.execute(
            sql.SQL("SELECT coalesce(max(version), 0) FROM {}.schema_migrations").format(s)
        ).fetchone()
        current = int(row[0]) if row else 0  # type: ignore[call-overload]
        for version, description, body in MIGRATIONS:
            if version <= current or version > target:
                continue
            log.info("store: applying migration %d (%s) to schema %s", version, Said(description),
                     schema)  # fmt: skip
            conn.execute(render(body, schema))
            if version in CONVERSIONS:
                CONVERSIONS[version](conn, schema)
            conn.execute(
                sql.SQL(
                    "INSERT INTO {}.schema_migrations (version, description) VALUES (%s, %s)"
                ).format(s),
                (version, description),
            )
            current = version
        if current == MIGRATIONS[-1][0]:  # not a store a newer Weir has migrated further
            for body in FUNCTIONS.values():
                conn.execute(render(body, schema))
        unmarked = conn.execute(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = ANY(%s) AND c.relkind = 'r'"
            " AND obj_description(c.oid, 'pg_class') IS DISTINCT FROM %s",
            (schema, sorted(STORE_TABLES), STORE_MARK),
        ).fetchall()
        for (table,) in unmarked:
            conn.execute(
                sql.SQL("COMMENT ON TABLE {} IS {}").format(
                    sql.Identifier(schema, str(table)), sql.Literal(STORE_MARK)
                )
            )
    return current
