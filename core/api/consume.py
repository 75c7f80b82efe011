"""The Consume API's engine (DESIGN.md section 8): HTTP pull consumers over the stream store.

Each consumer has a queue in the store (``consumer_messages``): a filler task moves the
consumer's selection of each source's stream into it, behind a cursor like a connector's, and
workers receive, ack and nack rows of it. Payloads stay in the streams and are joined in when
a row is delivered. All state is in Postgres, so several workers, several Weir processes and
restarts share one view:

- a delivered row is invisible until ``not_visible_until`` (the visibility timeout); nack
  makes it visible at once, ack deletes it;
- only the lowest row of a group is deliverable, so a group's next message waits until the one
  before it is acknowledged;
- receives of one consumer are serialised by an advisory lock, which makes ``max_ack_pending``
  exact and the selection simple; a receive is one call of a SQL function
  (``consumer_receive``, core/store/migrations.py), so the lock is held only while the server
  works; ack and nack do not take it;
- a records-stream row whose version was superseded before delivery is dropped when it comes
  up: the newer version is queued behind it, and the records stream only serves the latest.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from psycopg import sql
from psycopg_pool import AsyncConnectionPool

from core.config.model import ConsumerConfig, UnknownSourceError, WeirConfig
from core.engine.filters import selection
from core.envelope import RECORD_TOKEN_SQL, Message
from core.store import Store
from core.store.reader import EVENTS_SELECT, RECORDS_SELECT, Notifier, StreamReader

log = logging.getLogger("weir.consume")

FILL_PAGE = 5000  # messages moved into a queue per store transaction
FILL_SPAN = 200_000  # seqs scanned per fill, so that narrow filters stay cheap
BUFFER = 50_000  # a queue's rows before its filler pauses (nothing unbounded)
POLL = 1.0  # seconds between fills when no commit notification arrives
WAKE = 0.25  # seconds between receive attempts while a receive long-polls
MAX_BATCH = 1000
MAX_WAIT_MS = 60_000
INFO_TTL = 1.0  # seconds an info count is reused
SWEEP_EVERY = 30.0  # seconds between sweeps of messages that used up max_deliver
_TOKEN = struct.Struct(">qi")  # row id, delivery number
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


class ApiError(Exception):
    """A request the API refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, reason: str, loc: tuple[str, ...] = ()) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.loc = loc  # where in the request, for 422s shaped like FastAPI's own


def encode_token(row_id: int, delivery: int) -> str:
    """An ack token names one delivery of one row: a stale token acks nothing."""
    return base64.urlsafe_b64encode(_TOKEN.pack(row_id, delivery)).decode().rstrip("=")


def decode_tokens(tokens: list[str], field_name: str) -> tuple[list[int], list[int]]:
    ids: list[int] = []
    deliveries: list[int] = []
    for i, token in enumerate(tokens):
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            row_id, delivery = _TOKEN.unpack(raw)
        except (ValueError, struct.error, UnicodeEncodeError):
            raise ApiError(
                400, f"{field_name}[{i}]: {token[:40]!r} is not a token this API issued"
            ) from None
        ids.append(row_id)
        deliveries.append(delivery)
    return ids, deliveries


@dataclass
class Delivery:
    """One message as received: the stream message and the row it was built from."""

    token: str
    message: Message
    record: str  # JSON text
    changes: str | None  # JSON text
    action: str  # insert | update | delete | truncate; records stream: upsert | delete
    record_id: str | None
    deleted: bool
    provider: str
    ts: str


@dataclass
class _Live:
    """A consumer this process serves: its config, filler and waiting receivers."""

    cfg: ConsumerConfig
    readers: dict[str, StreamReader]
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # receivers: rows to try
    fill: asyncio.Event = field(default_factory=asyncio.Event)  # filler: a source committed
    waiting: int = 0
    filler: asyncio.Task[None] | None = None
    info: tuple[float, dict[str, int]] = (0.0, {})


class Consumers:
    """Every HTTP pull consumer of the store, served by this process."""

    def __init__(self, cfg: WeirConfig, store: Store, pool: AsyncConnectionPool[Any]) -> None:
        self.cfg = cfg
        self.store = store
        self.pool = pool
        self.notifier = Notifier(store)
        self.live: dict[str, _Live] = {}
        self._serving = asyncio.Lock()
        self.sources = {str(s.sync_id): s for s in cfg.sources}
        t = store.table
        self._m = t("consumer_messages")
        self._consumers = t("consumers")
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

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Declare the YAML consumers, then serve every consumer the store holds."""
        async with self.pool.connection() as conn:
            for c in self.cfg.consumers:
                await conn.execute(
                    sql.SQL(
                        "INSERT INTO {} (name, stream, config, origin) VALUES (%s, %s, %s,"
                        " 'config') ON CONFLICT (name) DO UPDATE SET config = excluded.config,"
                        " origin = 'config' WHERE {}.stream = excluded.stream"
                    ).format(self._consumers, self._consumers),
                    (c.name, c.stream, c.model_dump_json()),
                )
            rows = await (
                await conn.execute(sql.SQL("SELECT name, config FROM {}").format(self._consumers))
            ).fetchall()
        for c in self.cfg.consumers:
            stored = next((r for r in rows if r[0] == c.name), None)
            if stored and ConsumerConfig.model_validate(stored[1]).stream != c.stream:
                raise ValueError(
                    f"consumer {c.name!r}: its stream cannot change from "
                    f"{stored[1]['stream']!r}; delete it or give it another name"
                )
        await self.notifier.start()
        for _, config in rows:
            await self._serve(ConsumerConfig.model_validate(config))

    async def stop(self) -> None:
        for live in list(self.live.values()):
            await self._unserve(live)
        self.live.clear()
        await self.notifier.stop()

    async def _serve(self, cfg: ConsumerConfig) -> _Live:
        """Serve a consumer here (once, also when requests for it race)."""
        async with self._serving:
            live = self.live.get(cfg.name)
            return live if live is not None else await self._start_serving(cfg)

    async def _start_serving(self, cfg: ConsumerConfig) -> _Live:
        where = selection(
            [cfg.filters.collection_id], None, [], [cfg.filters.resource_id], cfg.stream
        )
        readers = {}
        for src in self.cfg.sources_of(cfg):
            sid = str(src.sync_id)
            reader = StreamReader(
                self.store, f"consumer:{cfg.name}", cfg.stream, where, sid, src.provider
            )
            await reader.open()
            await reader.cursor("beginning" if cfg.deliver_policy == "all" else "end")
            readers[sid] = reader
        live = _Live(cfg, readers)
        self.live[cfg.name] = live
        group = _group_sql(cfg)
        live.filler = asyncio.create_task(self._fill(live, where, group), name=f"fill-{cfg.name}")
        for sid in readers:
            self.notifier.subscribe(sid, live.fill.set)
        return live

    async def _unserve(self, live: _Live) -> None:
        for sid in live.readers:
            self.notifier.unsubscribe(sid, live.fill.set)
        if live.filler is not None:
            live.filler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await live.filler
        for reader in live.readers.values():
            await reader.close()

    # -- management -----------------------------------------------------------------------

    async def create(self, cfg: ConsumerConfig) -> ConsumerConfig:
        try:
            self.cfg.sources_of(cfg)
        except UnknownSourceError as e:
            raise ApiError(422, str(e), loc=("body", "sources")) from None
        async with self.pool.connection() as conn:
            cur = await conn.execute(
                sql.SQL(
                    "INSERT INTO {} (name, stream, config, origin) VALUES (%s, %s, %s, 'api')"
                    " ON CONFLICT (name) DO NOTHING"
                ).format(self._consumers),
                (cfg.name, cfg.stream, cfg.model_dump_json()),
            )
            if cur.rowcount == 0:
                raise ApiError(409, f"a consumer named {cfg.name!r} exists")
        await self._serve(cfg)
        return cfg

    async def listing(self, name: str | None = None) -> list[tuple[ConsumerConfig, str]]:
        """(config, origin) of every consumer in the store, or of the one named."""
        async with self.pool.connection() as conn:
            rows = await (
                await conn.execute(
                    sql.SQL(
                        "SELECT config, origin FROM {} WHERE %(n)s::text IS NULL OR name = %(n)s"
                        " ORDER BY name"
                    ).format(self._consumers),
                    {"n": name},
                )
            ).fetchall()
        return [(ConsumerConfig.model_validate(r[0]), r[1]) for r in rows]

    async def get(self, name: str) -> _Live:
        """The consumer, served here from now on if another process created it."""
        live = self.live.get(name)
        if live is not None:
            return live
        async with self.pool.connection() as conn:
            row = await (
                await conn.execute(
                    sql.SQL("SELECT config FROM {} WHERE name = %s").format(self._consumers),
                    (name,),
                )
            ).fetchone()
        if row is None:
            raise ApiError(404, f"no consumer named {name!r}")
        return await self._serve(ConsumerConfig.model_validate(row[0]))

    async def delete(self, name: str) -> None:
        live = await self.get(name)
        if name in {c.name for c in self.cfg.consumers}:
            raise ApiError(
                409, f"consumer {name!r} is declared in the config file; remove it there"
            )
        await self._unserve(self.live.pop(name))
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute(
                sql.SQL("DELETE FROM {} WHERE consumer = %s").format(self._m), (name,)
            )
            for table in ("cursors", "failed_messages"):
                await conn.execute(
                    sql.SQL("DELETE FROM {} WHERE connector = %s").format(self.store.table(table)),
                    (f"consumer:{name}",),
                )
            await conn.execute(
                sql.SQL("DELETE FROM {} WHERE name = %s").format(self._consumers), (name,)
            )
        live.wake.set()

    # -- the queue ------------------------------------------------------------------------

    async def _fill(self, live: _Live, where: tuple[Any, list[Any]], group: sql.Composable) -> None:
        """Move the consumer's selection of each stream into its queue, for as long as served."""
        where_sql, where_params = where
        stream = self.store.table(live.cfg.stream)
        insert = sql.SQL(
            "WITH batch AS (SELECT seq, {group} AS group_key FROM {stream}"
            "  WHERE sync_id = %s AND seq > %s AND seq <= %s AND {where} ORDER BY seq LIMIT %s),"
            " ins AS (INSERT INTO {m} (consumer, sync_id, seq, group_key)"
            "  SELECT %s, %s, seq, group_key FROM batch ORDER BY seq)"
            " SELECT count(*), max(seq) FROM batch"
        ).format(group=group, stream=stream, where=where_sql, m=self._m)
        lock_cursor = sql.SQL(
            "SELECT seq FROM {} WHERE connector = %s AND sync_id = %s FOR UPDATE"
        ).format(self.store.table("cursors"))
        buffered = sql.SQL(
            "SELECT count(*) FROM (SELECT 1 FROM {} WHERE consumer = %s LIMIT %s) q"
        ).format(self._m)
        name = live.cfg.name
        failing = False
        while True:
            moved = 0
            try:
                for sid, reader in live.readers.items():
                    conn = reader.conn
                    row = await (await conn.execute(buffered, (name, BUFFER))).fetchone()
                    if row is None or row[0] >= BUFFER:
                        break
                    head = await reader.head()
                    async with conn.transaction():
                        row = await (
                            await conn.execute(lock_cursor, (reader.connector, sid))
                        ).fetchone()
                        after = int(row[0]) if row else head
                        if after >= head:
                            continue
                        upto = min(head, after + FILL_SPAN)
                        params = (sid, after, upto, *where_params, FILL_PAGE, name, sid)
                        got = await (await conn.execute(insert, params)).fetchone()
                        count, last = (int(got[0]), got[1]) if got else (0, upto)
                        await reader.save(upto if count < FILL_PAGE else int(last), {})
                    moved += count
            except Exception as e:  # the store went away: try again
                if not failing:
                    log.warning("consumer %s: filling its queue failed: %s", name, e)
                failing = True
                await asyncio.sleep(POLL)
                with contextlib.suppress(Exception):
                    for reader in live.readers.values():
                        if reader.conn.closed:
                            await reader.open()
                continue
            if failing:
                log.info("consumer %s: filling its queue again", name)
                failing = False
            if moved:
                live.wake.set()
                continue
            live.fill.clear()  # a full queue is looked at again after POLL
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(live.fill.wait(), POLL)

    async def receive(self, name: str, batch_size: int, wait_for: int) -> list[Delivery]:
        """Up to ``batch_size`` messages, waiting up to ``wait_for`` ms for the first."""
        if not 1 <= batch_size <= MAX_BATCH:
            raise ApiError(400, f"batch_size must be between 1 and {MAX_BATCH}")
        if not 0 <= wait_for <= MAX_WAIT_MS:
            raise ApiError(400, f"wait_for must be between 0 and {MAX_WAIT_MS} (ms)")
        live = await self.get(name)
        if live.waiting >= live.cfg.max_waiting:
            raise ApiError(
                429, f"consumer {name!r} has {live.waiting} receive calls waiting (max_waiting)"
            )
        live.waiting += 1
        try:
            deadline = time.monotonic() + wait_for / 1000
            while True:
                live.wake.clear()  # set again by anything that may make a message deliverable
                got = await self._receive_once(live, batch_size)
                left = deadline - time.monotonic()
                if got or left <= 0 or self.live.get(name) is not live:
                    return got
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(live.wake.wait(), min(left, WAKE))
        finally:
            live.waiting -= 1

    async def _receive_once(self, live: _Live, batch_size: int) -> list[Delivery]:
        cfg = live.cfg
        params = (cfg.name, batch_size, cfg.max_ack_pending, cfg.ack_wait_ms, cfg.max_deliver)
        async with self.pool.connection() as conn:
            rows, built = await self._queued(live, conn, self._receive[cfg.stream], params)
            if not rows:
                return []
            await self._bury(live, conn, rows, built)
        out = []
        for row_id, _, _, count, is_dead in rows:
            got = built.get(row_id)
            if got is not None and not is_dead:
                got.token = encode_token(row_id, count + 1)
                out.append(got)
        return out

    async def _queued(
        self, live: _Live, conn: Any, q: sql.Composed, params: tuple[Any, ...]
    ) -> tuple[list[Any], dict[int, Delivery]]:
        """The queue rows of ``q`` (``_with_messages``), and their messages by row id (absent:
        superseded or pruned)."""
        events = live.cfg.stream == "events"
        rows = []
        out: dict[int, Delivery] = {}
        for row_id, sid, seq, count, dead, *r in await (await conn.execute(q, params)).fetchall():
            rows.append((row_id, sid, seq, count, dead))
            reader = live.readers.get(str(sid))
            if r[0] is None or reader is None:  # gone, or a source no longer in the config
                continue
            provider = reader.provider
            if events:
                _, _, rid, action, _, _, ts, record, changes, _ = r
                out[row_id] = Delivery("", reader.event(r), record or "null", changes, action,
                                       rid, action == "delete", provider, ts)  # fmt: skip
            else:
                _, _, rid, _, deleted, ts, record, _ = r
                action = "delete" if deleted else "upsert"
                out[row_id] = Delivery("", reader.record(r), record, None, action, rid, deleted,
                                       provider, ts)  # fmt: skip
        return rows, out

    async def _bury(
        self, live: _Live, conn: Any, rows: list[Any], built: dict[int, Delivery]
    ) -> None:
        """Delete the rows that are done for: those flagged dead (moved to the failed list
        first) and those whose stream message is gone (superseded or pruned).
        """
        gone = [r[0] for r in rows if r[0] not in built]
        dead = [(r, built[r[0]]) for r in rows if r[4] and r[0] in built]
        if not dead and not gone:
            return
        async with conn.transaction():
            await self._fail(live, conn, dead)
            ids = gone + [r[0] for r, _ in dead]
            await conn.execute(
                sql.SQL("DELETE FROM {m} WHERE " + _ROWS).format(m=self._m),
                (ids, [None] * len(ids), live.cfg.name),
            )

    async def sweep(self) -> int:
        """Move messages delivered ``max_deliver`` times whose visibility ran out to the failed
        list, also when no worker asks for more (scheduled every ``SWEEP_EVERY``).
        """
        moved = 0
        for live in list(self.live.values()):
            if live.cfg.max_deliver <= 0:
                continue
            async with self.pool.connection() as conn:
                params = (live.cfg.name, live.cfg.max_deliver, MAX_BATCH)
                rows, built = await self._queued(live, conn, self._dead[live.cfg.stream], params)
                if rows:
                    await self._bury(live, conn, rows, built)
                    moved += len(rows)
        return moved

    async def _fail(self, live: _Live, conn: Any, dead: list[tuple[Any, Delivery]]) -> None:
        cfg = live.cfg
        for (_, sid, _, count, _), d in dead:
            msg = d.message
            await conn.execute(
                sql.SQL(
                    "INSERT INTO {} (connector, sync_id, stream, seq, group_key, idempotency_key,"
                    " attempts, error, payload) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
                    " ON CONFLICT (connector, sync_id, seq) DO NOTHING"
                ).format(self.store.table("failed_messages")),
                (f"consumer:{cfg.name}", sid, cfg.stream, msg.seq, msg.group, msg.key, count,
                 f"not acknowledged after {count} deliveries (max_deliver)",
                 msg.payload.decode()),
            )  # fmt: skip
            log.warning(
                "consumer %s: message %s moved to the failed list after %d deliveries",
                cfg.name, msg.key, count,
            )  # fmt: skip

    async def settle(self, name: str, tokens: list[str], ack: bool, field_name: str) -> int:
        """Ack (delete) or nack (make visible now) deliveries; returns how many matched.

        A token of an earlier delivery of a message that was redelivered since matches nothing.
        """
        live = await self.get(name)
        ids, deliveries = decode_tokens(tokens, field_name)
        q = (
            sql.SQL("DELETE FROM {m} WHERE " + _ROWS)
            if ack
            else sql.SQL(
                "UPDATE {m} SET not_visible_until = now() WHERE "
                + _ROWS
                + " AND not_visible_until > now()"
            )
        )
        async with self.pool.connection() as conn:
            cur = await conn.execute(q.format(m=self._m), (ids, deliveries, name))
        live.wake.set()
        return int(cur.rowcount)

    async def info(self, name: str) -> dict[str, int]:
        """``num_pending`` (queued, visible) and ``num_ack_pending`` (delivered, not acked),
        counted at most once a second.
        """
        live = await self.get(name)
        at, counts = live.info
        if time.monotonic() - at < INFO_TTL:
            return counts
        async with self.pool.connection() as conn:
            row = await (
                await conn.execute(
                    sql.SQL("SELECT " + QUEUE_COUNTS + " FROM {} m WHERE m.consumer = %s").format(
                        self._m
                    ),
                    (name,),
                )
            ).fetchone()
        counts = {"num_pending": int(row[0]), "num_ack_pending": int(row[1])} if row else {}
        live.info = (time.monotonic(), counts)
        return counts

    async def failed(self, name: str, limit: int) -> list[dict[str, Any]]:
        await self.get(name)
        async with self.pool.connection() as conn:
            rows = await (
                await conn.execute(
                    sql.SQL(
                        "SELECT seq, idempotency_key, attempts, error, payload,"
                        " failed_at FROM {} WHERE connector = %s ORDER BY failed_at, seq LIMIT %s"
                    ).format(self.store.table("failed_messages")),
                    (f"consumer:{name}", limit),
                )
            ).fetchall()
        return [
            {"seq": r[0], "idempotency_key": r[1], "deliveries": r[2], "error": r[3],
             "message": orjson.loads(r[4]), "failed_at": r[5].isoformat()}
            for r in rows
        ]  # fmt: skip


def _group_sql(cfg: ConsumerConfig) -> sql.Composable:
    """The group key of a stream row: its record, or the values of ``group_columns``; its last
    part short, as record_token makes it, so that it fits the queue's index."""
    if cfg.group_columns is None:
        last: sql.Composable = sql.SQL("coalesce(record_id, '')")
    else:
        values = sql.SQL(", ").join(
            sql.SQL("record -> {}").format(sql.Literal(c)) for c in cfg.group_columns
        )
        last = sql.SQL("jsonb_build_array({})::text").format(values)
    token = sql.SQL(RECORD_TOKEN_SQL).format(c=last)
    return sql.SQL("sync_id::text || '.' || collection_id || '.' || {}").format(token)
