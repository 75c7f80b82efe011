"""Where sources, connectors, consumers and backfills stand, as the store says: the queries of
``weir status`` and ``/metrics`` (core/status.py adds what only the source databases know).
Each opens a connection of its own; a store that does not answer raises ``psycopg.Error``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from psycopg import sql

from core.ids import schema_table_of
from core.store import Store
from core.store.consumers import QUEUE_COUNTS
from core.tables import table_name

# An owner counts while its heartbeat (written every second by core/runtime/leases.py) is fresh.
OWNER = "CASE WHEN o.heartbeat > now() - interval '30 seconds' THEN o.instance END"


@dataclass(frozen=True)
class StoredSource:
    name: str
    kind: str
    events_seq: int
    records_seq: int
    commit_lsn: int  # last captured commit (postgres) or ingest batch (http)
    owner: str | None  # the instance capturing it (core/runtime/leases.py), None when none is
    failed: int  # changes the store could not hold (on_unstorable: fail)


@dataclass(frozen=True)
class CursorStatus:
    name: str  # the connector, or consumer:NAME for an HTTP pull consumer's queue
    source: str
    stream: str
    seq: int  # every message up to here is delivered, failed or filtered out
    lag_messages: int  # stored and not yet past the cursor (filtered ones included)
    lag_seconds: float  # age of the oldest message not yet past the cursor; 0 when none
    failed: int  # messages on the failed list
    owner: str | None  # the instance running the connector; None for consumers or when none is


@dataclass(frozen=True)
class WorkState:
    """A source's capture or a connector as ``weir run`` last reported it (runtime/leases.py)."""

    state: str  # streaming, connecting, reconnecting, retrying, failed, ...; or not running
    detail: str  # why: the reason it reconnects, the error it failed with
    owner: str | None  # the instance running it now


@dataclass(frozen=True)
class BackfillStatus:
    source: str
    table: str  # schema.table
    rows_read: int
    rows_total: int  # rows in the table when the backfill started
    rows_written: int  # the others equal their record, or were older than a live change
    finished: bool
    idle_seconds: float  # since the backfill last wrote a page (or finished)
    requested: str | None = None  # why capture asked for it, while it waits to start


class Works(dict[str, WorkState]):
    """Work states by work (``source:NAME``, ``connector:KEY``), and the paused connectors
    (``paused``: name -> since when, ISO 8601)."""

    paused: dict[str, str]

    def connector(self, key: str) -> WorkState | None:
        """A connector shard's state (``key``: NAME or NAME#i/N); paused when its connector
        is, None when no instance reported on it."""
        work = self.get(f"connector:{key}")
        since = self.paused.get(key.split("#", 1)[0])
        if since is not None:  # its owner, while it drains
            return WorkState("paused", f"since {since}", work.owner if work else None)
        return work


def works(store: Store) -> Works:
    """By work (``source:NAME``, ``connector:NAME``). A work whose owner's heartbeat is stale
    is not running, unless it failed: then it says why until it runs again."""
    with store.connect(autocommit=True) as conn:
        rows: list[Any] = conn.execute(
            sql.SQL("SELECT work, " + OWNER + ", state, detail FROM {} o").format(
                store.table("owners")
            )
        ).fetchall()
        paused: list[Any] = conn.execute(
            sql.SQL("SELECT name, changed_at FROM {} WHERE paused").format(
                store.table("connector_controls")
            )
        ).fetchall()
    out = Works()
    out.paused = {str(r[0]): r[1].isoformat(timespec="seconds") for r in paused}
    for work, owner, state, detail in rows:
        if owner is None and state != "failed":
            state, detail = "not running", ""
        out[str(work)] = WorkState(state or "starting", detail or "", owner)
    return out


def sources(store: Store) -> list[StoredSource]:
    """Every source of the store, by name."""
    with store.connect(autocommit=True) as conn:
        rows: list[Any] = conn.execute(
            sql.SQL(
                "SELECT s.name, s.kind, s.events_seq, s.records_seq, s.commit_lsn, "
                + OWNER
                + ", (SELECT count(*) FROM {} f WHERE f.sync_id = s.sync_id)"
                " FROM {} s LEFT JOIN {} o ON o.work = 'source:' || s.name ORDER BY s.name"
            ).format(store.table("source_failures"), store.table("sources"), store.table("owners"))
        ).fetchall()
    return [StoredSource(str(r[0]), str(r[1]), int(r[2]), int(r[3]), int(r[4]), r[5], int(r[6]))
            for r in rows]  # fmt: skip


CURSORS = (
    """
SELECT c.connector, s.name, c.stream, c.seq,
       greatest(CASE WHEN c.stream = 'events' THEN s.events_seq ELSE s.records_seq END - c.seq, 0),
       coalesce(CASE WHEN c.stream = 'events' THEN
           (SELECT extract(epoch FROM now() - e.first_committed_at) FROM {events} e
            WHERE e.sync_id = c.sync_id AND e.last_seq > c.seq ORDER BY e.last_seq LIMIT 1)
         ELSE
           (SELECT extract(epoch FROM now() - r.updated_at) FROM {records} r
            WHERE r.sync_id = c.sync_id AND r.seq > c.seq ORDER BY r.seq LIMIT 1)
         END, 0)::float8,
       (SELECT count(*) FROM {failed} f  -- a connector's, shown beside each of its shards
        WHERE f.connector = split_part(c.connector, '#', 1) AND f.sync_id = c.sync_id),
       """
    + OWNER
    + """
FROM {cursors} c JOIN {sources} s USING (sync_id)
LEFT JOIN {owners} o ON o.work = 'connector:' || c.connector
ORDER BY c.connector, s.name
"""
)


def cursors(store: Store) -> list[CursorStatus]:
    """Every cursor of the store (connectors' and consumers' queues'), with its lag."""
    t = store.table
    q = sql.SQL(CURSORS).format(events=t("event_batches"), records=t("record_index"),
                                failed=t("failed_messages"), cursors=t("cursors"),
                                sources=t("sources"), owners=t("owners"))  # fmt: skip
    with store.connect(autocommit=True) as conn:
        rows: list[Any] = conn.execute(q).fetchall()
    return [CursorStatus(str(r[0]), str(r[1]), str(r[2]), int(r[3]), int(r[4]), float(r[5]),
                         int(r[6]), r[7]) for r in rows]  # fmt: skip


def backfills(store: Store) -> list[BackfillStatus]:
    """Every table backfill of the store (``weir backfill`` and ``backfill:``), by source, and
    those capture asked for that have not started yet."""
    with store.connect(autocommit=True) as conn:
        rows: list[Any] = conn.execute(
            sql.SQL(
                "SELECT s.name, b.collection_id, b.rows_read, b.rows_total, b.rows_written,"
                " b.finished_at IS NOT NULL, extract(epoch FROM now() - b.updated_at)::float8"
                " FROM {} b JOIN {} s USING (sync_id) ORDER BY s.name, b.collection_id"
            ).format(store.table("backfills"), store.table("sources"))
        ).fetchall()
        asked: list[Any] = conn.execute(
            sql.SQL(
                "SELECT s.name, r.schema_name, r.table_name, r.reason FROM {} r"
                " JOIN {} s USING (sync_id) ORDER BY s.name, r.schema_name, r.table_name"
            ).format(store.table("backfill_requests"), store.table("sources"))
        ).fetchall()
    out = [BackfillStatus(str(r[0]), table_name(*schema_table_of(str(r[1]))), int(r[2]), int(r[3]),
                          int(r[4]), bool(r[5]), float(r[6])) for r in rows]  # fmt: skip
    waiting = {(str(r[0]), table_name(str(r[1]), str(r[2]))): str(r[3]) for r in asked}
    out = [replace(b, requested=waiting.pop((b.source, b.table), None)) if b.finished else b
           for b in out]  # fmt: skip
    return out + [BackfillStatus(src, table, 0, 0, 0, False, 0.0, reason)
                  for (src, table), reason in waiting.items()]  # fmt: skip


def consumer_queues(store: Store) -> dict[str, tuple[int, int]]:
    """Per HTTP pull consumer: (messages waiting in its queue, outstanding: delivered and
    neither acked nor nacked)."""
    with store.connect(autocommit=True) as conn:
        rows: list[Any] = conn.execute(
            sql.SQL(
                "SELECT c.name, " + QUEUE_COUNTS + " FROM {} c"
                " LEFT JOIN {} m ON m.consumer = c.name GROUP BY c.name ORDER BY c.name"
            ).format(store.table("consumers"), store.table("consumer_messages"))
        ).fetchall()
    return {str(r[0]): (int(r[1]), int(r[2])) for r in rows}
