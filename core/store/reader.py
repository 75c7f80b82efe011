"""Reads a source's stream for one connector, and keeps its cursor and failed list.

Used by the forwarding engine (engine/forwarder.py) and the Consume API. Batches are read a
few at a time and their entries turned into :class:`Message` here, on the hot path: the stored
JSON is spliced into the payload as the bytes it is, and per-collection parts of the group key
are computed once. The records stream is read in seq order from its index, each version's
entry from its batch (the last few batches decoded are kept).
"""

from __future__ import annotations

import select
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, NamedTuple, TypeVar

import orjson
import psycopg
from psycopg import sql

from core.envelope import (
    Message,
    Payloads,
    collection_prefix,
    event_key,
    record_key,
    record_token,
)
from core.redact import said
from core.shards import UNSPLIT, Resplit, Shard, shard_of
from core.store import SESSION, AConn, Store, index, starts, streams
from core.store import failed as failed_list
from core.store.batches import Entries, Version
from core.store.cursors import Cursor, Cursors
from core.store.index import Batches, IndexMissing
from core.store.selection import Selection

BATCHES = 16  # events batches read per query
Entry = tuple[int, str, str | None, bytes | None]  # seq, collection, record id, record JSON
T = TypeVar("T")


class Found(NamedTuple):
    """A stream message and what the Consume API shows of it beside its payload."""

    message: Message
    record: bytes
    changes: bytes | None
    action: str  # insert | update | delete | truncate; records stream: upsert | delete
    record_id: str | None
    deleted: bool
    ts: str


class StreamReader:
    """One connector's view of one source's stream (records or events)."""

    def __init__(
        self,
        store: Store,
        name: str,
        stream: str,
        select: Selection,
        sync_id: str,
        provider: str,
        shard: Shard = UNSPLIT,
        fenced: bool = False,
        incarnation: int | None = None,
        end: int | None = None,
    ) -> None:
        """``name`` keys the failed list, and with ``shard`` the cursor; ``select`` says which
        messages it takes. A ``fenced`` reader (a connector's) holds its shard's fence from
        ``open`` to ``close`` (core/store/cursors.py); the Consume API, served by every
        instance at once, reads unfenced. ``incarnation``: see :class:`Cursors`. ``end``: the
        seq ``start_position: end`` means (an API-made connector's, when it was made), or
        None for the stream's head at its first start."""
        self.end = end
        self.fenced = fenced
        self.store = store
        self.connector = name
        self.stream = stream
        self.sync_id = sync_id
        self.provider = provider
        self.shard = shard
        self.select = select
        self.cursors = Cursors(store, name, shard, sync_id, stream, incarnation)
        self.resplits: list[Resplit] = []
        self.batches = Batches(store, sync_id)
        self.payloads = Payloads(sync_id, provider)
        self._prefixes: dict[str, str] = {}
        self._times: dict[str, float] = {}
        self._last: tuple[str, float] = ("", 0.0)  # the last time read, and its epoch seconds
        self._held: tuple[int, Entries] | None = None  # (first seq, entries) last read
        self._conn: AConn | None = None
        self._head = sql.SQL("SELECT {} FROM {} WHERE sync_id = %s").format(
            sql.Identifier(f"{self.stream}_seq"), store.table("sources")
        )
        self._events = streams.event_batches(store)
        self._oldest = sql.SQL("SELECT min(first_seq) FROM {} WHERE sync_id = %s").format(
            store.table("event_batches")
        )
        self._page = streams.record_page(store)

    @property
    def conn(self) -> AConn:
        if self._conn is None:
            raise RuntimeError("StreamReader used before open()")
        return self._conn

    async def open(self) -> None:
        self._conn = await psycopg.AsyncConnection.connect(
            self.store.url, autocommit=True, application_name=f"weir:{self.connector}",
            options=SESSION,
        )  # fmt: skip
        if self.stream == "records":
            await index.aensure(self._conn, self.store)
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
            raise RuntimeError(said("source %s is not registered in the store", self.sync_id))
        return int(row[0])

    async def oldest(self) -> int | None:
        """The first seq of the events the store still holds (retention deletes older ones),
        or None when it holds none."""
        row = await (await self.conn.execute(self._oldest, (self.sync_id,))).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def _takes(self, coll: str, rid: str | None, action: str, record: bytes | None,
               seq: int) -> bool:  # fmt: skip
        """Whether the connector takes this message: its selection, its shard's records only,
        and none that an earlier split of the connector delivered (:attr:`resplits`)."""
        if not self.select(coll, rid, action, record):
            return False
        if self.shard.of > 1 and shard_of(coll, rid, self.shard.of) != self.shard.index:
            return False
        return all(seq > r.seqs[shard_of(coll, rid, r.shards)] for r in self.resplits)

    async def cursor(self, start: Any, had: bool = False) -> Cursor:
        """The saved cursor; on the connector's first start, one made from ``start`` (see
        :meth:`Cursors.load` for ``had``)."""
        cursor = await self.cursors.load(self.conn, lambda: starts.start_seq(self, start), had)
        self.resplits = cursor.resplits
        if cursor.new:
            await starts.tell_deleted(self, cursor.seq, start)
        return cursor

    async def save(self, seq: int, state: dict[str, Any]) -> None:
        if self.resplits:  # kept until the cursor has passed what the earlier splits sent
            self.resplits = [r for r in self.resplits if seq < max(r.seqs)]
            if self.resplits:
                state = {**state, "resplits": [r.as_json() for r in self.resplits]}
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
        """Messages with ``after < seq <= upto`` that the connector takes, in seq order: at most
        ``limit``, and when fewer, every message up to ``upto`` was looked at."""
        out: list[Message] = []
        async for page in self.pages(after, upto, limit, self.event, self.record):
            out += page
            if len(out) >= limit:
                return out[:limit]
        return out

    async def entries(self, after: int, upto: int, limit: int) -> list[Entry]:
        """As :meth:`fetch`, the messages' (seq, collection, record id, record JSON)."""
        out: list[Entry] = []

        def event(e: Entries, i: int, seq: int) -> Entry:
            return seq, e.coll[i], e.rid[i], e.record[i]

        def record(v: Version) -> Entry:
            return v.seq, v.coll, v.rid, v.record

        async for page in self.pages(after, upto, limit, event, record):
            out += page
            if len(out) >= limit:
                return out[:limit]
        return out

    async def pages(self, after: int, upto: int, page: int,
                     event: Callable[[Entries, int, int], T],
                     record: Callable[[Version], T]) -> AsyncIterator[list[T]]:  # fmt: skip
        """What the connector takes after ``after`` up to ``upto``, in seq order, a batch (or a
        page of ``page`` versions) at a time: ``event(batch, position, seq)`` of each event,
        ``record(version)`` of each version. Events: at most ``page`` in all."""
        takes = None if self._all() else self._takes
        if self.stream == "records":
            while after < upto:
                found = await self._versions(self._page, (self.sync_id, after, upto, page))
                yield [record(v) for seq, v in found if takes is None or takes(
                    v.coll, v.rid, "delete" if v.deleted else "upsert", v.record, seq)]  # fmt: skip
                if len(found) < page:
                    return
                after = found[-1][0]
            return
        left = page
        while after < upto and left > 0:
            # Only the seqs the page can still take are read, and so decoded and made into
            # messages: a store batch holds up to a capture batch (5,000 changes, or a whole
            # transaction), more than a page, so a page often ends within one, which the next
            # page goes on from.
            reach = min(upto, after + left)
            read = False
            async for first, e in self._event_batches(after, reach):
                wanted = range(max(0, after + 1 - first), min(len(e), reach + 1 - first))
                if takes is None:
                    out = [event(e, i, first + i) for i in wanted]
                else:
                    coll, rid, action, rec = e.coll, e.rid, e.action, e.record
                    out = [event(e, i, first + i) for i in wanted
                           if takes(coll[i], rid[i], action[i], rec[i], first + i)]  # fmt: skip
                left -= len(out)
                read = True
                yield out
                after = min(reach, first + len(e) - 1)
            if not read:  # none holds these seqs (retention took them): on past them
                after = reach

    async def _event_batches(self, after: int, upto: int) -> AsyncIterator[tuple[int, Entries]]:
        """The events batches holding seqs in (after, upto], decoded: the one the last read
        ended in is kept (a batch never changes once written), the others read from the store,
        up to ``BATCHES`` of them."""
        held = self._held
        if held is not None and held[0] <= after + 1 < held[0] + len(held[1]):
            yield held
            return
        for first, data in await self.stored_batches(after, upto):
            self._held = held = (first, Entries.decode(data))
            yield held

    async def stored_batches(self, after: int, upto: int) -> list[tuple[int, bytes]]:
        """(first seq, stored data) of the events batches holding seqs in (after, upto], in
        order, up to ``BATCHES`` of them."""
        query = self._events
        return await (
            await self.conn.execute(query, (self.sync_id, after, upto, BATCHES))
        ).fetchall()

    def _all(self) -> bool:
        """Whether the connector takes every message (no selection, shard or re-split)."""
        return self.select.everything and self.shard.of == 1 and not self.resplits

    async def _versions(self, query: sql.Composed, params: Any) -> list[tuple[int, Version]]:
        """The records-stream versions a query of the index names, with their entries: asked
        again when an entry moved between the two reads (retention, core/store/retention.py)."""
        for _ in range(3):
            rows = await (await self.conn.execute(query, params)).fetchall()
            if rows and rows[-1][0] == -1:
                raise IndexMissing()
            held = await self.batches.aload(self.conn, {int(r[1]) for r in rows})
            if all(r[1] in held for r in rows):
                return [(int(seq), held[batch].version_at(pos)) for seq, batch, pos in rows]
        raise RuntimeError("records-stream entries kept moving while read")

    async def at(self, seqs: Iterable[int]) -> dict[int, Found]:
        """The messages of these seqs still in the stream (a records-stream version not yet
        replaced, an event not yet pruned), whatever the selection."""
        want = sorted(set(seqs))
        out: dict[int, Found] = {}
        if not want:
            return out
        if self.stream == "records":
            for seq, v in await self._versions(streams.record_seqs(self.store),
                                               (self.sync_id, want)):  # fmt: skip
                action = "delete" if v.deleted else "upsert"
                out[seq] = Found(self.record(v), v.record, None, action, v.rid, v.deleted, v.ts)
            return out
        # the batches by their first seqs, then from the cache (a receive of the Consume API
        # wants a few of a batch's messages, and the next receive the next few)
        query, params = streams.events_at(self.store), (self.sync_id, want)
        firsts = [r[0] for r in await (await self.conn.execute(query, params)).fetchall()]
        held = await self.batches.aload(self.conn, (f for f in firsts if f is not None))
        for seq in want:
            for first, e in held.items():
                if first <= seq < first + len(e):
                    i = seq - first
                    action = e.action[i]
                    out[seq] = Found(self.event(e, i, seq), e.record[i] or b"null", e.changes[i],
                                     action, e.rid[i], action == "delete", e.ts[i])  # fmt: skip
        return out

    def _prefix(self, collection_id: str) -> str:
        prefix = self._prefixes.get(collection_id)
        if prefix is None:
            prefix = collection_prefix(self.sync_id, self.provider, collection_id)
            self._prefixes[collection_id] = prefix
        return prefix

    def _at(self, ts: str) -> float:
        """Epoch seconds of a time as messages write it (``...T10:00:00.123456Z``): the
        changes of a commit, which come one after another, share it, and its second is read
        once for all the commits in it."""
        if ts == self._last[0]:
            return self._last[1]
        if len(ts) != 27:
            return starts.epoch(ts)
        second = self._times.get(ts[:19])
        if second is None:
            if len(self._times) > 1000:
                self._times.clear()
            second = self._times[ts[:19]] = starts.epoch(ts[:19] + "Z")
        at = second + int(ts[20:26]) / 1_000_000
        self._last = (ts, at)
        return at

    def event(self, e: Entries, i: int, seq: int) -> Message:
        sid, coll, rid, action, lsn, ts = (self.sync_id, e.coll[i], e.rid[i], e.action[i],
                                           e.lsn[i], e.ts[i])  # fmt: skip
        key = event_key(sid, lsn, e.idx[i])
        payload = self.payloads.event(seq, coll, rid, action, key, lsn, ts, e.record[i],
                                      e.changes[i])  # fmt: skip
        group = self._prefix(coll) + record_token(rid)
        return Message(sid, self.provider, seq, coll, action, group, key, payload, self._at(ts))

    def record(self, v: Version) -> Message:
        sid = self.sync_id
        group = self._prefix(v.coll) + record_token(v.rid)
        key = record_key(group, v.version)
        payload = self.payloads.record(v.seq, v.coll, v.rid, key, v.version, v.ts, v.deleted,
                                       v.record)  # fmt: skip
        return Message(sid, self.provider, v.seq, v.coll, None, group, key, payload,
                       self._at(v.ts) if v.ts else 0.0)  # fmt: skip
