"""The events stream's retention in the store: events older than ``store.events_retention``
are deleted in chunks (the retention job, core/runtime/jobs.py, decides when and warns)."""

from __future__ import annotations

from datetime import timedelta

from psycopg import sql

from core.store import Conn, Store


def behind(conn: Conn, store: Store, cutoff: timedelta) -> list[tuple[str, str, int]]:
    """(connector, source, events) of the events older than ``cutoff`` that a connector's
    cursor has not passed yet: what deleting them now takes from it."""
    t = store.table
    rows = conn.execute(
        sql.SQL(
            "SELECT c.connector, s.name, count(*) FROM {c} c JOIN {s} s USING (sync_id)"
            " JOIN {e} e ON e.sync_id = c.sync_id AND e.seq > c.seq"
            " WHERE c.stream = 'events' AND e.inserted_at < now() - %s"
            " GROUP BY c.connector, s.name"
        ).format(c=t("cursors"), s=t("sources"), e=t("events")),
        (cutoff,),
    ).fetchall()
    return [(str(c), str(s), int(n)) for c, s, n in rows]  # type: ignore[call-overload]


def delete_older(conn: Conn, store: Store, cutoff: timedelta, chunk: int) -> int:
    """Delete the events older than ``cutoff``, ``chunk`` per statement (on an autocommit
    connection, each its own transaction); returns how many."""
    delete = sql.SQL(
        "DELETE FROM {e} WHERE ctid = ANY(ARRAY(SELECT ctid FROM {e}"
        " WHERE inserted_at < now() - %s LIMIT %s))"
    ).format(e=store.table("events"))
    total = 0
    while True:
        n = conn.execute(delete, (cutoff, chunk)).rowcount
        total += n
        if n < chunk:
            return total
