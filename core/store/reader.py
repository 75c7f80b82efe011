"""Reads a source's stream for one connector, and keeps its cursor and failed list.

Used by the forwarding engine (engine/forwarder.py). Rows are turned into :class:`Message` here, on
the hot path: the stored JSON is spliced into the payload as text, timestamps are formatted by
Postgres, and per-collection parts of the group key are computed once.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import orjson
import psycopg
from psycopg import sql

from core.config.base import SeqStart, TimeStart
from core.envelope import (
    Message,
    collection_prefix,
    event_key,
    event_payload,
    record_key,
    record_payload,
    record_token,
)
from core.shards import UNSPLIT, Resplit, Shard, shard_of
from core.store import SESSION, AConn, Store
from core.store import failed as failed_list
from core.store.cursors import Cursor, Cursors
from core.store.writer import NOTIFY_CHANNEL

ISO = """to_char({} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""

EVENTS_SELECT = (
    "SELECT seq, collection_id, record_id, action, commit_lsn, commit_idx, "
    + ISO.format("committed_at")
    + ", record::text, changes::text, extract(epoch FROM committed_at)::float8 FROM {table}"
)
RECORDS_SELECT = (  # a long record id is kept whole beside its key (record_token)
    "SELECT seq, collection_id, coalesce(full_record_id, record_id), version, deleted, "
    + ISO.format("upstream_updated_at")
    + ", record::text,"
    " extract(epoch FROM coalesce(upstream_updated_at, updated_at))::float8 FROM {table}"
)


class StreamReader:
    """One connector's view of one source's stream (records or events)."""

    def __init__(
        self,
        store: Store,
        name: str,
        stream: str,
        where: tuple[sql.Composable, list[Any]],
        sync_id: str,
        provider: str,
        shard: Shard = UNSPLIT,
        fenced: bool = False,
    ) -> None:
        """``name`` keys the failed list, and with ``shard`` the cursor; ``where`` is a
        :func:`selection`. A ``fenced`` reader (a connector's) holds its shard's fence from
        ``open`` to ``close`` (core/store/cursors.py); the Consume API, served by every
        instance at once, reads unfenced."""
        self.fenced = fenced
        self.store = store
        self.connector = name
        self.stream = stream
        self.sync_id = sync_id
        self.provider = provider
        self.shard = shard
        self.cursors = Cursors(store, name, shard, sync_id, stream)
        self.resplits: list[Resplit] = []
        self._prefixes: dict[str, str] = {}
        self._conn: AConn | None = None
        self._where = where
        self._fetch, self._fetch_params = self._select()
        self._head = sql.SQL("SELECT {} FROM {} WHERE sync_id = %s").format(
            sql.Identifier(f"{self.stream}_seq"), store.table("sources")
        )

    @property
    def conn(self) -> AConn:
        if self._conn is None:
            raise RuntimeError("StreamReader used before open()")
        return self._conn

    async def open(self) -> None:
        # A stream's statistics lag behind it (seqs only grow, and its index leads with the
        # sync id, so the planner cannot probe the real end): with them it takes a page of
        # 2,000 for 2 rows and reads the whole span with a bitmap scan, then sorts it (180 ms
        # for 90k rows), where an index scan in seq order stops at the page's end (5 ms).
        self._conn = await psycopg.AsyncConnection.connect(
            self.store.url, autocommit=True, application_name=f"weir:{self.connector}",
            options=f"{SESSION} -c enable_bitmapscan=off",
        )  # fmt: skip
        if self.fenced:
            await self.cursors.fence(self._conn)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()

    def fence_lost(self) -> bool:
        """The store ended this fenced reader's session, and its fence with it: between two
        queries the connection is idle, so anything to read on it (the server's goodbye, or
        the end of the stream) says so before the next query would."""
        if not self.fenced or self._conn is None:
            return False
        if self._conn.closed:
            return True
        readable, _, _ = select.select([self._conn.fileno()], [], [], 0)
        return bool(readable)

    async def head(self) -> int:
        """The last seq committed to the stream."""
        row = await (await self.conn.execute(self._head, (self.sync_id,))).fetchone()
        if row is None:
            raise RuntimeError(f"source {self.sync_id} is not registered in the store")
        return int(row[0])

    def _select(self) -> tuple[sql.Composed, list[Any]]:
        """The query of :meth:`fetch` and its parameters after ``sync_id, after, upto``: the
        connector's selection, its shard's records only, and none that an earlier split of the
        connector delivered (:attr:`resplits`)."""
        where, params = self._where
        parts, params = [where], list(params)
        shard_of = sql.SQL("{}.shard_of(collection_id, record_id, %s)").format(
            sql.Identifier(self.store.schema)
        )
        if self.shard.of > 1:
            parts.append(sql.SQL("{} = %s").format(shard_of))
            params += [self.shard.of, self.shard.index]
        for r in self.resplits:
            parts.append(sql.SQL("seq > (%s::bigint[])[{} + 1]").format(shard_of))
            params += [list(r.seqs), r.shards]
        select = EVENTS_SELECT if self.stream == "events" else RECORDS_SELECT
        query = sql.SQL(
            select + " WHERE sync_id = %s AND seq > %s AND seq <= %s AND {where} "
            "ORDER BY seq LIMIT %s"
        ).format(table=self.store.table(self.stream), where=sql.SQL(" AND ").join(parts))
        return query, params

    async def cursor(self, start: Any) -> Cursor:
        """The saved cursor; on the connector's first start, one made from ``start``."""
        cursor = await self.cursors.load(self.conn, lambda: self._start_seq(start))
        self.resplits = cursor.resplits
        self._fetch, self._fetch_params = self._select()
        return cursor

    async def _start_seq(self, start: Any) -> int:
        if start == "beginning":
            return 0
        if start == "end":
            return await self.head()
        if isinstance(start, SeqStart):
            return start.seq - 1
        assert isinstance(start, TimeStart)
        column = "committed_at" if self.stream == "events" else "updated_at"
        q = sql.SQL("SELECT min(seq) FROM {} WHERE sync_id = %s AND {} >= %s").format(
            self.store.table(self.stream), sql.Identifier(column)
        )
        at: datetime = start.time
        row = await (await self.conn.execute(q, (self.sync_id, at))).fetchone()
        if row is None or row[0] is None:
            return await self.head()
        return int(row[0]) - 1

    async def save(self, seq: int, state: dict[str, Any]) -> None:
        if self.resplits:  # kept until the cursor has passed what the earlier splits sent
            left = [r for r in self.resplits if seq < max(r.seqs)]
            if left != self.resplits:
                self.resplits = left
                self._fetch, self._fetch_params = self._select()
            if left:
                state = {**state, "resplits": [r.as_json() for r in left]}
        await self.cursors.save(self.conn, seq, state)

    async def fail(self, msg: Message, error: str) -> None:
        """Put a message on the connector's failed list with the broker's last error."""
        await failed_list.put(self.store, self.conn, self.connector, self.stream,
                              [(msg, msg.attempts, error)])  # fmt: skip

    async def retries(self, limit: int) -> tuple[list[Message], list[int]]:
        """Failed messages of this source an operator asked to send again, of this shard: (the
        messages, marked ``replay``; the seqs a newer version of their record replaced, which
        the caller resolves)."""
        out, replaced = [], []
        for seq, group, key, payload, current in await failed_list.retries(
            self.store, self.conn, self.connector, self.stream, self.sync_id, limit
        ):
            meta = orjson.loads(payload)
            m = meta["metadata"]
            if self.shard.of > 1 and shard_of(m["collection_id"], m["record_id"],
                                              self.shard.of) != self.shard.index:  # fmt: skip
                continue
            if not current:
                replaced.append(seq)
                continue
            out.append(Message(self.sync_id, self.provider, seq, m["collection_id"],
                               meta.get("action"), group, key, payload, replay=True))  # fmt: skip
        return out, replaced

    async def resolve(self, seqs: list[int]) -> None:
        """Take failed messages of this source off the list (sent again, or replaced)."""
        await failed_list.resolve(self.store, self.conn, self.connector, self.sync_id, seqs)

    async def fetch(self, after: int, upto: int, limit: int) -> list[Message]:
        """Messages with ``after < seq <= upto`` that the connector selects, in seq order."""
        params = (self.sync_id, after, upto, *self._fetch_params, limit)
        cur = await self.conn.execute(self._fetch, params, binary=False)
        rows = await cur.fetchall()
        build = self.event if self.stream == "events" else self.record
        return [build(row) for row in rows]

    def _prefix(self, collection_id: str) -> str:
        prefix = self._prefixes.get(collection_id)
        if prefix is None:
            prefix = collection_prefix(self.sync_id, self.provider, collection_id)
            self._prefixes[collection_id] = prefix
        return prefix

    def event(self, row: Sequence[Any]) -> Message:
        seq, coll, rid, action, lsn, idx, ts, record, changes, at = row
        sid = self.sync_id
        key = event_key(sid, lsn, idx)
        payload = event_payload(
            sid, self.provider, seq, coll, rid, action, key, lsn, ts, record, changes
        )
        group = self._prefix(coll) + record_token(rid)
        return Message(sid, self.provider, seq, coll, action, group, key, payload, at)

    def record(self, row: Sequence[Any]) -> Message:
        seq, coll, rid, version, deleted, ts, record, at = row
        sid = self.sync_id
        group = self._prefix(coll) + record_token(rid)
        key = record_key(group, version)
        payload = record_payload(
            sid, self.provider, seq, coll, rid, key, version, ts, deleted, record
        )
        return Message(sid, self.provider, seq, coll, None, group, key, payload, at)


class Notifier:
    """Wakes connectors when a source commits to the store (LISTEN on one connection)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._subscribers: dict[str, list[Callable[[], None]]] = {}
        self._task: asyncio.Task[None] | None = None

    def subscribe(self, sync_id: str, callback: Callable[[], None]) -> None:
        """Call ``callback`` (in the event loop) after each commit of the source."""
        self._subscribers.setdefault(sync_id, []).append(callback)

    def unsubscribe(self, sync_id: str, callback: Callable[[], None]) -> None:
        self._subscribers.get(sync_id, []).remove(callback)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="weir-notifier")

    async def _listen(self) -> None:
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.store.url, autocommit=True, application_name="weir:notify",
                    options=SESSION,
                ) as conn:  # fmt: skip
                    await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(NOTIFY_CHANNEL)))
                    for callbacks in self._subscribers.values():  # missed while not listening
                        for callback in callbacks:
                            callback()
                    async for n in conn.notifies():
                        for callback in self._subscribers.get(n.payload, ()):
                            callback()
            except psycopg.OperationalError:
                await asyncio.sleep(1.0)  # readers poll meanwhile

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
