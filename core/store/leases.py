"""Leases in the store: who owns which work, for ``weir run`` instances sharing one store
(docs/operations.md “Scaling out”; core/runtime/leases.py decides when to take, report and give up).

A lease is a session advisory lock on the owner's lease connection, so it ends with that
connection; the ``owners`` table says, with a heartbeat, who holds which for ``weir status``.
Every method raises ``psycopg.Error`` when the connection fails.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from core.store import SESSION, Conn, Store
from core.store.connectors import VERSION
from core.store.shared import lease_application, lock_key


class Owners:
    """The leases of one instance (``instance`` names it in the owners table)."""

    def __init__(self, store: Store, instance: str, group: str = "all") -> None:
        """``group`` names the works the instance competes for (a worker's role and index,
        or ``all``): instances of one group share them out."""
        self.store = store
        self.instance = instance
        self.prefix = lease_application(store.schema, group)  # another store's are no peers
        t = store.table("owners")
        self._heartbeat = sql.SQL("UPDATE {} SET heartbeat = now() WHERE instance = %s").format(t)
        self._claim = sql.SQL(
            "INSERT INTO {} (work, instance) VALUES (%s, %s) ON CONFLICT (work) DO UPDATE"
            " SET instance = excluded.instance, since = now(), heartbeat = now(),"
            " state = NULL, detail = NULL"
        ).format(t)
        self._report = sql.SQL(
            "UPDATE {} SET state = %s, detail = %s WHERE work = %s AND instance = %s"
        ).format(t)
        self._release = sql.SQL(
            "DELETE FROM {} WHERE instance = %s AND state IS DISTINCT FROM 'failed'"
        ).format(t)
        self._give_up = sql.SQL("DELETE FROM {} WHERE work = %s AND instance = %s").format(t)
        self._operated = sql.SQL(
            "SELECT (SELECT coalesce(array_agg(name), '{{}}') FROM {} WHERE paused), ("
            + VERSION
            + ")"
        ).format(store.table("connector_controls"), store.table("api_connectors"))

    def connect(self) -> Conn:
        """A lease connection: the leases taken on it end with it."""
        return psycopg.connect(
            self.store.url, autocommit=True, connect_timeout=5, options=SESSION,
            application_name=(self.prefix + self.instance)[:63],
        )  # fmt: skip

    def heartbeat(self, conn: Conn) -> None:
        """Mark the instance's works as owned now (every second)."""
        conn.execute(self._heartbeat, (self.instance,))

    def peers(self, conn: Conn) -> int:
        """How many instances of the group are alive (their lease connections), this one too."""
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND left(application_name, %s) = %s",
            (len(self.prefix), self.prefix),
        ).fetchone()
        return max(1, int(row[0]) if row else 1)  # type: ignore[call-overload]

    def take(self, conn: Conn, work: str) -> bool:
        """Lock ``work`` on ``conn`` and record the instance as its owner, unless another
        connection holds it: then False."""
        if not _locked(conn, self._key(work)):
            return False
        conn.execute(self._claim, (work, self.instance))
        return True

    def _key(self, work: str) -> str:
        return lock_key(self.store.schema, "lease", work)

    def report(self, conn: Conn, work: str, state: str, detail: str) -> None:
        """Record ``work``'s state and why, while the instance owns it."""
        conn.execute(self._report, (state, detail, work, self.instance))

    def give_up(self, conn: Conn, work: str) -> None:
        """Let another instance have ``work`` (its lease ends; it is no longer shown as ours)."""
        conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (self._key(work),))
        conn.execute(self._give_up, (work, self.instance))

    def operated(self, conn: Conn) -> tuple[set[str], str]:
        """What operators changed: the connectors paused (core/store/operate.py), which no
        instance runs, and the version of the connectors made over the API."""
        row = conn.execute(self._operated).fetchone()
        return (set(row[0]), str(row[1])) if row else (set(), "")  # type: ignore[call-overload]

    def release(self, conn: Conn) -> None:
        """No longer show the instance as owner, but of work that failed (it says why)."""
        conn.execute(self._release, (self.instance,))


def _locked(conn: Conn, key: str) -> bool:
    """Lock ``key`` on ``conn`` until it ends, unless another connection holds it: then False."""
    row = conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (key,)).fetchone()
    return bool(row and row[0])
