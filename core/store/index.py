"""The records stream's index: for every record of every source, its newest version (seq,
version, tombstone or not) and where its entry is (``record_index``, one row per record).

The index is an UNLOGGED table: it writes no WAL, so keeping it costs the database no more than
its CPU, and it is derived data. Every version it points at is an entry of a batch
(core/store/batches.py), and a batch always holds the newest version of a record whose entry it
held when retention or compaction deleted its batch (core/store/retention.py moves those first).
So the index is the newest entry of each record over all batches, and is rebuilt from them
when Postgres emptied it (it does so to every unlogged table after a crash, on a promoted
standby, and in a base backup's restore): ``record_index_state`` holds one row while the index
is whole, and every writer and reader of the records stream checks it when it starts
(:func:`ensure`), and a reader of the index on every page (:data:`MISSING_ROW`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from psycopg import sql

from core.envelope import record_token
from core.store import AConn, Conn, Store, array
from core.store.batches import Entries
from core.store.shared import lock_key

log = logging.getLogger("weir.store")

# Appended to a query of the index: a row with seq -1 when the index is not whole.
MISSING_ROW = " UNION ALL SELECT -1, 0, 0 WHERE NOT EXISTS (SELECT 1 FROM {state})"


class IndexMissing(RuntimeError):
    """The records stream's index was emptied (Postgres did, after a crash): it is rebuilt when
    the next session starts."""

    def __init__(self) -> None:
        super().__init__("the store's records index is being rebuilt (Postgres emptied it)")


def built(conn: Conn, store: Store) -> bool:
    row = conn.execute(
        sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(store.table("record_index_state"))
    ).fetchone()
    return bool(row and row[0])


def ensure(conn: Conn, store: Store) -> None:
    """Rebuild the index when it is not whole (after a crash of Postgres), once: concurrent
    callers wait for the first and find it built. Commits."""
    if built(conn, store):
        conn.commit()
        return
    with conn.transaction():
        conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            (lock_key(store.schema, "index"),),
        )
        if not built(conn, store):
            rebuild(conn, store)


async def aensure(conn: AConn, store: Store) -> None:
    """:func:`ensure` for an async session: it looks, and rebuilds on a connection of its own."""
    cur = await conn.execute(
        sql.SQL("SELECT EXISTS (SELECT 1 FROM {})").format(store.table("record_index_state"))
    )
    row = await cur.fetchone()
    if not (row and row[0]):

        def run() -> None:
            with store.connect() as c:
                ensure(c, store)

        await asyncio.to_thread(run)


def rebuild(conn: Conn, store: Store) -> None:
    """Make the index anew from every batch, in the caller's transaction: each record's entry
    with the highest seq, and of one seq the highest version (a backfill's row equal to its
    record keeps the record's seq: core/store/snapshot_writer.py). Every source's writers wait
    meanwhile (their rows are locked)."""
    t = store.table
    started = time.monotonic()
    conn.execute(sql.SQL("SELECT 1 FROM {} FOR UPDATE").format(t("sources")))
    conn.execute(sql.SQL("TRUNCATE {}").format(t("record_index")))
    conn.execute(
        'CREATE TEMP TABLE weir_index_stage (sync_id uuid, collection_id text COLLATE "C",'
        ' record_id text COLLATE "C", seq int8, version int8, version_idx int4, deleted bool,'
        " updated_at timestamptz, batch int8, pos int4) ON COMMIT DROP"
    )
    entries = 0
    stage = "COPY weir_index_stage FROM STDIN"
    for kind, query in (
        (
            1,
            "SELECT sync_id, first_seq, inserted_at, data, version_pos, version_seq FROM {}"
            " WHERE version_pos IS NOT NULL ORDER BY sync_id, first_seq",
        ),
        (-1, "SELECT sync_id, id, inserted_at, data, NULL, NULL FROM {} ORDER BY sync_id, id"),
    ):
        table = t("event_batches" if kind > 0 else "record_batches")
        with conn.cursor(name=f"weir_rebuild_{kind + 1}") as cur:
            cur.execute(sql.SQL(query).format(table))
            while rows := cur.fetchmany(200):  # a COPY between the fetches, not during one
                with conn.cursor() as out, out.copy(stage) as copy:
                    for sync_id, key, at, data, positions, seqs in rows:
                        batch = Entries.decode(data).numbered(positions, seqs)  # type: ignore[arg-type]
                        for i, seq in enumerate(batch.rseq):
                            if seq is not None:
                                v = batch.version_at(i)
                                copy.write_row((sync_id, v.coll, record_token(v.rid), v.seq,
                                                v.version, v.idx, v.deleted, at,
                                                kind * key, i))  # type: ignore[operator]  # fmt: skip
                                entries += 1
    conn.execute(
        sql.SQL(
            "INSERT INTO {} (sync_id, collection_id, record_id, seq, version, version_idx,"
            " deleted, updated_at, batch, pos)"
            " SELECT DISTINCT ON (sync_id, collection_id, record_id) * FROM weir_index_stage"
            " ORDER BY sync_id, collection_id, record_id, seq DESC, version DESC,"
            " version_idx DESC"
        ).format(t("record_index"))
    )
    conn.execute(sql.SQL("INSERT INTO {} VALUES (now())").format(t("record_index_state")))
    log.warning(
        "store: rebuilt the records index from %d versions in %.1fs (Postgres had "
        "emptied it, as it does to unlogged tables after a crash)",
        entries,
        time.monotonic() - started,
    )


# -- versions by where they are --------------------------------------------------------------


class Batches:
    """Decoded batches of one source by their index location key (an events batch's first seq,
    or minus a records batch's id): the last ``size`` read or written are kept, up to about
    ``entries`` entries. A writer's cache may hold batches of its open transaction, which its
    own connection reads too: it starts a new cache when it rolls back."""

    def __init__(self, store: Store, sync_id: Any, size: int = 64, entries: int = 20_000) -> None:
        self.sync_id = sync_id
        self.size = size
        self.entries = entries  # and at most about this many entries (memory)
        self._cache: OrderedDict[int, Entries] = OrderedDict()
        self._count = 0  # entries in the cache
        self.queries = (
            sql.SQL(
                "SELECT first_seq, data, version_pos, version_seq FROM {}"
                " WHERE sync_id = %s AND first_seq = ANY(%s)"
            ).format(store.table("event_batches")),
            sql.SQL(
                "SELECT -id, data, NULL, NULL FROM {} WHERE sync_id = %s AND id = ANY(%s)"
            ).format(store.table("record_batches")),
        )

    def put(self, key: int, entries: Entries) -> None:
        old = self._cache.pop(key, None)
        self._count += len(entries) - (len(old) if old is not None else 0)
        self._cache[key] = entries
        while len(self._cache) > 1 and (len(self._cache) > self.size or self._count > self.entries):
            self._count -= len(self._cache.popitem(last=False)[1])

    def get(self, key: int) -> Entries | None:
        return self._cache.get(key)

    def _held(self, keys: Iterable[int]) -> tuple[dict[int, Entries], list[list[int]]]:
        """Those of ``keys`` held, and those to read: (events batches' first seqs, records
        batches' ids)."""
        held, want = {}, set()
        for k in keys:
            e = self.get(k)
            if e is None:
                want.add(k)
            else:
                held[k] = e
        return held, [[k for k in want if k > 0], [-k for k in want if k < 0]]

    def _took(self, held: dict[int, Entries], rows: Iterable[Any]) -> None:
        for key, data, positions, seqs in rows:
            held[int(key)] = e = Entries.decode(data).numbered(positions, seqs)
            self.put(int(key), e)

    def load(self, conn: Conn, keys: Iterable[int]) -> dict[int, Entries]:
        """The batches of ``keys`` that the store holds (those not held read from it)."""
        held, want = self._held(keys)
        for query, ids in zip(self.queries, want, strict=True):
            if ids:
                self._took(held, conn.execute(query, (self.sync_id, array(ids))).fetchall())
        return held

    async def aload(self, conn: AConn, keys: Iterable[int]) -> dict[int, Entries]:
        held, want = self._held(keys)
        for query, ids in zip(self.queries, want, strict=True):
            if ids:
                rows = await (await conn.execute(query, (self.sync_id, array(ids)))).fetchall()
                self._took(held, rows)
        return held
