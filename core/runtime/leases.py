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

from core.redact import redact
from core.store import Conn, Store
from core.store.leases import Owners

log = logging.getLogger("weir.leases")


class Leases:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.instance = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._conn: Conn | None = None  # holds the leases: they end with it
        self._owners = Owners(store, self.instance)

    def alive(self) -> bool:
        """The lease connection is up (connecting when needed), and the heartbeat written.
        False means every lease is gone: the caller stops all its work.
        """
        try:
            if self._conn is None or self._conn.closed:
                self._conn = self._owners.connect()
            self._owners.heartbeat(self._conn)
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
        if not self._owners.take(self._conn, work):
            return False
        log.info("leases: %s is %s's now", work, self.instance)
        return True

    def report(self, work: str, state: str, detail: str) -> None:
        """What ``weir status`` shows of ``work``: its state and why (a reason, an error),
        without a secret (the store is read by whoever runs weir status)."""
        if self._conn is None:
            return
        with contextlib.suppress(psycopg.Error):
            self._owners.report(self._conn, work, state, redact(detail))

    def close(self) -> None:
        """Give up every lease; on a clean stop, no longer shown as owner (work that failed
        stays, so that weir status says why)."""
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._owners.release(self._conn)
            self._conn.close()
            self._conn = None
