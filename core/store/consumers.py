"""HTTP pull consumers in the store (DESIGN.md section 8): their declarations (``consumers``),
their queues (``consumer_messages``) and what filling, a receive, an ack, a nack or a sweep does
to those. Called by the consume engine (core/api/consume.py), which decides when.

A queue holds references to stream messages and their delivery state; payloads stay in the
streams and are joined in when a row is delivered. A queue is filled from each source's stream
behind a cursor like a connector's, named by :func:`consumer_key`. The receive rule itself is
the SQL function ``consumer_receive`` (core/store/functions.py). A failure of the store raises
``psycopg.Error`` to the caller.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from core.config.model import ConsumerConfig
from core.envelope import Message, queue_group_key_sql
from core.store import AConn, Store
from core.store import failed as failed_list
from core.store.reader import EVENTS_SELECT, RECORDS_SELECT, StreamReader

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
# A queue's (visible, delivered and not acked) rows, over ``consumer_messages m``.
QUEUE_COUNTS = (
    "count(m.id) FILTER (WHERE m.not_visible_until <= now()),"
    " count(m.id) FILTER (WHERE m.not_visible_until > now())"
)


CONSUMER_PREFIX = "consumer:"


def consumer_key(name: str) -> str:
    """What names an HTTP pull consumer's cursors and failed list, beside the connectors'."""
    return CONSUMER_PREFIX + name


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

    def __init__(self, store: Store, cfg: ConsumerConfig, where: tuple[Any, list[Any]]) -> None:
        """``where`` is the consumer's :func:`core.store.selection.selection`."""
        self.name = cfg.name
        where_sql, self._where_params = where
        m = store.table("consumer_messages")
        columns = cfg.group_columns
        group = sql.SQL(queue_group_key_sql(columns)).format(*map(sql.Literal, columns or []))
        self._insert = sql.SQL(
            "WITH batch AS (SELECT seq, {group} AS group_key FROM {stream}"
            "  WHERE sync_id = %s AND seq > %s AND seq <= %s AND {where} ORDER BY seq LIMIT %s),"
            " ins AS (INSERT INTO {m} (consumer, sync_id, seq, group_key)"
            "  SELECT %s, %s, seq, group_key FROM batch ORDER BY seq)"
            " SELECT count(*), max(seq) FROM batch"
        ).format(group=group, stream=store.table(cfg.stream), where=where_sql, m=m)
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
        async with conn.transaction():
            row = await (await conn.execute(self._lock_cursor, (reader.connector, sid))).fetchone()
            after = int(row[0]) if row else head
            if after >= head:
                return 0
            upto = min(head, after + FILL_SPAN)
            params = (sid, after, upto, *self._where_params, FILL_PAGE, self.name, sid)
            got = await (await conn.execute(self._insert, params)).fetchone()
            count, last = (int(got[0]), got[1]) if got else (0, upto)
            await reader.save(upto if count < FILL_PAGE else int(last), {})
        return count


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
        # By stream: queue rows (a receive, or the rows past max_deliver) with their messages.
        self._receive = {s: self._with_messages(s, receive) for s in ("events", "records")}
        self._dead = {s: self._with_messages(s, dead) for s in ("events", "records")}
        self._delete = sql.SQL("DELETE FROM {m} WHERE " + _ROWS).format(m=self._m)
        self._nack = sql.SQL(
            "UPDATE {m} SET not_visible_until = now() WHERE " + _ROWS
            + " AND not_visible_until > now()"
        ).format(m=self._m)  # fmt: skip
        self._counts = sql.SQL(
            "SELECT " + QUEUE_COUNTS + " FROM {} m WHERE m.consumer = %s"
        ).format(self._m)

    def _with_messages(self, stream: str, rows: sql.Composable) -> sql.Composed:
        """Queue rows ``(id, sync_id, seq, deliver_count, dead)`` chosen by ``rows``, each with
        its stream row (nulls when superseded or pruned), in id order.

        Each stream row is found by an index probe (LATERAL ... LIMIT 1): with
        ``seq = ANY(...)`` the planner may read every row of the source instead, when its
        statistics are stale.
        """
        return sql.SQL(
            "SELECT q.*, m.* FROM ({rows}) AS q(id, sync_id, seq, deliver_count, dead)"
            " LEFT JOIN LATERAL (" + (EVENTS_SELECT if stream == "events" else RECORDS_SELECT)
            + " WHERE sync_id = q.sync_id AND seq = q.seq LIMIT 1) m ON true ORDER BY q.id"
        ).format(rows=rows, table=self.store.table(stream))  # fmt: skip

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
        return {r[0]: ConsumerConfig.model_validate(r[1]) for r in rows}

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
        return [(ConsumerConfig.model_validate(r[0]), r[1]) for r in rows]

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
        self, cfg: ConsumerConfig, readers: dict[str, StreamReader], n: int
    ) -> tuple[list[Delivery], list[Delivery]]:
        """One receive (``consumer_receive``) of up to ``n`` messages: (those delivered, those
        moved to the failed list instead, having used up ``max_deliver``)."""
        params = (cfg.name, n, cfg.max_ack_pending, cfg.ack_wait_ms, cfg.max_deliver)
        async with self.pool.connection() as conn:
            rows, built = await self._queued(conn, readers, self._receive[cfg.stream], params)
            if not rows:
                return [], []
            dead = await self._bury(conn, cfg, rows, built)
        out = []
        for row_id, _, _, count, is_dead in rows:
            got = built.get(row_id)
            if got is not None and not is_dead:
                got.deliveries = count + 1
                out.append(got)
        return out, dead

    async def sweep(
        self, cfg: ConsumerConfig, readers: dict[str, StreamReader], limit: int
    ) -> tuple[int, list[Delivery]]:
        """Take up to ``limit`` rows that used up ``max_deliver`` and whose visibility ran out
        out of the queue: (how many, those moved to the failed list)."""
        params = (cfg.name, cfg.max_deliver, limit)
        async with self.pool.connection() as conn:
            rows, built = await self._queued(conn, readers, self._dead[cfg.stream], params)
            dead = await self._bury(conn, cfg, rows, built) if rows else []
        return len(rows), dead

    async def _queued(
        self, conn: AConn, readers: dict[str, StreamReader], q: sql.Composed, params: Any
    ) -> tuple[list[Any], dict[int, Delivery]]:
        """The queue rows of ``q`` (``_with_messages``), and their messages by row id (absent:
        superseded, pruned, or of a source no longer in the config)."""
        rows = []
        out: dict[int, Delivery] = {}
        for row_id, sid, seq, count, dead, *r in await (await conn.execute(q, params)).fetchall():
            rows.append((row_id, sid, seq, count, dead))
            reader = readers.get(str(sid))
            if r[0] is None or reader is None:
                continue
            provider = reader.provider
            if reader.stream == "events":
                _, _, rid, action, _, _, ts, record, changes, _ = r
                out[row_id] = Delivery(row_id, count, reader.event(r), record or "null", changes,
                                       action, rid, action == "delete", provider, ts)  # fmt: skip
            else:
                _, _, rid, _, deleted, ts, record, _ = r
                action = "delete" if deleted else "upsert"
                out[row_id] = Delivery(row_id, count, reader.record(r), record, None, action,
                                       rid, deleted, provider, ts)  # fmt: skip
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
            if dead:
                entries = [(d.message, d.deliveries,
                            f"not acknowledged after {d.deliveries} deliveries (max_deliver)")
                           for d in dead]  # fmt: skip
                await failed_list.put(self.store, conn, consumer_key(cfg.name), cfg.stream, entries)
            ids = gone + [d.row_id for d in dead]
            await conn.execute(self._delete, (ids, [None] * len(ids), cfg.name))
        return dead

    async def settle(self, name: str, ids: list[int], deliveries: list[int], ack: bool) -> int:
        """Ack (delete) or nack (make visible now) the rows of these deliveries; returns how
        many matched (a row delivered again since matches no earlier delivery)."""
        async with self.pool.connection() as conn:
            cur = await conn.execute(self._delete if ack else self._nack, (ids, deliveries, name))
        return int(cur.rowcount)

    async def counts(self, name: str) -> tuple[int, int]:
        """(rows queued and visible, rows delivered and not acked) of a consumer's queue."""
        async with self.pool.connection() as conn:
            row = await (await conn.execute(self._counts, (name,))).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)
