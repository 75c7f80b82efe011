"""Writes changes into one source's events and records streams.

Used by every producer of changes of a source (CDC capture, HTTP ingest): a batch of changes and
the source's checkpoint are committed in one store transaction, and seqs are given out under the
source row's lock, so they are gap-free and commit in order. This is the store half of the
capture hot path, and what it costs the database is two statements a write, whatever it holds:
the changes go in as one events batch (core/store/batches.py), their JSON as the bytes that
are sent, and the newest version of each record they touch into the records index (one
set-based upsert of an unlogged table, core/store/index.py), pointing at its entry. The
versions no event carries (the tombstones of a truncate or a dropped table) and the lock of the
source's row are its base's, core/store/record_writer.py.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus

from core.envelope import dumps, record_token
from core.ids import schema_table_of
from core.redact import said
from core.store import Conn, Store, array, index, ints, texts
from core.store.batches import Entries
from core.store.change import MAX_JSON, REFUSED, Change, UnstorableChange
from core.store.collections import Collections
from core.store.index import Batches
from core.store.record_writer import RecordWriter, advance_source
from core.store.records import (
    LOOKUP,
    WRITE_BATCH,
    Latest,
    Previous,
    Row,
    collapse,
    lacks,
    split_object,
)
from core.store.shared import channel, lock_key


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


Rows = list[tuple[Any, ...]]  # a batch being written: its entries' fields (Entries.from_rows)
Versions = dict[tuple[str, str], Latest]  # the newest version of each record it changes
BATCH_BYTES = 64 << 20  # JSON text in one batch; a write holding more is stored in several


class SourceWriter(RecordWriter):
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
        super().__init__(conn, store, sync_id)
        self.on_unstorable = on_unstorable
        self._drops: list[Change] = []  # tables dropped, to tombstone before the next write
        sources = self._sources = store.table("sources")
        self._lookup = sql.SQL(LOOKUP).format(index=store.table("record_index"))
        self._checkpoint = advance_source(store, ("commit_lsn", "end_lsn")).as_bytes(conn)
        self._write_batch = sql.SQL(WRITE_BATCH).format(
            sources=sources, index=store.table("record_index"),
            events=store.table("event_batches"), channel=sql.Literal(channel(store.schema)),
        ).as_bytes(conn)  # fmt: skip
        self._refused: list[tuple[Change, str]] = []
        self._advance = sql.SQL(
            "UPDATE {} SET end_lsn = greatest(end_lsn, %s), slot_tracked = true,"
            " slot_name = coalesce(%s, slot_name) WHERE sync_id = %s"
        ).format(sources)
        self._refuse = sql.SQL(ADD_FAILURE).format(store.table("source_failures"))
        # Its tables as capture last saw them, and the backfills it asks for, written in its
        # transactions.
        self.collections = Collections(conn, store, sync_id)

    def lock(self, source_name: str) -> None:
        row = self.conn.execute(
            "SELECT pg_try_advisory_lock(hashtextextended(%s, 0))",
            (lock_key(self.store.schema, "writer", str(self.sync_id)),),
        ).fetchone()
        self.conn.commit()
        if not row or not row[0]:
            raise WriterBusyError(
                said(
                    "source %r is already being written by another weir process; "
                    "stop that process or give this source another name",
                    source_name,
                )
            )
        index.ensure(self.conn, self.store)

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
        counters = self.events_seq, self.records_seq, self.record_batches
        try:
            with self.conn.transaction():  # a savepoint
                previous = Previous(changes, self._stored)
                for rows, latest, truncate in self._batches(changes, previous):
                    self._store(rows, latest)
                    if truncate is not None:
                        self._tombstone(truncate, (truncate.collection_id,))
                if previous.unfilled:
                    self._unfilled(previous.unfilled)
        except psycopg.Error as e:
            if (e.sqlstate or "")[:2] not in REFUSED:
                raise
            self.events_seq, self.records_seq, self.record_batches = counters
            if len(changes) > 1:
                for ch in changes:
                    self.write([ch])
                return
            ch = changes[0]
            err = UnstorableChange.refused(ch, e)
            if self.on_unstorable != "fail":
                raise err from e
            self.refuse(ch.version, ch.idx, ch.collection_id, ch.action, err.reason, ch.record_id)
        self._refuse_all()

    def write_commit(self, changes: list[Change], commit_lsn: int, end_lsn: int) -> None:
        """``write`` then ``commit``: capture's usual flush. When nothing in it needs the store's
        answer before the next statement (one batch, no truncate, no column to take from a
        stored version) and no transaction is open, it is one statement, which commits by
        itself: one round trip (~0.3 ms of CPU here, against ~0.8 for a transaction of a few
        statements, pipelined or not)."""
        idle = self.conn.info.transaction_status == TransactionStatus.IDLE
        simple = idle and not self._drops and not any(map(lacks, changes))
        batches = list(self._batches(changes, Previous(changes, self._stored))) if simple else []
        if len(batches) != 1 or batches[0][2] is not None or self._refused:
            self._refused.clear()
            self.write(changes)
            self.commit(commit_lsn, end_lsn)
            return
        rows, latest, _ = batches[0]
        params = self._params(rows, latest) | {"commit": commit_lsn, "end": end_lsn}
        try:
            self.conn.autocommit = True
            try:
                row: Any = self.conn.execute(self._write_batch, params).fetchone()
            finally:
                if not self.conn.closed:
                    self.conn.autocommit = False
        except psycopg.Error as e:
            if self.conn.closed or (e.sqlstate or "")[:2] not in REFUSED:
                raise
            self.write(changes)  # refused (and undone): a change at a time, naming the one
            self.commit(commit_lsn, end_lsn)
            return
        self.events_seq, self.records_seq = int(row[0]), int(row[1])

    def refuse(self, version: int, idx: int, collection_id: str, action: str, reason: str,
               record_id: str | None = None) -> None:  # fmt: skip
        """Put a change on the source's failed list, with why (which names it); committed with
        the next commit."""
        log.warning("on the source's failed list (weir.source_failures): %s", reason)
        if not self._open:
            self._begin()
        self.conn.execute(self._refuse, (self.sync_id, version, idx, collection_id,
                                         record_id or "", action, reason))  # fmt: skip

    def _refuse_all(self) -> None:
        """Put the changes too large to store (``on_unstorable: fail``) on the failed list."""
        refused, self._refused = self._refused, []
        for ch, reason in refused:
            self.refuse(ch.version, ch.idx, ch.collection_id, ch.action, reason, ch.record_id)

    def _batches(
        self, changes: list[Change], previous: Previous
    ) -> Iterator[tuple[Rows, Versions, Change | None]]:
        """The changes as events batches (rows of ``Entries`` fields), each with the newest
        version of each record it changes, ending at a truncate (whose tombstones follow the
        batch), or when it holds ``BATCH_BYTES`` of JSON. Values a change lacks are taken from
        its record's version before (``previous``); a delete's event keeps what the WAL has,
        its tombstone (the payload) every known value. A change too large to store is left out
        (``_refused``) or stops the writer (``on_unstorable: stop``)."""
        rows: Rows = []
        latest: Versions = {}
        size = 0
        for ch in changes:
            whole, changed = previous.complete(ch)
            record = None if whole is None else dumps(whole)
            if record is not None and len(record) > MAX_JSON:
                err = UnstorableChange.too_large(ch._replace(record=whole), len(record))
                if self.on_unstorable != "fail":
                    raise err
                self._refused.append((ch, err.reason))
                continue
            payload = None
            if ch.action == "delete" and whole != ch.record:
                record, payload = dumps(ch.record), record
            chg = None if changed is None else dumps(changed)
            if ch.event_lsn is None:
                rows.append((ch.collection_id, ch.record_id, ch.action, ch.version, ch.idx,
                             ch.committed_at, None, None, record, chg, payload))  # fmt: skip
            else:
                rows.append((ch.collection_id, ch.record_id, ch.action, ch.event_lsn, ch.idx,
                             ch.committed_at, None, ch.version, record, chg, payload))  # fmt: skip
            if ch.action == "truncate":
                yield rows, latest, ch
                rows, latest, size = [], {}, 0
                continue
            collapse(latest, ch, len(rows) - 1)
            size += len(record or b"") + len(chg or b"") + len(payload or b"")
            if size > BATCH_BYTES:
                yield rows, latest, None
                rows, latest, size = [], {}, 0
        if rows:
            yield rows, latest, None

    def _params(self, rows: Rows, latest: Versions) -> dict[str, Any]:
        """The parameters of ``WRITE_BATCH``."""
        keys, versions = list(latest), list(latest.values())
        ts = [r[5] for r in rows]
        return {"sid": self.sync_id, "commit": None, "end": None, "c": texts([c for c, _ in keys]),
                "t": texts([record_token(r) for _, r in keys]),
                "v": ints([v.version for v in versions]), "i": ints([v.idx for v in versions]),
                "d": "{" + ",".join(["t" if v.deleted else "f" for v in versions]) + "}",
                "p": ints([v.pos for v in versions]), "n": len(rows), "first": min(ts),
                "last": max(ts), "data": Entries.from_rows(rows).encode()}  # fmt: skip

    def _store(self, rows: Rows, latest: Versions) -> None:
        """An events batch, and the newest version of each record it changes in the index."""
        row: Any = self.conn.execute(self._write_batch, self._params(rows, latest)).fetchone()
        self.events_seq, self.records_seq = int(row[0]), int(row[1])
        entries = Entries.from_rows(rows).numbered(row[2], row[3])
        self.batches.put(self.events_seq - len(rows) + 1, entries)

    def _stored(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], Row]:
        """The values of the indexed versions of these records, by (collection, record id)."""
        if not keys:
            return {}
        tokens = {(c, record_token(r)): (c, r) for c, r in keys}
        rows: list[Any] = self.conn.execute(
            self._lookup, (array(c for c, _ in tokens), array(t for _, t in tokens), self.sync_id)
        ).fetchall()
        held = self.batches.load(self.conn, (int(r[2]) for r in rows))
        return {tokens[(coll, token)]: split_object(held[batch].version_at(pos).record)
                for coll, token, batch, pos, *_ in rows}  # fmt: skip

    def _unfilled(self, unfilled: dict[str, str]) -> None:
        """Records written without columns their change left out (unchanged TOASTed values),
        as the store held no full version of them (their table never backfilled, or a change
        of theirs refused): their tables are backfilled, once, to make them whole.
        ``unfilled``: collection -> one of its records."""
        collections, some = sorted(unfilled), list(unfilled.values())[:3]
        log.warning("records of %s (%s) lack columns their update left out (values Postgres "
                    "does not send when unchanged) and the store held no earlier version to "
                    "take them from: backfilling %s", ", ".join(collections), ", ".join(some),
                    "them" if len(collections) > 1 else "it")  # fmt: skip
        tables = [schema_table_of(c) for c in collections]
        self.collections.request_backfills(
            tables, "records lacked columns their update left out", again=False
        )

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
            self._tombstone(self._drops[-1], tuple(d.collection_id for d in self._drops))
            self._drops.clear()

    def commit(self, commit_lsn: int, end_lsn: int) -> None:
        """Commit everything written since the last commit together with the checkpoint."""
        if not self._open:
            self._begin()
        self._tombstone_dropped()
        self.conn.execute(self._checkpoint, (commit_lsn, end_lsn, self.sync_id))
        self.conn.commit()
        self._open = False

    def rollback(self) -> None:
        self._open = False
        self._drops.clear()
        self.batches = Batches(self.store, self.sync_id)
        if not self.conn.closed:
            self.conn.rollback()


# A change (or a backfill's row) of a source on its failed list, with why (on_unstorable: fail).
ADD_FAILURE = (
    "INSERT INTO {} (sync_id, commit_lsn, commit_idx, collection_id, record_id, action, error)"
    " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
)
