"""The tables a source's role may not read, and the GRANT that lets it: a backfill (and a seed)
reads every table it fills, capture reads none. Each such table is one problem, said in one line
(docs/operations.md “Backfill and seed”): by the work that stops at it, at ERROR (a backfill of
``backfill:``, ``weir backfill``, a seed), else once a process at WARNING (capture's start, a
backfill capture asks for, which waits for the GRANT).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from core.tables import table_name

if TYPE_CHECKING:  # for annotations only: a seed task does not import the config models
    from core.config.sources import PostgresSource

log = logging.getLogger("weir.source")

_said: set[tuple[str, str, str]] = set()  # (source, schema, table) said in this process
_saying = threading.Lock()  # capture and backfills say from threads of their own


def role_of(conn: psycopg.Connection[Any]) -> str:
    """The connection's role, as a GRANT names it."""
    row = conn.execute("SELECT quote_ident(current_user)").fetchone()
    return str(row[0]) if row else "?"


def unreadable(
    conn: psycopg.Connection[Any], tables: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """The tables of ``tables`` the connection's role may not read (one that does not exist is
    no such table: a backfill of it says so itself)."""
    rows = conn.execute(
        "SELECT s, t FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS u(s, t, i)"
        " WHERE NOT has_table_privilege(to_regclass(format('%%I.%%I', s, t)), 'SELECT')"
        " ORDER BY i",
        ([s for s, _ in tables], [t for _, t in tables]),
    ).fetchall()
    return [(str(s), str(t)) for s, t in rows]


def _said_of(
    conn: psycopg.Connection[Any], src: PostgresSource, tables: list[tuple[str, str]]
) -> tuple[str, tuple[str, ...]]:
    """The line that names ``tables``, which the role may not read, and the GRANT: its format
    and arguments (the source's and the tables' names are arguments of their own)."""
    me = role_of(conn)
    names = ", ".join(table_name(s, t) for s, t in tables)
    grant = ", ".join(sql.Identifier(s, t).as_string(conn) for s, t in tables)
    fmt = ("source %s: role %s may not read %s, which a backfill reads (capture does not): as "
           "their owner run GRANT SELECT ON %s TO %s")  # fmt: skip
    return fmt, (src.name, me, names, grant, me)


def cannot_read(
    conn: psycopg.Connection[Any], src: PostgresSource, tables: list[tuple[str, str]]
) -> str:
    """Why a backfill of ``tables`` cannot be, when the role may not read some: the line that
    names them with the GRANT; empty when it may read them all."""
    rows = unreadable(conn, tables)
    if not rows:
        return ""
    fmt, args = _said_of(conn, src, rows)
    return fmt % args


def say_unreadable(
    conn: psycopg.Connection[Any], src: PostgresSource, tables: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """The tables of ``tables`` the role may not read, each named at WARNING with the GRANT
    the first time this process finds it so."""
    rows = unreadable(conn, tables)
    with _saying:
        new = [(s, t) for s, t in rows if (src.name, s, t) not in _said]
        _said.update((src.name, s, t) for s, t in new)
    if new:
        fmt, args = _said_of(conn, src, new)
        log.warning(fmt, *args)
    return rows
