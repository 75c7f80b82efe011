"""The store's retention and compaction (the retention job, core/runtime/jobs.py, decides when
and warns):

- events older than ``store.events_retention`` go a batch at a time; a version of the records
  stream whose entry is in such a batch and that is still its record's newest is moved first
  into a records batch (the records stream keeps every record's newest version for ever);
- a records batch most of whose versions newer ones replaced is rewritten with the rest, and
  one with none left is deleted.

Each step is a transaction of its own under the source's lock (a writer of the source waits
for it, as for another writer), so it never holds a write up for long.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from psycopg import sql

from core.envelope import record_token
from core.store import Conn, Store, index
from core.store.batches import Entries, Version
from core.store.cursors import SPARK_PREFIX
from core.store.record_writer import RecordWriter

BATCHES = 100  # batches deleted or rewritten per transaction
SPARSE = 0.5  # a records batch with fewer live versions than this share is rewritten


# Whether retention deletes events batch ``b`` now: older than the cutoff, and read by every
# Spark query (running or stopped) unless older than their hold. Params: cutoff, hold, prefix.
_DELETED = (
    "b.inserted_at < now() - %(cutoff)s AND (b.inserted_at < now() - %(hold)s"
    " OR b.last_seq <= (SELECT coalesce(min(q.seq), b.last_seq) FROM {c} q WHERE"
    " q.sync_id = b.sync_id AND q.stream = 'events' AND starts_with(q.connector, %(spark)s)))"
)


def behind(
    conn: Conn, store: Store, cutoff: timedelta, hold: timedelta
) -> list[tuple[str, str, int]]:
    """(who, source, events) of the events retention deletes now (:func:`delete_older`) that a
    reader has not delivered yet: what deleting them takes from it. ``who``: a connector's
    name (a Spark query's cursor too), or ``consumer NAME`` for an HTTP pull consumer, whose
    queue holds events its cursor passed until a worker acks them."""
    t = store.table
    deleted = sql.SQL(_DELETED).format(c=t("cursors"))
    params = {"cutoff": cutoff, "hold": hold, "spark": SPARK_PREFIX}
    cursors: list[Any] = conn.execute(
        sql.SQL(
            "SELECT c.connector, s.name, sum(b.last_seq - greatest(b.first_seq - 1, c.seq))"
            " FROM {c} c JOIN {s} s USING (sync_id)"
            " JOIN {e} b ON b.sync_id = c.sync_id AND b.last_seq > c.seq"
            " WHERE c.stream = 'events' AND {deleted} GROUP BY c.connector, s.name"
        ).format(c=t("cursors"), s=t("sources"), e=t("event_batches"), deleted=deleted),
        params,
    ).fetchall()
    queued: list[Any] = conn.execute(
        sql.SQL(
            "SELECT 'consumer ' || m.consumer, s.name, count(*)"
            " FROM {m} m JOIN {k} k ON k.name = m.consumer AND k.stream = 'events'"
            " JOIN {s} s ON s.sync_id = m.sync_id"
            " JOIN {e} b ON b.sync_id = m.sync_id AND m.seq BETWEEN b.first_seq AND b.last_seq"
            " WHERE {deleted} GROUP BY m.consumer, s.name"
        ).format(
            m=t("consumer_messages"),
            k=t("consumers"),
            s=t("sources"),
            e=t("event_batches"),
            deleted=deleted,
        ),
        params,
    ).fetchall()
    return [(str(c), str(s), int(n)) for c, s, n in cursors + queued]


def delete_older(store: Store, cutoff: timedelta, hold: timedelta) -> int:
    """Delete the events older than ``cutoff``, keeping the records-stream versions their
    batches hold, and those a Spark query has not read yet (running or stopped) unless older
    than ``hold``; returns how many events."""
    total = 0
    with store.connect() as conn:
        index.ensure(conn, store)  # what it moves, it finds there
        for sid in _sources(conn, store):
            while (n := _prune(conn, store, sid, cutoff, hold)) is not None:
                total += n
    return total


def _sources(conn: Conn, store: Store) -> list[Any]:
    rows: list[Any] = conn.execute(
        sql.SQL("SELECT sync_id FROM {}").format(store.table("sources"))
    ).fetchall()
    return [r[0] for r in rows]


def _prune(
    conn: Conn, store: Store, sid: uuid.UUID, cutoff: timedelta, hold: timedelta
) -> int | None:
    """One transaction of :func:`delete_older` for a source: events deleted, None when none."""
    writer = _writer(conn, store, sid)
    table = store.table("event_batches")
    rows: list[Any] = conn.execute(
        sql.SQL(
            "SELECT first_seq, data, version_pos, version_seq, last_committed_at, inserted_at"
            " FROM {e} b WHERE sync_id = %(sid)s AND {deleted} ORDER BY first_seq LIMIT %(n)s"
        ).format(e=table, deleted=sql.SQL(_DELETED).format(c=store.table("cursors"))),
        {"sid": sid, "cutoff": cutoff, "hold": hold, "spark": SPARK_PREFIX, "n": BATCHES},
    ).fetchall()
    if not rows:
        conn.rollback()
        return None
    batches = {int(first): Entries.decode(data).numbered(p, s) for first, data, p, s, *_ in rows}
    seqs = [s for e in batches.values() for s in e.rseq if s is not None]
    _keep(writer, store, sid, seqs, batches, max(r[5] for r in rows))
    conn.execute(
        sql.SQL("DELETE FROM {} WHERE sync_id = %s AND first_seq = ANY(%s)").format(table),
        (sid, list(batches)),
    )
    conn.execute(
        sql.SQL(
            "UPDATE {} SET events_pruned_to = greatest(events_pruned_to, %s) WHERE sync_id = %s"
        ).format(store.table("sources")),
        (max(r[4] for r in rows), sid),
    )
    writer.conn.commit()
    return sum(len(e) for e in batches.values())


def compact(store: Store) -> int:
    """Rewrite the records batches that newer versions made sparse, delete the empty ones;
    returns how many batches went."""
    total = 0
    with store.connect() as conn:
        index.ensure(conn, store)  # what it moves, it finds there
        for sid in _sources(conn, store):
            counts: list[Any] = conn.execute(
                sql.SQL(
                    "SELECT -batch, count(*) FROM {} WHERE sync_id = %s AND batch < 0"
                    " GROUP BY batch"
                ).format(store.table("record_index")),
                (sid,),
            ).fetchall()
            live = dict(counts)
            sizes: list[Any] = conn.execute(
                sql.SQL("SELECT id, entries FROM {} WHERE sync_id = %s").format(
                    store.table("record_batches")
                ),
                (sid,),
            ).fetchall()
            conn.rollback()
            sparse = [int(i) for i, n in sizes if live.get(i, 0) < SPARSE * n]
            for at in range(0, len(sparse), BATCHES):
                total += _rewrite(conn, store, sid, sparse[at : at + BATCHES])
    return total


def _rewrite(conn: Conn, store: Store, sid: uuid.UUID, ids: list[int]) -> int:
    writer = _writer(conn, store, sid)
    table = store.table("record_batches")
    rows: list[Any] = conn.execute(
        sql.SQL("SELECT id, data, inserted_at FROM {} WHERE sync_id = %s AND id = ANY(%s)").format(
            table
        ),
        (sid, ids),
    ).fetchall()
    batches = {-int(i): Entries.decode(data) for i, data, _ in rows}
    seqs = [s for e in batches.values() for s in e.rseq if s is not None]
    _keep(writer, store, sid, seqs, batches, max(r[2] for r in rows))
    conn.execute(
        sql.SQL("DELETE FROM {} WHERE sync_id = %s AND id = ANY(%s)").format(table), (sid, ids)
    )
    writer.conn.commit()
    return len(rows)


def _writer(conn: Conn, store: Store, sid: uuid.UUID) -> RecordWriter:
    """A writer holding the source's lock, for moving versions."""
    writer = RecordWriter(conn, store, sid)
    writer._begin()
    return writer


def _keep(writer: RecordWriter, store: Store, sid: Any, seqs: list[int],
          batches: dict[int, Entries], stored: datetime) -> None:  # fmt: skip
    """Move the versions of ``seqs`` that are still their record's newest and whose entries are
    in ``batches`` (by index location key) into a new records batch, which keeps the newest
    time they were written (``stored``): a rebuilt index gives it to them, and a records
    connector's start time is compared with it."""
    if not seqs:
        return
    rows: list[Any] = writer.conn.execute(
        sql.SQL(
            "SELECT seq, batch, pos FROM {} WHERE sync_id = %s AND seq = ANY(%s) ORDER BY seq"
        ).format(store.table("record_index")),
        (sid, seqs),
    ).fetchall()
    versions: list[tuple[str, Version]] = []
    for _, batch, pos in rows:
        entries = batches.get(batch)
        if entries is not None:
            v = entries.version_at(pos)
            versions.append((record_token(v.rid), v))
    for at in range(0, len(versions), 10_000):
        writer.place(versions[at : at + 10_000], stored=stored)
