"""Writes changes into one source's events and records streams.

Used by every producer of a source (CDC capture, HTTP ingest, backfill): a batch of changes and
the source's checkpoint are committed in one store transaction, and seqs are given out under the
source row's lock, so they are gap-free and commit in order. This is the store half of the
capture hot path: rows go to the events stream by COPY and to the records stream in one
set-based upsert per batch.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import psycopg
from psycopg import sql

from core.envelope import MAX_RECORD_TOKEN, dumps, record_token
from core.ids import schema_table_of
from core.store import Conn, Store
from core.store.change import (
    JSONB_ITEM,
    MAX_JSON,
    REFUSED,
    Change,
    UnstorableChange,
    jsonb_size,
)
from core.store.records import TRUNCATE_RECORDS, UPSERT_RECORDS, collapse, moved


@dataclass(frozen=True)
class Checkpoint:
    """What the store holds of a source: its last captured commit, where replication resumes,
    whether its slot is held to that position yet (sources/pg/slot.py), and when it was written."""

    commit_lsn: int
    end_lsn: int
    tracked: bool
    at: datetime | None
    slot: str | None  # the slot it was held to


class WriterBusyError(RuntimeError):
    """Another process is writing this source right now."""


log = logging.getLogger("weir.store")
NOTIFY_CHANNEL = "weir_stream"


def _lock_source(store: Store) -> sql.Composed:
    """Locks a source's row and reads (events_seq, records_seq); params: sync_id. Every writer
    of a source takes this lock, so seqs are given out gap-free and in commit order."""
    return sql.SQL("SELECT events_seq, records_seq FROM {} WHERE sync_id = %s FOR UPDATE").format(
        store.table("sources")
    )


def _advance(store: Store, columns: tuple[str, ...]) -> sql.Composed:
    """Sets ``columns`` of a source's row (params: their values, then sync_id) and notifies its
    readers: connectors LISTEN on NOTIFY_CHANNEL and hear it when the transaction commits."""
    sets = sql.SQL(", ").join(sql.SQL("{} = %s").format(sql.Identifier(c)) for c in columns)
    return sql.SQL(
        "WITH s AS (UPDATE {} SET {}, updated_at = now() WHERE sync_id = %s RETURNING sync_id)"
        " SELECT pg_notify({}, sync_id::text) FROM s"
    ).format(store.table("sources"), sets, sql.Literal(NOTIFY_CHANNEL))


class SourceWriter:
    """The single writer of one source's streams, for as long as its connection lives.

    ``lock()`` takes a session advisory lock, so a second capture process of the same source
    fails at once instead of interleaving seqs; the lock goes away with the connection, also
    when the process is killed.
    """

    def __init__(
        self, conn: Conn, store: Store, sync_id: uuid.UUID, on_unstorable: str = "stop"
    ) -> None:
        """``on_unstorable``: a change too large for the store stops the writer (``stop``), or
        goes to the source's failed list (``fail``, with its reason) and the rest goes on."""
        self.conn = conn
        self.store = store
        self.sync_id = sync_id
        self.on_unstorable = on_unstorable
        self.events_seq = 0
        self.records_seq = 0
        self._open = False
        self._drops: list[Change] = []  # tables dropped, to tombstone before the next write
        sources, events, records = (store.table(n) for n in ("sources", "events", "records"))
        self._sources = sources
        self._lock_row = _lock_source(store)
        self._copy_events = sql.SQL(
            "COPY {} (sync_id, seq, collection_id, record_id, action, commit_lsn, commit_idx,"
            " committed_at, record, changes) FROM STDIN"
        ).format(events)
        self._upsert = sql.SQL(UPSERT_RECORDS).format(records=records)
        self._truncate = sql.SQL(TRUNCATE_RECORDS).format(records=records)
        self._checkpoint = _advance(store, ("events_seq", "records_seq", "commit_lsn", "end_lsn"))
        self._advance = sql.SQL(
            "UPDATE {} SET end_lsn = greatest(end_lsn, %s), slot_tracked = true,"
            " slot_name = coalesce(%s, slot_name) WHERE sync_id = %s"
        ).format(sources)
        requests = store.table("backfill_requests")
        self._request = sql.SQL(REQUEST_BACKFILL + REPLACE_REQUEST).format(requests)
        self._request_once = sql.SQL(REQUEST_BACKFILL + "DO NOTHING").format(requests)
        self._refuse = sql.SQL(ADD_FAILURE).format(store.table("source_failures"))
        collections = store.table("collections")
        self._tables = sql.SQL(
            "SELECT collection_id, key_columns, relid FROM {} WHERE sync_id = %s"
        ).format(collections)
        self._set_table = sql.SQL(
            "INSERT INTO {} (sync_id, collection_id, key_columns, relid) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (sync_id, collection_id) DO UPDATE SET key_columns ="
            " excluded.key_columns, relid = excluded.relid"
        ).format(collections)
        self._forget_table = sql.SQL(
            "DELETE FROM {} WHERE sync_id = %s AND collection_id = %s"
        ).format(collections)

    def lock(self, source_name: str) -> None:
        row = self.conn.execute(
            "SELECT pg_try_advisory_lock(hashtextextended('weir:writer:' || %s, 0))",
            (str(self.sync_id),),
        ).fetchone()
        self.conn.commit()
        if not row or not row[0]:
            raise WriterBusyError(
                f"source {source_name!r} is already being written by another weir process; "
                "stop that process or give this source another name"
            )

    def checkpoint(self) -> Checkpoint:
        """The last transaction committed to the store, and where replication resumes."""
        row = self.conn.execute(
            sql.SQL(
                "SELECT commit_lsn, end_lsn, slot_tracked, updated_at, slot_name FROM {}"
                " WHERE sync_id = %s"
            ).format(self._sources),
            (self.sync_id,),
        ).fetchone()
        self.conn.commit()
        assert row is not None, "source not registered"
        return Checkpoint(int(row[0]), int(row[1]), bool(row[2]), row[3], row[4])  # type: ignore[call-overload, arg-type]

    def advance(self, end_lsn: int, slot: str | None = None) -> None:
        """Let replication resume at ``end_lsn`` (nothing captured lies between), and commit:
        capture calls it before it confirms a position to Postgres that no commit carried, so
        the slot never passes the store (core/sources/pg/slot.py). ``slot``: the one now held so."""
        self.conn.execute(self._advance, (end_lsn, slot, self.sync_id))
        self.conn.commit()

    def tables(self) -> dict[str, tuple[tuple[str, ...], int]]:
        """Each collection's table as capture last saw it: (its key's columns, its oid)."""
        rows = self.conn.execute(self._tables, (self.sync_id,)).fetchall()
        self.conn.commit()
        return {str(r[0]): (tuple(r[1]), int(r[2])) for r in rows}  # type: ignore[arg-type, call-overload]

    def set_table(self, collection_id: str, key: tuple[str, ...] | None, relid: int) -> None:
        """Store a collection's table as capture sees it now (``key`` None: it is gone), with
        the next commit."""
        if key is None:
            self.conn.execute(self._forget_table, (self.sync_id, collection_id))
        else:
            self.conn.execute(self._set_table, (self.sync_id, collection_id, list(key), relid))

    def request_backfills(
        self, tables: list[tuple[str, str]], reason: str, *, again: bool = True
    ) -> None:
        """Ask for a backfill of these (schema, table)s, with the next commit (sources/backfill.py
        runs it). ``again``: also when one is asked for already (it starts over); else that one
        stands (a request any role may write into the WAL cannot keep a backfill from ending)."""
        statement = self._request if again else self._request_once
        self.conn.cursor().executemany(
            statement, [(self.sync_id, schema, table, reason) for schema, table in tables]
        )

    def _begin(self) -> None:
        row = self.conn.execute(self._lock_row, (self.sync_id,)).fetchone()
        assert row is not None, "source not registered"
        self.events_seq, self.records_seq = int(row[0]), int(row[1])  # type: ignore[call-overload]
        self._open = True

    def write(self, changes: list[Change]) -> None:
        """Add changes to the open store transaction (opening it when needed); commit later.

        A long upstream transaction is written in several calls and committed once. A write
        the store refuses (a value or size it cannot hold) is written again a change at a time,
        so the one refused is named, and stops the writer or (``on_unstorable: fail``) goes to
        the source's failed list while the others are written.
        """
        if not changes:
            return
        if not self._open:
            self._begin()
        self._tombstone_dropped()
        seqs = self.events_seq, self.records_seq
        try:
            with self.conn.transaction():  # a savepoint
                self._write(changes)
        except psycopg.Error as e:
            if (e.sqlstate or "")[:2] not in REFUSED:
                raise
            self.events_seq, self.records_seq = seqs
            if len(changes) > 1:
                for ch in changes:
                    self.write([ch])
                return
            ch = changes[0]
            err = UnstorableChange.refused(ch, e)
            if self.on_unstorable != "fail":
                raise err from e
            self.refuse(ch.version, ch.idx, ch.collection_id, ch.action, err.reason, ch.record_id)

    def refuse(self, version: int, idx: int, collection_id: str, action: str, reason: str,
               record_id: str | None = None) -> None:  # fmt: skip
        """Put a change on the source's failed list, with why (which names it); committed with
        the next commit."""
        log.warning("on the source's failed list (weir.source_failures): %s", reason)
        if not self._open:
            self._begin()
        self.conn.execute(self._refuse, (self.sync_id, version, idx, collection_id,
                                         record_id or "", action, reason))  # fmt: skip

    def _write(self, changes: list[Change]) -> None:
        sid = str(self.sync_id)
        seq = self.events_seq
        # Records-stream work in order: upserts of the newest versions, split at truncates.
        latest: dict[tuple[str, str], list[Any]] = {}
        steps: list[dict[tuple[str, str], list[Any]] | Change] = [latest]
        refused: list[tuple[Change, str]] = []
        with self.conn.cursor() as cur:
            with cur.copy(self._copy_events) as copy:
                write_row = copy.write_row
                for ch in changes:
                    record_json = None if ch.record is None else dumps(ch.record).decode()
                    changes_json = None if ch.changes is None else dumps(ch.changes).decode()
                    if record_json is not None and len(record_json) > MAX_JSON // JSONB_ITEM:
                        size = jsonb_size(record_json, ch.record)  # only a large one is weighed
                        if size > MAX_JSON:
                            err = UnstorableChange.too_large(ch, size)
                            if self.on_unstorable != "fail":
                                raise err
                            refused.append((ch, err.reason))
                            continue
                    seq += 1
                    write_row(
                        (
                            sid,
                            seq,
                            ch.collection_id,
                            ch.record_id,
                            ch.action,
                            ch.version if ch.event_lsn is None else ch.event_lsn,
                            ch.idx,
                            ch.committed_at,
                            record_json,
                            changes_json,
                        )
                    )
                    if ch.action == "truncate":
                        latest = {}
                        steps += [ch, latest]
                        continue
                    if ch.old_record_id is not None and ch.old_record_id != ch.record_id:
                        moved(latest, ch)
                    else:
                        collapse(latest, ch, ch.record_id, ch.action == "delete", ch.record,
                                  record_json, ch.missing)  # fmt: skip
            for step in steps:
                if isinstance(step, dict):
                    self._upsert_records(cur, step)
                else:
                    self._truncate_collection(cur, step)
        self.events_seq = seq
        for ch, reason in refused:
            self.refuse(ch.version, ch.idx, ch.collection_id, ch.action, reason, ch.record_id)

    def _upsert_records(self, cur: Any, latest: dict[tuple[str, str], list[Any]]) -> None:
        if not latest:
            return
        cols: list[list[Any]] = [[], [], [], [], [], [], [], [], [], []]
        # Dict order is the order of each record's last change: the seq order to give out.
        for (collection_id, record_id), (
            version,
            idx,
            deleted,
            missing,
            rec,
            js,
            ts,
            from_id,
        ) in latest.items():
            cols[0].append(collection_id)
            cols[1].append(record_token(record_id))
            cols[8].append(record_id if len(record_id) > MAX_RECORD_TOKEN else None)
            cols[9].append(None if from_id is None else record_token(from_id))
            cols[2].append(version)
            cols[3].append(idx)
            cols[4].append(deleted)
            cols[5].append(orjson.dumps(missing).decode() if missing else None)
            cols[6].append(js if js is not None else dumps(rec).decode())
            cols[7].append(ts)
        cur.execute(
            self._upsert, (self.sync_id, *cols, self.sync_id, self.sync_id, self.records_seq)
        )
        accepted, unfilled, some = cur.fetchone()
        self.records_seq += accepted
        if unfilled:
            self._unfilled(unfilled, some)

    def _unfilled(self, collections: list[str], some: list[str]) -> None:
        """Records written without columns their change left out (unchanged TOASTed values),
        as the store held no full version of them (their table never backfilled, or a change
        of theirs refused): their tables are backfilled, once, to make them whole."""
        log.warning("records of %s (%s) lack columns their update left out (values Postgres "
                    "does not send when unchanged) and the store held no earlier version to "
                    "take them from: backfilling %s", ", ".join(collections), ", ".join(some),
                    "them" if len(collections) > 1 else "it")  # fmt: skip
        tables = [schema_table_of(c) for c in collections]
        self.request_backfills(tables, "records lacked columns their update left out", again=False)

    def _truncate_collection(self, cur: Any, ch: Change, also: tuple[str, ...] = ()) -> None:
        """Every live record of the collection (and of ``also``) older than ``ch`` becomes a
        tombstone: one pass over the source's records."""
        cur.execute(
            self._truncate,
            {
                "sid": self.sync_id,
                "collections": [ch.collection_id, *also],
                "version": ch.version,
                "idx": ch.idx,
                "ts": ch.committed_at,
                "base": self.records_seq,
            },
        )
        self.records_seq += cur.rowcount

    def drop(self, collection_id: str, version: int, idx: int, committed_at: str) -> None:
        """The collection's table was dropped: every record of it becomes a tombstone (as a
        truncate does, without an event: a drop changes no row), before the next write, with
        the next commit. Drops in a row (``DROP SCHEMA ... CASCADE``) are one pass."""
        if not self._open:
            self._begin()
        self._drops.append(Change(action="truncate", collection_id=collection_id, record_id=None,
                                  record=None, changes=None, missing=(), old_record_id=None,
                                  version=version, idx=idx, committed_at=committed_at))  # fmt: skip

    def _tombstone_dropped(self) -> None:
        if self._drops:
            last = self._drops[-1]
            with self.conn.cursor() as cur:
                self._truncate_collection(cur, last, tuple(d.collection_id for d in self._drops))
            self._drops.clear()

    def commit(self, commit_lsn: int, end_lsn: int) -> None:
        """Commit everything written since the last commit together with the checkpoint."""
        if not self._open:
            self._begin()
        self._tombstone_dropped()
        self.conn.execute(
            self._checkpoint,
            (self.events_seq, self.records_seq, commit_lsn, end_lsn, self.sync_id),
        )
        self.conn.commit()
        self._open = False

    def rollback(self) -> None:
        self._open = False
        self._drops.clear()
        if not self.conn.closed:
            self.conn.rollback()


# A change (or a backfill's row) of a source on its failed list, with why (on_unstorable: fail).
ADD_FAILURE = (
    "INSERT INTO {} (sync_id, commit_lsn, commit_idx, collection_id, record_id, action, error)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
)

REQUEST_BACKFILL = """
INSERT INTO {} (sync_id, schema_name, table_name, reason) VALUES (%s, %s, %s, %s)
ON CONFLICT (sync_id, schema_name, table_name)
"""
REPLACE_REQUEST = "DO UPDATE SET reason = excluded.reason, requested_at = now()"
