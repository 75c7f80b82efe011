"""Writes versions into one source's records stream that no event carries: a records batch and
its index rows (``place``), and the tombstones of collections' live records (``_tombstone``: a
truncate, a dropped table, a snapshot's sweep). Under the lock of the source's row that every
writer of a source takes (``_begin``), so seqs are given out gap-free and in commit order.

The base of the writer of changes (core/store/writer.py); the snapshot writer of backfills and
seeds (core/store/snapshot_writer.py) and retention (core/store/retention.py) use it alone.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from psycopg import sql

from core.store import Conn, Store, array
from core.store.batches import Entries, Version
from core.store.change import Change
from core.store.index import Batches
from core.store.records import LIVE_BEFORE, MOVE_VERSIONS
from core.store.shared import channel


def _lock_source(store: Store) -> sql.Composed:
    """Locks a source's row and reads (events_seq, records_seq, record_batches); params:
    sync_id. Every writer of a source takes this lock, so seqs are given out gap-free and in
    commit order."""
    return sql.SQL(
        "SELECT events_seq, records_seq, record_batches FROM {} WHERE sync_id = %s FOR UPDATE"
    ).format(store.table("sources"))


def advance_source(store: Store, columns: tuple[str, ...]) -> sql.Composed:
    """Sets ``columns`` of a source's row (params: their values, then sync_id) and notifies its
    readers: connectors LISTEN on the store's channel and hear it when the transaction commits,
    with the heads of both streams (``SYNC_ID:EVENTS_SEQ:RECORDS_SEQ``)."""
    sets = sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in columns)
    return sql.SQL(
        "WITH s AS (UPDATE {} SET {}, updated_at = now() WHERE sync_id = %s"
        " RETURNING sync_id, events_seq, records_seq)"
        " SELECT pg_notify({}, sync_id::text || ':' || events_seq || ':' || records_seq) FROM s"
    ).format(store.table("sources"), sets, sql.Literal(channel(store.schema)))


class RecordWriter:
    """Places versions in one source's records stream, on the source's lock (``_begin``) until
    the caller commits."""

    def __init__(self, conn: Conn, store: Store, sync_id: uuid.UUID) -> None:
        self.conn = conn
        self.store = store
        self.sync_id = sync_id
        self.events_seq = 0
        self.records_seq = 0
        self.record_batches = 0
        self._open = False
        self.batches = Batches(store, sync_id)
        # Rendered once, the statements of every store transaction: a Composed is rendered anew
        # at each execution (~100 us of CPU a transaction).
        self._lock_row = _lock_source(store).as_bytes(conn)
        self._insert_records = INSERT_RECORD_BATCH.format(store.table("record_batches"))
        idx = store.table("record_index")
        self._live_before = sql.SQL(LIVE_BEFORE).format(index=idx)
        self._move = sql.SQL(MOVE_VERSIONS).format(index=idx)
        self._copy_index = sql.SQL(
            "COPY {} (sync_id, collection_id, record_id, seq, version, version_idx, deleted,"
            " batch, pos) FROM STDIN"
        ).format(idx)
        self._counters = advance_source(store, ("records_seq", "record_batches"))

    def _begin(self) -> None:
        row: Any = self.conn.execute(self._lock_row, (self.sync_id,)).fetchone()
        assert row is not None, "source not registered"
        self.events_seq, self.records_seq, self.record_batches = map(int, row)
        self._open = True

    def _tombstone(self, ch: Change, collections: tuple[str, ...]) -> None:
        """Every live record of ``collections`` older than ``ch`` becomes a tombstone holding
        its last values, in the order of their seqs: records batches of ``TOMBSTONES``."""
        with self.conn.cursor(name="weir_tombstones") as cur:
            cur.itersize = TOMBSTONES
            cur.execute(self._live_before, (self.sync_id, list(collections), ch.version, ch.idx))
            while True:
                rows: list[Any] = cur.fetchmany(TOMBSTONES)
                if not rows:
                    return
                held = self.batches.load(self.conn, (int(r[2]) for r in rows))
                versions = []
                for token, _, batch, pos in rows:
                    last = held[batch].version_at(pos)
                    self.records_seq += 1
                    versions.append((token, last._replace(
                        seq=self.records_seq, version=ch.version, idx=ch.idx, deleted=True,
                        ts=ch.committed_at)))  # fmt: skip
                self.place(versions)

    def place(self, versions: list[tuple[str, Version]], *, new: bool = False,
              stored: datetime | None = None) -> None:  # fmt: skip
        """Store versions (each with its record token) in a new records batch, and index them
        there: as records the index holds already, or (``new``) as records it does not hold,
        which fails on one it holds (a unique violation). The source's counters move past
        them. ``stored``: when versions moved from other batches were written (the batch's
        time, which a rebuilt index gives them), else now."""
        self.record_batches += 1
        entries = Entries()
        for _, v in versions:
            entries.add_version(v)
        key = -self.record_batches
        self.batches.put(key, entries)
        self.conn.execute(self._insert_records, (self.sync_id, self.record_batches, len(entries),
                                                 entries.encode(), stored))  # fmt: skip
        if new:
            with self.conn.cursor() as cur, cur.copy(self._copy_index) as copy:
                for pos, (token, v) in enumerate(versions):
                    copy.write_row((self.sync_id, v.coll, token, v.seq, v.version, v.idx,
                                    v.deleted, key, pos))  # fmt: skip
        else:
            cols: list[list[Any]] = [[], [], [], [], [], [], [], []]
            for pos, (token, v) in enumerate(versions):
                for col, value in zip(cols, (v.coll, token, v.seq, v.version, v.idx, v.deleted,
                                             key, pos), strict=True):  # fmt: skip
                    col.append(value)
            self.conn.execute(self._move, (self.sync_id, *map(array, cols)))
        self.records_seq = max(self.records_seq, *(v.seq for _, v in versions))
        self.conn.execute(self._counters, (self.records_seq, self.record_batches, self.sync_id))


TOMBSTONES = 10_000  # versions per records batch of a truncate's tombstones
INSERT_RECORD_BATCH = sql.SQL(
    "INSERT INTO {} (sync_id, id, entries, data, inserted_at)"
    " VALUES (%s, %s, %s, %s, coalesce(%s, now()))"
)
