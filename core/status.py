"""Where sources, connectors and consumers stand, read from the store and the source databases.

One place for these queries: ``weir status`` prints them, ``/metrics`` exports them and the
slot-lag check warns from them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import psycopg
from psycopg import sql

from core.api.consume import QUEUE_COUNTS
from core.config.model import PostgresSource, WeirConfig
from core.ids import schema_table_of
from core.store import Store
from core.tables import table_name

log = logging.getLogger("weir.status")


@dataclass(frozen=True)
class SourceStatus:
    name: str
    kind: str
    events_seq: int
    records_seq: int
    commit_lsn: int  # last captured commit (postgres) or ingest batch (http)
    slot_bytes: int | None  # WAL the slot holds back; None: not a postgres source or unreachable
    slot_active: bool | None
    error: str | None
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


def works(store: Store) -> dict[str, WorkState]:
    """By work (``source:NAME``, ``connector:NAME``). A work whose owner's heartbeat is stale
    is not running, unless it failed: then it says why until it runs again."""
    with store.connect(autocommit=True) as conn:
        rows: list[Any] = conn.execute(
            sql.SQL("SELECT work, " + OWNER + ", state, detail FROM {} o").format(
                store.table("owners")
            )
        ).fetchall()
    out = {}
    for work, owner, state, detail in rows:
        if owner is None and state != "failed":
            state, detail = "not running", ""
        out[str(work)] = WorkState(state or "starting", detail or "", owner)
    return out


@dataclass(frozen=True)
class BackfillStatus:
    source: str
    table: str  # schema.table
    rows_read: int
    rows_total: int  # rows in the table when the backfill started
    rows_written: int  # the others were older than a live change
    finished: bool
    idle_seconds: float  # since the backfill last wrote a page (or finished)
    requested: str | None = None  # why capture asked for it, while it waits to start


def sources(cfg: WeirConfig, store: Store) -> list[SourceStatus]:
    with store.connect(autocommit=True) as conn:
        rows: list[Any] = conn.execute(
            sql.SQL(
                "SELECT s.name, s.kind, s.events_seq, s.records_seq, s.commit_lsn, "
                + OWNER
                + ", (SELECT count(*) FROM {} f WHERE f.sync_id = s.sync_id)"
                " FROM {} s LEFT JOIN {} o ON o.work = 'source:' || s.name ORDER BY s.name"
            ).format(store.table("source_failures"), store.table("sources"), store.table("owners"))
        ).fetchall()
    out = []
    declared = {s.name: s for s in cfg.sources}
    for name, kind, events_seq, records_seq, lsn, owner, failed in rows:
        src = declared.get(str(name))
        slot: tuple[int | None, bool | None, str | None] = (None, None, None)
        if isinstance(src, PostgresSource):
            slot = slot_lag(src)
        out.append(SourceStatus(str(name), str(kind), int(events_seq), int(records_seq),
                                int(lsn), *slot, owner, int(failed)))  # fmt: skip
    return out


def slot_lag(src: PostgresSource) -> tuple[int | None, bool | None, str | None]:
    """(bytes of WAL the slot holds back, whether it is in use, why unknown)."""
    try:
        with psycopg.connect(
            src.url.get_secret_value(), autocommit=True, connect_timeout=5,
            application_name="weir:status",
        ) as conn:  # fmt: skip
            row = conn.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint, active"
                " FROM pg_replication_slots WHERE slot_name = %s",
                (src.slot,),
            ).fetchone()
    except psycopg.Error as e:
        return None, None, f"cannot reach the source: {type(e).__name__}"
    if row is None:
        return None, None, f"replication slot {src.slot} does not exist"
    return (None if row[0] is None else int(row[0])), bool(row[1]), None


# An owner counts while its heartbeat (written every second by core/runtime/service.py) is fresh.
OWNER = "CASE WHEN o.heartbeat > now() - interval '30 seconds' THEN o.instance END"

CURSORS = (
    """
SELECT c.connector, s.name, c.stream, c.seq,
       greatest(CASE WHEN c.stream = 'events' THEN s.events_seq ELSE s.records_seq END - c.seq, 0),
       coalesce(CASE WHEN c.stream = 'events' THEN
           (SELECT extract(epoch FROM now() - e.committed_at) FROM {events} e
            WHERE e.sync_id = c.sync_id AND e.seq = c.seq + 1)
         ELSE
           (SELECT extract(epoch FROM now() - r.updated_at) FROM {records} r
            WHERE r.sync_id = c.sync_id AND r.seq > c.seq ORDER BY r.seq LIMIT 1)
         END, 0)::float8,
       (SELECT count(*) FROM {failed} f WHERE f.connector = c.connector AND f.sync_id = c.sync_id),
       """
    + OWNER
    + """
FROM {cursors} c JOIN {sources} s USING (sync_id)
LEFT JOIN {owners} o ON o.work = 'connector:' || c.connector
ORDER BY c.connector, s.name
"""
)


def cursors(store: Store) -> list[CursorStatus]:
    t = store.table
    q = sql.SQL(CURSORS).format(events=t("events"), records=t("records"),
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
    """Per HTTP pull consumer: (visible messages in its queue, delivered and not acked)."""
    with store.connect(autocommit=True) as conn:
        rows: list[Any] = conn.execute(
            sql.SQL(
                "SELECT c.name, " + QUEUE_COUNTS + " FROM {} c"
                " LEFT JOIN {} m ON m.consumer = c.name GROUP BY c.name ORDER BY c.name"
            ).format(store.table("consumers"), store.table("consumer_messages"))
        ).fetchall()
    return {str(r[0]): (int(r[1]), int(r[2])) for r in rows}
