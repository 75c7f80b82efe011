"""Which `weir run` instance does which work, when several share one store (DESIGN.md 13).

Each source's capture and each connector is owned by one instance at a time. Ownership is a
Postgres session advisory lock held on the instance's lease connection, so it ends the moment
that connection does: when an instance dies (SIGKILL included), another takes its work over
at its next poll. An instance that loses its lease connection stops all its work at once and
competes again once it is back. Owners are also written, with a heartbeat, to the ``owners``
table for ``weir status``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import uuid

import psycopg
from psycopg import sql

from core.redact import redact
from core.store import SESSION, Conn, Store

log = logging.getLogger("weir.leases")


class Leases:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.instance = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._conn: Conn | None = None  # holds the leases: they end with it
        self._owners = store.table("owners")

    def alive(self) -> bool:
        """The lease connection is up (connecting when needed), and the heartbeat written.
        False means every lease is gone: the caller stops all its work.
        """
        try:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(
                    self.store.url, autocommit=True, connect_timeout=5, options=SESSION,
                    application_name=f"weir-leases:{self.instance}"[:63],
                )  # fmt: skip
            self._conn.execute(
                sql.SQL("UPDATE {} SET heartbeat = now() WHERE instance = %s").format(self._owners),
                (self.instance,),
            )
            return True
        except psycopg.Error as e:
            if self._conn is not None:  # it was up: every lease went with it
                log.error("leases: lost the store connection (%s); stopping all work",
                          type(e).__name__)  # fmt: skip
            self.close()
            return False

    def take(self, work: str) -> bool:
        """Own ``work`` if no other instance does."""
        assert self._conn is not None, "take() before alive()"
        row = self._conn.execute(
            "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (f"weir:lease:{work}",)
        ).fetchone()
        if not row or not row[0]:
            return False
        self._conn.execute(
            sql.SQL(
                "INSERT INTO {} (work, instance) VALUES (%s, %s) ON CONFLICT (work) DO UPDATE"
                " SET instance = excluded.instance, since = now(), heartbeat = now(),"
                " state = NULL, detail = NULL"
            ).format(self._owners),
            (work, self.instance),
        )
        log.info("leases: %s is %s's now", work, self.instance)
        return True

    def report(self, work: str, state: str, detail: str) -> None:
        """What ``weir status`` shows of ``work``: its state and why (a reason, an error),
        without a secret (the store is read by whoever runs weir status)."""
        if self._conn is None:
            return
        with contextlib.suppress(psycopg.Error):
            self._conn.execute(
                sql.SQL("UPDATE {} SET state = %s, detail = %s WHERE work = %s AND instance = %s")
                .format(self._owners),
                (state, redact(detail), work, self.instance),
            )  # fmt: skip

    def close(self) -> None:
        """Give up every lease; on a clean stop, no longer shown as owner (work that failed
        stays, so that weir status says why)."""
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.execute(
                    sql.SQL(
                        "DELETE FROM {} WHERE instance = %s AND state IS DISTINCT FROM 'failed'"
                    ).format(self._owners),
                    (self.instance,),
                )
            self._conn.close()
            self._conn = None
