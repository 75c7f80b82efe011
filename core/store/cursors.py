"""Connector cursors: where a connector, or each of its shards (core/shards.py), is in a source's
stream, and where the broker was then (docs/design.md “Guarantees”;
docs/operations.md “Scaling out”).

The cursors of a connector's shards are made together, by the first shard that starts, so that
all of them start where ``start_position`` said at that one moment. When the connector's number
of shards changes, the first shard of the new split to start re-splits it, in one transaction
and only while no shard of the old split runs anywhere (their leases are free; else
:class:`Resplitting`, tried again by the engine): every new shard starts at the lowest of the old
cursors, skips what its old shard had delivered (:class:`Resplit`, kept in the cursor's state
until it has passed the highest), and reads back from the earliest of the old broker marks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from psycopg import sql

from core.envelope import BrokerMark, earliest
from core.redact import Said, said
from core.shards import Resplit, Shard, shard_named, split
from core.store import AConn, Store
from core.store.shared import lock_key

log = logging.getLogger("weir.engine")

SPARK_PREFIX = "spark:"  # a Spark query's cursor is spark:NAME (spark/source.py)


class NotNow(Exception):
    """A connector's cursors cannot be made yet: its session waits, saying why, and tries
    again."""


class Resplitting(NotNow):
    """The connector's shards cannot be re-split now: a shard of its old split still runs."""


class FenceLost(Exception):
    """The store ended the session that held a connector shard's fence."""


class CursorGone(Exception):
    """A shard's cursor was deleted under it: the connector was deleted, or another instance
    re-split it. The next session finds out which (:class:`ConnectorGone`, or a re-split)."""


class ConnectorGone(Exception):
    """The connector a session runs was deleted (perhaps made again: another connector): its
    sessions stop, and never start it again from its ``start_position``."""


class Cursor:
    """Where a connector's shard is in one source's stream: every message of the shard up to
    ``seq`` is delivered (or failed, or filtered out). ``state`` is what the broker held then
    (see core/engine/sink.py), and what earlier splits of the connector had delivered."""

    def __init__(self, seq: int, state: dict[str, Any] | None, new: bool = False) -> None:
        self.seq = seq
        self.state = state or {}
        self.new = new  # made now, from the connector's start_position

    @property
    def mark(self) -> BrokerMark | None:
        mark = self.state.get("mark")
        return None if mark is None else {str(k): int(v) for k, v in mark.items()}

    @property
    def resplits(self) -> list[Resplit]:
        return [Resplit.from_json(r) for r in self.state.get("resplits", ())]


FENCE_POLL = 0.2  # seconds between attempts to take a fence another session holds


def fence_key(store: Store, cursor_key: str, sync_id: str) -> str:
    return lock_key(store.schema, "fence", f"{cursor_key}:{sync_id}")


def started(store: Store, connector: str) -> bool:
    """Whether a session of ``connector`` reached its broker before (in this process, a worker
    since restarted or an earlier ``weir run``): a cursor of any shard holds a broker mark
    (one is made without, at the first start, before the broker is asked)."""
    with store.connect(autocommit=True) as conn:
        row = conn.execute(
            sql.SQL(
                "SELECT EXISTS (SELECT FROM {} WHERE (connector = %s OR left(connector, %s) = %s)"
                " AND broker_state IS NOT NULL)"
            ).format(store.table("cursors")),
            (connector, len(connector) + 1, connector + "#"),
        ).fetchone()  # fmt: skip
    return bool(row and row[0])


class Cursors:
    """The cursors of one connector's shard in one source's stream."""

    def __init__(self, store: Store, connector: str, shard: Shard, sync_id: str, stream: str,
                 incarnation: int | None = None) -> None:  # fmt: skip
        """``incarnation``: the id of the making over the API of the connector the session
        runs (None for the file's); its cursors are saved only while that one exists."""
        self.store, self.connector, self.shard = store, connector, shard
        self.sync_id, self.stream, self.incarnation = sync_id, stream, incarnation
        self.key = shard.key(connector)
        self.table = store.table("cursors")
        # Whether the connector (the making the session runs) still exists; locks its row
        # against a delete until the transaction ends.
        self._exists = sql.SQL(
            "(%(i)s::bigint IS NULL OR EXISTS (SELECT FROM {} WHERE name = %(n)s AND id = %(i)s"
            " FOR KEY SHARE))"
        ).format(store.table("api_connectors"))

    async def fence(self, conn: AConn) -> None:
        """Hold the shard's fence on ``conn`` for as long as it is open, once no other session
        holds it: a session sends only while it holds the fence, so an owner that lost its
        lease (its lease connection dropped, or it was frozen) but still sends keeps the next
        owner waiting until its session ends, instead of both sending at once."""
        key, said = fence_key(self.store, self.key, self.sync_id), False
        take = "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))"
        while not (row := await (await conn.execute(take, (key,))).fetchone()) or not row[0]:
            if not said:
                said = True
                holder = await (
                    await conn.execute(
                        "SELECT a.pid, a.application_name, a.client_addr FROM pg_locks l"
                        " JOIN pg_stat_activity a USING (pid) WHERE l.locktype = 'advisory'"
                        " AND l.granted AND (l.classid::bigint << 32 | l.objid::bigint)"
                        " = hashtextextended(%s, 0)",
                        (key,),
                    )
                ).fetchone()
                who = "an unknown session"
                if holder is not None:
                    pid, app, addr = holder
                    who = f"store backend pid {pid}, {app} from {addr or 'a socket'}"
                log.info("connector %s: waiting for the session that still sends it to end (%s)",
                         self.key, who)  # fmt: skip
            await asyncio.sleep(FENCE_POLL)

    async def load(self, conn: AConn, first_seq: Callable[[], Awaitable[int]],
                   had: bool = False) -> Cursor:  # fmt: skip
        """The shard's saved cursor; else those of every shard of the split, made from
        ``first_seq()`` on the connector's first start or from the old split's (a re-split).
        ConnectorGone when the connector was deleted, or when no cursor of it is left though
        the caller ``had`` one: it never starts again from its ``start_position``."""
        async with conn.transaction():
            lock = lock_key(self.store.schema, "cursors", f"{self.connector}:{self.sync_id}")
            await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (lock,))
            row = await (await conn.execute(sql.SQL("SELECT {}").format(self._exists),
                                            self._whose())).fetchone()  # fmt: skip
            if not row or not row[0]:
                raise ConnectorGone(
                    said(
                        "connector %s: deleted while it ran (one made since under its "
                        "name is another); it stops",
                        self.key,
                    )
                )
            rows = await (
                await conn.execute(
                    sql.SQL(
                        "SELECT connector, seq, broker_state FROM {} WHERE sync_id = %s"
                        " AND (connector = %s OR left(connector, %s) = %s)"
                    ).format(self.table),
                    (self.sync_id, self.connector, len(self.connector) + 1, self.connector + "#"),
                )
            ).fetchall()
            saved = {shard_named(k, self.connector): Cursor(int(s), st) for k, s, st in rows}
            if self.shard in saved:
                return saved[self.shard]
            old = {s: c for s, c in saved.items() if s is not None}
            if not old and had:
                raise ConnectorGone(
                    said(
                        "connector %s: its cursor of source %s was deleted while it ran; "
                        "it stops rather than start again from its start_position",
                        self.key,
                        self.sync_id,
                    )
                )
            if not old:
                seq = await first_seq()
                await self._make(conn, seq, {})
                return Cursor(seq, None, new=True)
            return await self._resplit(conn, old)

    async def _resplit(self, conn: AConn, old: dict[Shard, Cursor]) -> Cursor:
        of = {s.of for s in old}
        was = max(of)
        if len(of) > 1 or len(old) != was:
            raise RuntimeError(
                said(
                    "connector %s: the store holds an incomplete split (%s)",
                    self.connector,
                    ", ".join(s.key(self.connector) for s in old),
                )
            )
        busy = []
        try_lock = "SELECT pg_try_advisory_xact_lock(hashtextextended(%s, 0))"
        for s in split(was):  # held by its lease's owner and by its session, while they last
            key = s.key(self.connector)
            lease = lock_key(self.store.schema, "lease", f"connector:{key}")
            for lock in (lease, fence_key(self.store, key, self.sync_id)):
                row = await (await conn.execute(try_lock, (lock,))).fetchone()
                if not row or not row[0]:
                    busy.append(str(s))
                    break
        if busy:
            into = (
                said("split into %s shards", self.shard.of)
                if self.shard.of > 1
                else said("unsplit")
            )
            runs = said("%s of its %s shards still run", ", ".join(busy), was)
            if was == 1:
                runs = said("it still runs unsplit")
            raise Resplitting(
                said(
                    "cannot %s while %s (a weir run with the old config?): waiting "
                    "for that to stop",
                    into,
                    runs,
                )
            )
        seqs = tuple(old[s].seq for s in split(was))
        marks = [m for c in old.values() if (m := c.mark) is not None]
        state: dict[str, Any] = {"mark": earliest(marks)} if marks else {}
        resplits = {r.shards: r for c in old.values() for r in c.resplits}
        if len(set(seqs)) > 1:
            resplits[was] = Resplit(was, seqs)
        if resplits:
            state["resplits"] = [r.as_json() for r in resplits.values()]
        await conn.execute(
            sql.SQL("DELETE FROM {} WHERE sync_id = %s AND connector = ANY(%s)").format(self.table),
            (self.sync_id, [s.key(self.connector) for s in old]),
        )
        await self._make(conn, min(seqs), state)
        made = Said(f"split into {self.shard.of} shards" if self.shard.of > 1 else "unsplit")
        log.info("connector %s: %s (it had %d) from seq %d of source %s", self.connector,
                 made, was, min(seqs), self.sync_id)  # fmt: skip
        return Cursor(min(seqs), state)

    async def _make(self, conn: AConn, seq: int, state: dict[str, Any]) -> None:
        saved = orjson.dumps(state).decode() if state else None
        rows = [(s.key(self.connector), self.sync_id, self.stream, seq, saved)
                for s in split(self.shard.of)]  # fmt: skip
        insert = sql.SQL(
            "INSERT INTO {} (connector, sync_id, stream, seq, broker_state)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
        ).format(self.table)
        await conn.cursor().executemany(insert, rows)

    def _whose(self) -> dict[str, Any]:
        return {"n": self.connector, "i": self.incarnation}

    async def put(self, conn: AConn, seq: int, holder: str, take: bool) -> bool:
        """Set an unsharded reader's cursor, made when missing (a Spark query's: Spark runs one
        batch of a query at a time). ``holder`` names the run that writes it: a run ``take``s
        the cursor over (a query started again), and after that moves it only while it still
        holds it. False when another run took it since (a second query of the same name)."""
        cur = await conn.execute(
            sql.SQL(
                "INSERT INTO {} AS c (connector, sync_id, stream, seq, broker_state)"
                " VALUES (%(key)s, %(sync)s, %(stream)s, %(seq)s, %(state)s)"
                " ON CONFLICT (connector, sync_id) DO UPDATE SET seq = excluded.seq,"
                " broker_state = excluded.broker_state, updated_at = now()"
                " WHERE %(take)s OR c.broker_state->>'holder' IS NOT DISTINCT FROM %(holder)s"
            ).format(self.table),
            {"key": self.key, "sync": self.sync_id, "stream": self.stream, "seq": seq,
             "state": orjson.dumps({"holder": holder}).decode(), "take": take,
             "holder": holder},
        )  # fmt: skip
        return cur.rowcount == 1

    async def save(self, conn: AConn, seq: int, state: dict[str, Any]) -> None:
        """Move the cursor; CursorGone when the connector was deleted (its making is gone,
        though one of its name may exist) or another instance re-split it."""
        cur = await conn.execute(
            sql.SQL(
                "UPDATE {} SET seq = %(seq)s, broker_state = %(state)s, updated_at = now() "
                "WHERE connector = %(key)s AND sync_id = %(sync)s AND {}"
            ).format(self.table, self._exists),
            {"seq": seq, "state": orjson.dumps(state).decode(), "key": self.key,
             "sync": self.sync_id, **self._whose()},
        )  # fmt: skip
        if cur.rowcount != 1:
            raise CursorGone(
                said(
                    "connector %s: its cursor of source %s is gone (deleted, or "
                    "split anew by another weir run)",
                    self.key,
                    self.sync_id,
                )
            )
