"""The stream store: a Postgres schema holding every source's records and events streams."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from core.redact import Said, first_line, said
from core.store.migrations import foreign_tables, migrate

if TYPE_CHECKING:  # for annotations only: a seed task does not import the config models
    from core.config.model import WeirConfig
    from core.config.sources import HttpSource, PostgresSource

Conn = psycopg.Connection[tuple[object, ...]]
AConn = psycopg.AsyncConnection[tuple[Any, ...]]
# Every store connection's settings: the date and interval styles psycopg reads, whatever the
# database or role sets (ALTER DATABASE ... SET datestyle = 'German' made timestamps unreadable).
SESSION = "-c DateStyle=ISO,YMD -c IntervalStyle=postgres"
log = logging.getLogger("weir.store")


def array(values: Iterable[str | int | bool | None]) -> str:
    """An array parameter as Postgres' text literal: built here, it costs a tenth of what
    psycopg's list adaptation costs (~1.4 us an element, on the writer's hot path)."""
    return "{" + ",".join(map(_element, values)) + "}"


def ints(values: Iterable[int]) -> str:
    """:func:`array` of integers, without a call an element."""
    return "{" + ",".join(map(str, values)) + "}"


def texts(values: list[str]) -> str:
    """:func:`array` of texts, without a call an element when none needs escaping."""
    joined = '","'.join(values)
    if '"' in joined or "\\" in joined:
        return array(values)
    return '{"' + joined + '"}' if values else "{}"


def _element(v: str | int | bool | None) -> str:
    if v is None:
        return "NULL"
    if v is True or v is False:
        return "t" if v else "f"
    if isinstance(v, int):
        return str(v)
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'


class StoreError(RuntimeError):
    """The store cannot be used as it is; the message says why and what to do."""


@dataclass(frozen=True)
class Store:
    """Where the streams live. Holds no connection: each user opens its own."""

    url: str
    schema: str = "weir"

    def connect(self, *, autocommit: bool = False) -> Conn:
        # UTF-8 whatever the database's encoding: SnapshotWriter passes rows on as bytes.
        return psycopg.connect(
            self.url, autocommit=autocommit, application_name="weir", client_encoding="UTF8",
            options=SESSION,
        )  # fmt: skip

    def table(self, name: str) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(self.schema), sql.Identifier(name))

    def _warn_shadowing(self, conn: Conn) -> None:
        """In a database with tables of its own (a source's), a role named as the store's
        schema finds the store's tables first ("$user" leads the default search_path): its
        unqualified ``events`` is the store's, and a table it creates without a schema lands
        there."""
        row = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %s)"
            " AND current_setting('search_path') LIKE '%%$user%%'"
            " AND EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            "  WHERE c.relkind IN ('r', 'p') AND n.nspname <> %s AND n.nspname NOT LIKE 'pg%%'"
            "  AND n.nspname <> 'information_schema')", (self.schema, self.schema)
        ).fetchone()  # fmt: skip
        if row and row[0]:
            log.warning(
                'store: role %s finds the store\'s tables before its own (search_path "$user", '
                "...): its unqualified names (events, records, ...) mean the store's, and tables "
                "it creates without a schema land in schema %s. Give the store a schema named "
                "unlike any role (store: schema:), or ALTER ROLE %s SET search_path = public",
                self.schema,
                self.schema,
                self.schema,
            )

    def slot_made(self, sync_id: uuid.UUID, slot: str) -> None:
        """Note that Weir made ``slot`` for this store's source (before its capture first
        held it): a slot a store did not make is another's (core/sources/pg/slot.py)."""
        with self.connect() as conn:
            conn.execute(
                sql.SQL(
                    "UPDATE {} SET slot_name = %s WHERE sync_id = %s AND NOT slot_tracked"
                ).format(self.table("sources")),
                (slot, sync_id),
            )

    def prepare(self, sources: Iterable[PostgresSource | HttpSource]) -> None:
        """Bring the schema up to date and register the sources; called once on startup.

        A source's row is created on first start; a renamed source keeps its sync id's row.
        """
        register = sql.SQL(
            "INSERT INTO {} (sync_id, name, kind, provider) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (sync_id) DO UPDATE SET name = excluded.name, "
            "kind = excluded.kind, provider = excluded.provider"
        ).format(self.table("sources"))
        with self.connect() as conn:
            row = conn.execute("SHOW server_encoding").fetchone()
            if row is None or row[0] != "UTF8":
                raise StoreError(
                    said(
                        "the store's database is in %s, not UTF8: records may hold any "
                        "character, so the store needs a UTF8 database (store.url)",
                        row[0] if row else "?",
                    )
                )
            taken = foreign_tables(conn, self.schema)
            if taken:
                raise StoreError(
                    said(
                        "schema %s holds tables or indexes of its own named as the "
                        "store's (%s): give the store a schema of its own (store: "
                        "schema:)",
                        self.schema,
                        ", ".join(taken),
                    )
                )
            try:
                migrate(conn, self.schema)
            except psycopg.errors.InsufficientPrivilege as e:
                raise StoreError(_may_not_create(conn, self.schema, e)) from None
            self._warn_shadowing(conn)
            for src in sources:
                conn.execute(register, (src.sync_id, src.name, src.kind, src.provider))


def _may_not_create(conn: psycopg.Connection[Any], schema: str, e: psycopg.Error) -> Said:
    """Why the store role cannot make or change the store's schema, and what lets it: the
    GRANT, or, when another role owns the schema or what it holds (a run as that role made
    them), their handover, which a superuser runs (Weir changes them as their owner)."""
    conn.rollback()
    user, db, s, other = conn.execute(
        "SELECT quote_ident(current_user), quote_ident(current_database()), quote_ident(%s),"
        " (SELECT o::regrole::text FROM pg_namespace n, LATERAL (SELECT n.nspowner UNION ALL"
        "  SELECT relowner FROM pg_class WHERE relnamespace = n.oid UNION ALL"
        "  SELECT proowner FROM pg_proc WHERE pronamespace = n.oid) AS owners(o)"
        "  WHERE n.nspname = %s AND o <> current_user::regrole LIMIT 1)",
        (schema, schema),
    ).fetchone() or ("ROLE", "DATABASE", schema, None)
    if other is not None:
        at, alter = (sql.Literal(t).as_string(conn) for t in (s, f"ALTER %s %s OWNER TO {user}"))
        handover = (
            f"DO $$ DECLARE o record; BEGIN ALTER SCHEMA {s} OWNER TO {user}; FOR o IN SELECT"
            f" 'TABLE' AS k, oid::regclass::text AS n FROM pg_class WHERE relnamespace ="
            f" {at}::regnamespace AND relkind IN ('r', 'p') UNION ALL SELECT 'FUNCTION',"
            f" oid::regprocedure::text FROM pg_proc WHERE pronamespace = {at}::regnamespace"
            f" LOOP EXECUTE format({alter}, o.k, o.n); END LOOP; END $$"
        )
        return said(
            "role %s may not change the store's schema %s in database %s (%s): role %s owns "
            "it or what it holds (a run as that role made them); as a superuser hand them to "
            "%s: %s; or DROP SCHEMA %s CASCADE to make it anew (what it holds is lost)",
            *(user, schema, db, first_line(e), other, user, handover, s),
        )
    return said(
        "role %s may not make the store's schema %s in database %s (%s): as the database's "
        "owner run GRANT CREATE ON DATABASE %s TO %s; or give store.url a database the role "
        "owns (createdb -O %s weir_store)",
        *(user, schema, db, first_line(e), db, user, user),
    )


def open_store(cfg: WeirConfig) -> Store:
    """The store of ``cfg``, migrated, with its sources registered (every command that writes)."""
    store = Store(cfg.store_url, cfg.store.schema_)
    store.prepare(cfg.sources)
    return store
