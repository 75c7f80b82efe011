"""HTTP pull consumers in the store (docs/consume-api.md “Consume API”): their declarations
(``consumers``), their queues (``consumer_messages``) and what filling, a receive, an ack, a nack or
a sweep does to those. Called by the consume engine (core/api/consume.py), which decides when.

A queue holds references to stream messages and their delivery state; payloads stay in the
streams and are read from them when a row is delivered. A queue is filled from each source's
stream behind a cursor like a connector's, named by :func:`consumer_key`. The receive rule
itself is the SQL function ``consumer_receive`` (core/store/functions.py). A failure of the
store raises ``psycopg.Error`` to the caller.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from core.config.model import ConsumerConfig
from core.config.steps import STORED
from core.envelope import MAX_RECORD_TOKEN, Message
from core.store import AConn, Store, array
from core.store import failed as failed_list
from core.store.reader import StreamReader
from core.store.selection import jsonb_text, parse
from core.store.streams import present

FILL_PAGE = 5000  # messages moved into a queue per store transaction
FILL_SPAN = 200_000  # seqs scanned per fill, so that narrow filters stay cheap
BUFFER = 50_000  # a queue's rows before its filler pauses (nothing unbounded)

# Queue rows by (id, delivery number; null: any), each found by a primary-key probe. With
# ``id = ANY(...)`` or a join, the planner may read the consumer's whole queue for every ack
# when the queue's statistics are stale (a fast-changing queue's often are). Params: ids,
# delivery numbers, consumer.
_ROWS = (
    "ctid = ANY(ARRAY(SELECT q.ctid FROM unnest(%s::int8[], %s::int4[]) AS t(id, n),"
    " LATERAL (SELECT ctid FROM {m} WHERE consumer = %s AND id = t.id"
    " AND (t.n IS NULL OR deliver_count = t.n) LIMIT 1) q))"
)
# A queue's (waiting, outstanding) rows, over ``consumer_messages m``. Outstanding: delivered
# and neither acked nor nacked, also when its visibility ran out (what max_ack_pending caps);
# waiting: the others, never delivered or nacked.
QUEUE_COUNTS = (
    "count(m.id) FILTER (WHERE NOT m.outstanding), count(m.id) FILTER (WHERE m.outstanding)"
)
ROUNDS = 4  # receives in one call, while rows whose stream message is gone were buried


CONSUMER_PREFIX = "consumer:"


def consumer_key(name: str) -> str:
    """What names an HTTP pull consumer's cursors and failed list, beside the connectors'."""
    return CONSUMER_PREFIX + name


QueueGroup = Callable[[str, str | None, Any], str]  # collection, record id, record JSON or dict


def queue_group(sync_id: str, columns: list[str] | None) -> QueueGroup:
    """A consumer queue's group key of a message, from its collection, record id and record:
    ``{sync_id}.{collection}.{token}``, the token that of the record id, or with
    ``group_columns``, of ``jsonb_build_array`` of those fields as Postgres writes it (stored
    queues hold keys spelled so). Unlike the group key it leaves out the provider and does not
    encode the collection: it only orders one consumer's queue, no subject shows it."""

    def token(text: str) -> str:
        raw = text.encode()
        if len(raw) <= MAX_RECORD_TOKEN:
            return text
        return "~" + hashlib.sha256(raw).hexdigest()

    if columns is None:
        return lambda coll, rid, record: f"{sync_id}.{coll}.{token(rid or '')}"

    def by_columns(coll: str, rid: str | None, record: Any) -> str:
        fields = parse(record) if isinstance(record, bytes) else record
        if not isinstance(fields, dict):
            fields = {}
        values = ", ".join(jsonb_text(fields[c]) if c in fields else "null" for c in columns)
        return f"{sync_id}.{coll}.{token(f'[{values}]')}"

    return by_columns


@dataclass
class Delivery:
    """One message of a queue as received: the stream message and the row it was built from."""

    row_id: int
    deliveries: int  # of the row, this one included
    message: Message
    record: str  # JSON text
    changes: str | None  # JSON text
    action: str  # insert | update | delete | truncate; records stream: upsert | delete
    record_id: str | None
    deleted: bool
    provider: str
    ts: str
    token: str = ""  # the ack token, set by the consume engine


class Filler:
    """Moves one consumer's selection of each source's stream into its queue, a page at a time
    (the consumer's filler task, core/api/consume.py)."""

    def __init__(self, store: Store, cfg: ConsumerConfig) -> None:
        self.name = cfg.name
        self.columns = cfg.group_columns
        m = store.table("consumer_messages")
        self._insert = sql.SQL(
            "INSERT INTO {} (consumer, sync_id, seq, group_key) SELECT %s, %s, s, g"
            " FROM unnest(%s::int8[], %s::text[]) AS u(s, g) ORDER BY s"
        ).format(m)
        self._lock_cursor = sql.SQL(
            "SELECT seq FROM {} WHERE connector = %s AND sync_id = %s FOR UPDATE"
        ).format(store.table("cursors"))
        self._buffered = sql.SQL(
            "SELECT count(*) FROM (SELECT 1 FROM {} WHERE consumer = %s LIMIT %s) q"
        ).format(m)

    async def step(self, reader: StreamReader) -> int | None:
        """Move the next page of ``reader``'s stream into the queue and its cursor past it, in
        one transaction; returns how many messages moved, or None when the queue holds
        ``BUFFER`` rows already."""
        conn, sid = reader.conn, reader.sync_id
        row = await (await conn.execute(self._buffered, (self.name, BUFFER))).fetchone()
        if row is None or row[0] >= BUFFER:
            return None
        head = await reader.head()
        group = queue_group(sid, self.columns)
        async with conn.transaction():
            row = await (await conn.execute(self._lock_cursor, (reader.connector, sid))).fetchone()
            after = int(row[0]) if row else head
            if after >= head:
                return 0
            upto = min(head, after + FILL_SPAN)
            taken = await reader.entries(after, upto, FILL_PAGE)
            if taken:
                keys = [group(coll, rid, record) for _, coll, rid, record in taken]
                seqs = array(t[0] for t in taken)
                await conn.execute(self._insert, (self.name, sid, seqs, array(keys)))
            await reader.save(upto if len(taken) < FILL_PAGE else taken[-1][0], {})
        return len(taken)


def stored_consumers(store: Store) -> list[ConsumerConfig]:
    """Every consumer the store holds: the config file's as ``weir run`` last declared them,
    and those made over the API."""
    with store.connect() as conn:
        q = sql.SQL("SELECT config FROM {} ORDER BY name").format(store.table("consumers"))
        rows = conn.execute(q).fetchall()
    return [ConsumerConfig.model_validate(r[0], context=STORED) for r in rows]


class Queues:
    """Every consumer's declaration and queue, over the API's connection pool."""

    def __init__(self, store: Store, pool: AsyncConnectionPool[Any]) -> None:
        self.store = store
        self.pool = pool
        self._m = store.table("consumer_messages")
        self._consumers = store.table("consumers")
        receive = sql.SQL("SELECT * FROM {}.consumer_receive(%s, %s, %s, %s, %s)").format(
            sql.Identifier(store.schema)
        )
        dead = sql.SQL(
            "SELECT id, sync_id, seq, deliver_count, true FROM {} WHERE consumer = %s"
            " AND deliver_count >= %s AND not_visible_until <= now() ORDER BY id LIMIT %s"
        ).format(self._m)
        self._receive = receive  # queue rows: (id, sync_id, seq, deliver_count, dead)
        self._dead = dead
        self._delete = sql.SQL("DELETE FROM {m} WHERE " + _ROWS + " RETURNING id").format(m=self._m)
        # Outstanding rows visible again at once: a nack, or (``deliver_count`` back) an undone
        # delivery no worker saw.
        again = "UPDATE {m} SET not_visible_until = now(), outstanding = false{more} WHERE "
        self._nack, self._unreceive = (
            sql.SQL(again.format(m="{m}", more=more) + _ROWS + " AND outstanding").format(m=self._m)
            for more in ("", ", deliver_count = deliver_count - 1")
        )
        # The visibility timeout from now, of rows still in the delivery given (steps ran).
        self._restamp = sql.SQL(
            "UPDATE {m} SET not_visible_until = now() + make_interval(secs => %s / 1000.0)"
            " WHERE " + _ROWS + " AND outstanding RETURNING id"
        ).format(m=self._m)
        self._gone = {s: self._purge(s) for s in ("events", "records")}
        self._counts = sql.SQL(
            "SELECT " + QUEUE_COUNTS + " FROM {} m WHERE m.consumer = %s"
        ).format(self._m)

    def _purge(self, stream: str) -> sql.Composed:
        """Delete queue rows (by id, of a consumer) whose message could not be built, with the
        rows behind each in its group that are not outstanding and whose stream message is
        gone: a record updated many times before delivery leaves one superseded row per
        version, and all go at once, so that a receive finds the latest next. Each group is
        walked by its index (params: ids, consumer, consumer)."""
        return sql.SQL(
            "DELETE FROM {m} WHERE ctid = ANY(ARRAY(SELECT o.ctid FROM unnest(%s::int8[]) g(id),"
            " LATERAL (SELECT group_key FROM {m} WHERE consumer = %s AND id = g.id) k,"
            " LATERAL (SELECT ctid FROM {m} o WHERE o.consumer = %s AND o.group_key = k.group_key"
            "  AND o.id >= g.id AND (o.id = g.id OR NOT o.outstanding AND NOT {present})) o))"
        ).format(m=self._m, present=present(self.store, stream, "o"))

    # -- declarations -----------------------------------------------------------------------

    async def declare(self, configs: list[ConsumerConfig]) -> dict[str, ConsumerConfig]:
        """Store the config file's consumers (a stored one keeps its stream: the caller checks)
        and return every consumer of the store by name; called on startup."""
        async with self.pool.connection() as conn:
            for c in configs:
                await conn.execute(
                    sql.SQL(
                        "INSERT INTO {} (name, stream, config, origin) VALUES (%s, %s, %s,"
                        " 'config') ON CONFLICT (name) DO UPDATE SET config = excluded.config,"
                        " origin = 'config' WHERE {}.stream = excluded.stream"
                    ).format(self._consumers, self._consumers),
                    (c.name, c.stream, c.model_dump_json()),
                )
            cur = await conn.execute(sql.SQL("SELECT name, config FROM {}").format(self._consumers))
            rows = await cur.fetchall()
        return {r[0]: ConsumerConfig.model_validate(r[1], context=STORED) for r in rows}

    async def create(self, cfg: ConsumerConfig) -> bool:
        """Store a consumer made over the API; False when one of that name exists."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                sql.SQL(
                    "INSERT INTO {} (name, stream, config, origin) VALUES (%s, %s, %s, 'api')"
                    " ON CONFLICT (name) DO NOTHING"
                ).format(self._consumers),
                (cfg.name, cfg.stream, cfg.model_dump_json()),
            )
        return int(cur.rowcount) > 0

    async def listing(self, name: str | None = None) -> list[tuple[ConsumerConfig, str]]:
        """(config, origin) of every consumer in the store, or of the one named."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                sql.SQL(
                    "SELECT config, origin FROM {} WHERE %(n)s::text IS NULL OR name = %(n)s"
                    " ORDER BY name"
                ).format(self._consumers),
                {"n": name},
            )
            rows = await cur.fetchall()
        return [(ConsumerConfig.model_validate(r[0], context=STORED), r[1]) for r in rows]

    async def delete(self, name: str) -> None:
        """Delete a consumer with its queue, cursors and failed list, in one transaction."""
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute(
                sql.SQL("DELETE FROM {} WHERE consumer = %s").format(self._m), (name,)
            )
            for table in ("cursors", "failed_messages"):
                await conn.execute(
                    sql.SQL("DELETE FROM {} WHERE connector = %s").format(self.store.table(table)),
                    (consumer_key(name),),
                )
            await conn.execute(
                sql.SQL("DELETE FROM {} WHERE name = %s").format(self._consumers), (name,)
            )

    # -- the queue --------------------------------------------------------------------------

    async def receive(
        self, cfg: ConsumerConfig, readers: dict[str, StreamReader], n: int, hide_ms: int
    ) -> tuple[list[Delivery], list[Delivery]]:
        """Up to ``n`` messages by ``consumer_receive``, each hidden from other receives for
        ``hide_ms``: (those delivered, those moved to the failed list instead, having used up
        ``max_deliver``).

        Rows buried on the way (moved to the failed list, or their stream message gone: a
        superseded version, a pruned event) may hold back the next row of their group, which
        is deliverable now: while some were buried and fewer than ``n`` came, it receives
        again (``ROUNDS`` in all), so that a message ready is not left to a later call.
        """
        out: list[Delivery] = []
        dead: list[Delivery] = []
        async with self.pool.connection() as conn:
            for _ in range(ROUNDS):
                params = (cfg.name, n - len(out), cfg.max_ack_pending, hide_ms, cfg.max_deliver)
                rows, built = await self._queued(conn, readers, self._receive, params)
                buried = await self._bury(conn, cfg, rows, built)
                dead += buried
                for row_id, _, _, count, is_dead in rows:
                    got = built.get(row_id)
                    if got is not None and not is_dead:
                        got.deliveries = count + 1
                        out.append(got)
                if len(out) >= n or (not buried and len(rows) == len(built)):
                    break
        return out, dead

    async def sweep(
        self, cfg: ConsumerConfig, readers: dict[str, StreamReader], limit: int
    ) -> tuple[int, list[Delivery]]:
        """Take up to ``limit`` rows that used up ``max_deliver`` and whose visibility ran out
        out of the queue: (how many, those moved to the failed list)."""
        params = (cfg.name, cfg.max_deliver, limit)
        async with self.pool.connection() as conn:
            rows, built = await self._queued(conn, readers, self._dead, params)
            dead = await self._bury(conn, cfg, rows, built) if rows else []
        return len(rows), dead

    async def _queued(
        self, conn: AConn, readers: dict[str, StreamReader], q: sql.Composed, params: Any
    ) -> tuple[list[Any], dict[int, Delivery]]:
        """The queue rows of ``q``, and their messages by row id (absent: superseded, pruned,
        or of a source no longer in the config)."""
        rows = [tuple(r) for r in await (await conn.execute(q, params)).fetchall()]
        by_source: dict[str, list[int]] = {}
        for _, sid, seq, _, _ in rows:
            by_source.setdefault(str(sid), []).append(seq)
        found = {sid: await readers[sid].at(seqs) for sid, seqs in by_source.items()
                 if sid in readers}  # fmt: skip
        out: dict[int, Delivery] = {}
        for row_id, sid, seq, count, _ in rows:
            f = found.get(str(sid), {}).get(seq)
            if f is not None:
                out[row_id] = Delivery(row_id, count, f.message, f.record.decode(),
                                       None if f.changes is None else f.changes.decode(),
                                       f.action, f.record_id, f.deleted,
                                       readers[str(sid)].provider, f.ts)  # fmt: skip
        return rows, out

    async def _bury(
        self, conn: AConn, cfg: ConsumerConfig, rows: list[Any], built: dict[int, Delivery]
    ) -> list[Delivery]:
        """Delete the rows that are done for: those flagged dead (moved to the failed list
        first, in the same transaction) and those whose stream message is gone. Returns the
        dead ones."""
        gone = [r[0] for r in rows if r[0] not in built]
        dead = [built[r[0]] for r in rows if r[4] and r[0] in built]
        if not dead and not gone:
            return []
        async with conn.transaction():
            await self._fail(conn, cfg, [
                (d, f"not acknowledged after {d.deliveries} deliveries (max_deliver)")
                for d in dead])  # fmt: skip
            if gone:
                await conn.execute(self._gone[cfg.stream], (gone, cfg.name, cfg.name))
        return dead

    async def _fail(
        self, conn: AConn, cfg: ConsumerConfig, why: list[tuple[Delivery, str]], *,
        delivered: bool = False,
    ) -> None:  # fmt: skip
        """Move deliveries to the consumer's failed list, each with why, out of its queue;
        ``delivered``: only those whose row is still in that delivery (steps that outran it
        failed a message another worker had acked: found by an outside tryout)."""
        if why:
            ids = [d.row_id for d, _ in why]
            counts = [d.deliveries if delivered else None for d, _ in why]
            cur = await conn.execute(self._delete, (ids, counts, cfg.name))
            gone = {int(r[0]) for r in await cur.fetchall()}
            entries = [(d.message, d.deliveries, reason) for d, reason in why if d.row_id in gone]
            if entries:
                await failed_list.put(self.store, conn, consumer_key(cfg.name), cfg.stream,
                                      entries)  # fmt: skip

    async def finish(
        self, cfg: ConsumerConfig, dropped: list[Delivery], failed: list[tuple[Delivery, str]]
    ) -> None:
        """Take received deliveries out of the queue that no worker gets: those its steps
        dropped (done with, as if acked) and those they failed (to the failed list, with why)."""
        async with self.pool.connection() as conn, conn.transaction():
            await self._fail(conn, cfg, failed, delivered=True)
            if dropped:
                ids, counts = [d.row_id for d in dropped], [d.deliveries for d in dropped]
                await conn.execute(self._delete, (ids, counts, cfg.name))

    async def settle(self, name: str, ids: list[int], deliveries: list[int], ack: bool) -> int:
        """Ack (delete) or nack (make visible now, no longer outstanding) the rows of these
        deliveries; returns how many matched (a row delivered again since matches no earlier
        delivery, a nacked one no second nack)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(self._delete if ack else self._nack, (ids, deliveries, name))
        return int(cur.rowcount)

    async def restamp(self, cfg: ConsumerConfig, ids: list[int], deliveries: list[int]) -> set[int]:
        """Start these deliveries' ``ack_wait_ms`` now (the consumer's steps made them
        meanwhile); returns the rows still in them (not acked, nacked or delivered again)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(self._restamp, (cfg.ack_wait_ms, ids, deliveries, cfg.name))
            return {int(r[0]) for r in await cur.fetchall()}

    async def unreceive(self, name: str, ids: list[int], deliveries: list[int]) -> None:
        """Undo these deliveries: visible again at once, not counted toward ``max_deliver``
        (no worker saw them: the consumer's steps could not make them yet)."""
        async with self.pool.connection() as conn:
            await conn.execute(self._unreceive, (ids, deliveries, name))

    async def counts(self, name: str) -> tuple[int, int]:
        """(rows waiting, rows outstanding) of a consumer's queue (``QUEUE_COUNTS``)."""
        async with self.pool.connection() as conn:
            row = await (await conn.execute(self._counts, (name,))).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)
