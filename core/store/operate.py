"""What an operator does to the store (docs/operations.md “Management API and CLI”): page through a
failed list, show one entry, ask for retries, discard, pause and resume a connector. The one place
these are done, for the management API (core/api/manage.py) and the CLI (core/cli_operate.py) alike.

A failed list is named like a cursor: a connector's name, or ``consumer:NAME`` for an HTTP
pull consumer's (core/store/consumers.py ``consumer_key``). An entry is named
``SOURCE:SEQ``, the source it came from and its seq in that source's stream.

A retry of a connector's entry only marks it (``retry_requested_at``): the connector's running
session sends it again through its group's lane and takes it off the list once the broker has
it (core/engine/session.py), so the order of its group holds. A consumer's entry goes back
into the consumer's queue at once, behind what its group has queued.
"""

from __future__ import annotations

from typing import Any

import orjson
from psycopg import sql

from core.config.model import ConsumerConfig
from core.errors import Invalid, NotFound
from core.redact import said
from core.store import AConn, Store
from core.store.consumers import CONSUMER_PREFIX, queue_group
from core.store.selection import parse
from core.store.streams import present

PAGE_MAX = 1000

_ENTRY = (
    "SELECT s.name || ':' || f.seq, s.name, f.seq, f.idempotency_key, f.attempts, f.error,"
    " f.failed_at, f.retry_requested_at IS NOT NULL{payload}"
    " FROM {failed} f JOIN {sources} s USING (sync_id)"
)


def entry_id(text: str) -> tuple[str, int]:
    """(source, seq) of an entry's id ``SOURCE:SEQ``; :class:`Invalid` for anything else."""
    source, _, seq = text.rpartition(":")
    if not source or not seq.isdigit():
        raise Invalid(said("%r is not a failed message's id (SOURCE:SEQ, e.g. app:1042)", text))
    return source, int(seq)


def _entry(row: Any) -> dict[str, Any]:
    out = {"id": row[0], "source": row[1], "seq": int(row[2]), "idempotency_key": row[3],
           "attempts": int(row[4]), "error": row[5], "failed_at": row[6].isoformat(),
           "retry_requested": bool(row[7])}  # fmt: skip
    if len(row) > 8:  # as it is sent, numbers digit for digit (1e-400 read as a double: 0.0)
        out["message"] = orjson.Fragment(row[8])
    return out


class Operations:
    """The store's side of operating Weir, over one async connection per call."""

    def __init__(self, store: Store) -> None:
        self.store = store
        t = store.table
        self._failed = t("failed_messages")
        self._sources = t("sources")
        self._controls = t("connector_controls")
        self._back = sql.SQL(
            "INSERT INTO {} (consumer, sync_id, seq, group_key) VALUES (%s, %s, %s, %s)"
        ).format(t("consumer_messages"))
        self._off = sql.SQL(
            "DELETE FROM {} WHERE connector = %s AND sync_id = %s AND seq = %s"
        ).format(self._failed)

    def _entries(self, payload: bool = False) -> sql.Composed:
        return sql.SQL(_ENTRY.replace("{payload}", ", f.payload" if payload else "")).format(
            failed=self._failed, sources=self._sources
        )

    # -- failed lists ---------------------------------------------------------------------

    async def failed(
        self, conn: AConn, name: str, limit: int, after: str | None
    ) -> tuple[list[dict[str, Any]], str | None]:
        """A page of a failed list in stream order (by source, then seq): (entries, the id
        to pass as ``after`` for the next page, or None at the end). Paging by id holds while
        entries are retried or discarded between pages."""
        if not 1 <= limit <= PAGE_MAX:
            raise Invalid(said("limit must be between 1 and %s", PAGE_MAX))
        source, seq = entry_id(after) if after else ("", -1)
        q = self._entries() + sql.SQL(
            " WHERE f.connector = %s AND (s.name, f.seq) > (%s, %s) ORDER BY s.name, f.seq LIMIT %s"
        )
        rows = await (await conn.execute(q, (name, source, seq, limit + 1))).fetchall()
        entries = [_entry(r) for r in rows[:limit]]
        return entries, (entries[-1]["id"] if len(rows) > limit else None)

    async def failed_one(self, conn: AConn, name: str, entry: str) -> dict[str, Any]:
        """One entry with its message; :class:`NotFound` when the list has no such entry."""
        source, seq = entry_id(entry)
        q = self._entries(payload=True) + sql.SQL(
            " WHERE f.connector = %s AND s.name = %s AND f.seq = %s"
        )
        row = await (await conn.execute(q, (name, source, seq))).fetchone()
        if row is None:
            raise NotFound(said("%s: no failed message %s", name, entry))
        return _entry(row)

    async def has_consumer(self, conn: AConn, name: str) -> bool:
        """Whether the store has the HTTP pull consumer ``consumer:NAME`` names."""
        q = sql.SQL("SELECT 1 FROM {} WHERE name = %s").format(self.store.table("consumers"))
        row = await (await conn.execute(q, (name.removeprefix(CONSUMER_PREFIX),))).fetchone()
        return row is not None

    async def count(self, conn: AConn, name: str) -> int:
        q = sql.SQL("SELECT count(*) FROM {} WHERE connector = %s").format(self._failed)
        row = await (await conn.execute(q, (name,))).fetchone()
        return int(row[0]) if row else 0

    def _chosen(self, ids: list[str] | None) -> tuple[sql.Composable, list[Any]]:
        """The entries of a list that ``ids`` names (all when None), as SQL over ``f``."""
        if ids is None:
            return sql.SQL("true"), []
        pairs = [entry_id(i) for i in ids]
        where = sql.SQL(
            "(f.sync_id, f.seq) IN (SELECT s.sync_id, t.seq FROM unnest(%s::text[], %s::int8[])"
            " AS t(source, seq) JOIN {} s ON s.name = t.source)"
        ).format(self._sources)
        return where, [[p[0] for p in pairs], [p[1] for p in pairs]]

    async def retry(self, conn: AConn, name: str, ids: list[str] | None) -> int:
        """Ask for the entries ``ids`` (all when None) to be sent again; returns how many.
        A consumer's go back into its queue here; a connector's are sent by its session."""
        if name.startswith(CONSUMER_PREFIX):
            return await self._requeue(conn, name, ids)
        where, params = self._chosen(ids)
        q = sql.SQL(
            "UPDATE {} f SET retry_requested_at = now() WHERE f.connector = %s AND {}"
        ).format(self._failed, where)
        return int((await conn.execute(q, (name, *params))).rowcount)

    async def _requeue(self, conn: AConn, name: str, ids: list[str] | None) -> int:
        """Put a consumer's entries back into its queue (behind what their groups have queued)
        and off its failed list, in one transaction. An entry whose stream message is gone
        (a newer version replaced it, or retention pruned it) stays listed."""
        consumer = name.removeprefix(CONSUMER_PREFIX)
        q = sql.SQL("SELECT config FROM {} WHERE name = %s").format(self.store.table("consumers"))
        row = await (await conn.execute(q, (consumer,))).fetchone()
        if row is None:
            raise NotFound(said("no consumer named %r", consumer))
        cfg = ConsumerConfig.model_validate(row[0])
        where, params = self._chosen(ids)
        q = sql.SQL(
            "SELECT f.sync_id, f.seq, f.payload FROM {failed} f WHERE f.connector = %s"
            " AND {where} AND {present} ORDER BY f.seq FOR UPDATE"
        ).format(failed=self._failed, where=where, present=present(self.store, cfg.stream, "f"))
        async with conn.transaction():
            chosen = await (await conn.execute(q, (name, *params))).fetchall()
            for sid, seq, payload in chosen:
                message = parse(payload.encode())
                meta = message["metadata"]
                group = queue_group(str(sid), cfg.group_columns)
                await conn.execute(self._back, (consumer, sid, seq, group(
                    meta["collection_id"], meta["record_id"], message.get("record"))))  # fmt: skip
                await conn.execute(self._off, (name, sid, seq))
        return len(chosen)

    async def discard(self, conn: AConn, name: str, ids: list[str] | None) -> int:
        """Delete the entries ``ids`` (all when None) for good; returns how many."""
        where, params = self._chosen(ids)
        q = sql.SQL("DELETE FROM {} f WHERE f.connector = %s AND {}").format(self._failed, where)
        return int((await conn.execute(q, (name, *params))).rowcount)

    # -- pause and resume -----------------------------------------------------------------

    async def set_paused(self, conn: AConn, name: str, paused: bool) -> None:
        """Pause or resume a connector: every instance stops (drained) or starts its shards
        at its next lease poll; the cursors stay where they were."""
        q = sql.SQL(
            "INSERT INTO {} AS c (name, paused) VALUES (%s, %s) ON CONFLICT (name) DO UPDATE"
            " SET paused = excluded.paused, changed_at = CASE WHEN c.paused = excluded.paused"
            " THEN c.changed_at ELSE now() END"
        ).format(self._controls)
        await conn.execute(q, (name, paused))
