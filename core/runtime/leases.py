"""Which `weir run` instance does which work, when several share one store
(docs/operations.md “Scaling out”).

Each source's capture and each connector is owned by one instance at a time. Ownership is a
Postgres session advisory lock held on the instance's lease connection, so it ends the moment
that connection does: when an instance dies (SIGKILL included), another takes its work over
at its next poll. An instance that loses its lease connection stops all its work at once and
competes again once it is back. Owners are also written, with a heartbeat, to the ``owners``
table for ``weir status``.

Instances share the works out: one that holds its share (its works divided by the live
instances of its group, rounded up) leaves a free work to the others, and one that holds more
gives those past it up (at most every ``REBALANCE`` seconds), so that a new instance gets its
share. A work that nobody else took for ``ORPHAN_POLLS`` polls is taken whatever the share (an
instance whose config lacks it, a peer at its share), and kept. When an instance dies, its
peers' share grows at once: the takeover is not delayed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid

import psycopg

from core.failures import SAY_AGAIN
from core.redact import Said, redact
from core.store import Conn, Store
from core.store.leases import Owners

log = logging.getLogger("weir.leases")

REBALANCE = 10.0  # seconds between two works given up by an instance over its share
ORPHAN_POLLS = 3  # polls a free work is left to the others before it is taken regardless


class Leases:
    def __init__(self, store: Store, works: int, group: str = "all") -> None:
        """Leases on ``works`` works, shared out with the other instances of ``group``."""
        self.store = store
        self.works = works
        self.instance = f"{socket.gethostname()[:30]}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self._conn: Conn | None = None  # holds the leases: they end with it
        self._owners = Owners(store, self.instance, group)
        self.held: list[str] = []  # in the order taken
        self._orphans: set[str] = set()  # taken past the share: kept
        self._left: dict[str, int] = {}  # polls each free work was left to the others
        self._share = works
        self._rebalanced = time.monotonic()
        self._dropped = False  # the connection went outside alive()
        self._paused_now: set[str] = set()  # connectors paused, as read at the last poll
        self._who = Said("leases" if group == "all" else f"leases of {group}")  # in log lines
        self._down_said: float | None = None  # when the store's absence was last said
        self.connectors_version = ""  # of the connectors made over the API, likewise

    def alive(self) -> bool:
        """The lease connection is up (connecting when needed), and the heartbeat written.
        False means every lease is gone: the caller stops all its work.
        """
        if self._dropped:  # the connection went during the last poll: its works stop now
            self._dropped = False
            return False
        try:
            if self._conn is None or self._conn.closed:
                self._conn = self._owners.connect()
            self._owners.heartbeat(self._conn)
            self._paused_now, self.connectors_version = self._owners.operated(self._conn)
            self._share = -(-self.works // self._owners.peers(self._conn))
        except psycopg.Error as e:
            if self._conn is not None:  # it was up: every lease went with it
                self._lost(e)
            elif self._down_said is None or time.monotonic() - self._down_said >= SAY_AGAIN:
                log.warning("%s: the store does not answer yet (%s); the work waits", self._who,
                            type(e).__name__)  # fmt: skip
                self._down_said = time.monotonic()
            self.close()
            return False
        if self._down_said is not None:
            log.info("%s: the store answers again", self._who)
            self._down_said = None
        return True

    def _lost(self, e: psycopg.Error) -> None:
        log.warning("%s: lost the store connection (%s); stopping all work", self._who,
                    type(e).__name__)  # fmt: skip
        self._down_said = time.monotonic()
        self.close()

    def take(self, work: str) -> bool:
        """Own ``work`` if no other instance does, and this one is below its share (or nobody
        else took it for a while)."""
        if self._conn is None:  # lost during this poll (alive() says so next)
            return False
        if work in self.held:  # ours already (a work started again)
            return True
        orphan = False
        if len(self.held) - len(self._orphans) >= self._share:
            self._left[work] = self._left.get(work, 0) + 1
            if self._left[work] <= ORPHAN_POLLS:
                return False
            orphan = True
        try:
            if not self._owners.take(self._conn, work):
                return False
        except psycopg.Error as e:  # every lease went with the connection
            self._lost(e)
            self._dropped = True
            return False
        self._left.pop(work, None)
        self.held.append(work)
        if orphan:
            self._orphans.add(work)
        log.info("leases: %s%s%s is %s's now", *_parts(work), self.instance)
        return True

    def surplus(self) -> list[str]:
        """The works to give up so that the peers get their share: those past it, the last
        taken first, at most every ``REBALANCE`` seconds."""
        now = time.monotonic()
        if now - self._rebalanced < REBALANCE:
            return []
        self._rebalanced = now
        shared = [w for w in self.held if w not in self._orphans]
        return shared[self._share :]

    def give_up(self, work: str) -> None:
        """End the lease on ``work`` (stopped by the caller) for another instance to take."""
        self.held.remove(work)
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._owners.give_up(self._conn, work)
        log.info("leases: %s%s%s given up for another instance to take", *_parts(work))

    def paused(self, work: str) -> bool:
        """``work`` is a shard of a connector an operator paused (as of this poll)."""
        kind, _, name = work.partition(":")
        return kind == "connector" and name.split("#", 1)[0] in self._paused_now

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
        self.held.clear()
        self._orphans.clear()
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._owners.release(self._conn)
            self._conn.close()
            self._conn = None


def _parts(work: str) -> tuple[Said, str, Said]:
    """A work's name for a log line: its kind, the config's name as a log argument of its own
    (printed as it is, also when a password is the same word: core/redact.py), and its shard."""
    kind, colon, rest = work.partition(":")
    name, sep, shard = rest.partition("#")
    return Said(kind + colon), name, Said(sep + shard)
