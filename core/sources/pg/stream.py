"""One replication session's stream: pgoutput messages in, whole transactions out to the
store (core/sources/pg/store_thread.py), positions confirmed to Postgres once the store has them.

Its state is a few fields, each step a method: a message of each kind, a change (with the two
rewrites it makes: a key change is a delete and an insert, a row moved between partitions one
update), a flush of the complete transactions, an idle tick (status, heartbeat, a batch that
waited long enough). What becomes of the source's tables (renamed, dropped, rekeyed, the
trigger's messages) is the follower's (core/sources/pg/follower.py).
"""

from __future__ import annotations

import logging
import selectors
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from core.config.sources import PostgresSource
from core.ids import lsn_to_str
from core.redact import said
from core.sources.pg.columns import with_sources
from core.sources.pg.follow import TABLE_MESSAGES
from core.sources.pg.follower import TableFollower
from core.sources.pg.pgoutput import XLOG_HEADER, decode, decode_copy_data, standby_status
from core.sources.pg.relations import (
    Relation,
    Relations,
    SourceSchemaError,
    change_of,
    moved_row,
    old_row,
    other_partition,
)
from core.sources.pg.store_thread import StoreThread
from core.store.change import Change, UnstorableChange
from core.store.writer import SourceWriter
from core.tables import table_name

log = logging.getLogger("weir.source")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
BUSY_WAIT = 0.002  # seconds between looks at a busy store thread while a batch waits
# Seconds to let a burst of transactions arrive once the first is there: read together, they
# cost one wakeup, not one each (each wakeup and socket read costs ~50 us of this process's
# CPU; 5,000 single-row transactions/s cost 96 us of CPU a change without, 71 with 5 ms).
GATHER = 0.005
FLUSH_AFTER = 0.015  # seconds: the youngest a batch goes while the stream keeps coming
ADVANCE_EVERY = 1.0  # seconds between positions written for the slot while nothing is captured
_ACTIONS = {"I": "insert", "U": "update", "D": "delete"}


class CaptureError(SourceSchemaError):
    """A change could not be read; the message names the table and LSN."""


_second: tuple[int, str] = (-1, "")  # the last second _iso wrote and its text, swapped whole
# (one tuple, so that sources streaming in threads of one process never pair a second with
# another's text)


def _iso(us: int) -> str:
    """A commit timestamp (microseconds since the Unix epoch) as messages write it
    (core/envelope.py ``utc_iso``); the text of a second is made once for all its commits."""
    global _second
    second, fraction = divmod(us, 1_000_000)
    last = _second
    if last[0] != second:
        last = (second, (_EPOCH + timedelta(seconds=second)).isoformat()[:19] + ".")
        _second = last
    return f"{last[1]}{fraction:06d}Z"


class SlotPosition:
    """How far capture has stored and confirmed, across the sessions of one source.

    The store thread counts what it wrote (``stored``) and moves ``flushed_lsn`` once a commit
    (or an advance) is in the store (``confirmed``); ``send_status`` tells Postgres that
    position, and only that one, so the slot never passes what the store holds.
    """

    def __init__(self, changes: Any) -> None:
        self.changes = changes  # the source's counter of committed changes (metrics)
        self.flushed_lsn = 0  # stored, so it may be confirmed to Postgres
        self.sent_lsn = 0  # confirmed to Postgres
        self.stored_changes = 0
        self.uncommitted = 0  # changes written to the store and not yet committed

    def stored(self, n: int) -> None:
        self.stored_changes += n
        self.uncommitted += n

    def confirmed(self, end_lsn: int) -> None:
        self.flushed_lsn = max(self.flushed_lsn, end_lsn)
        self.changes.inc(self.uncommitted)
        self.uncommitted = 0

    def send_status(self, pgconn: Any) -> None:
        lsn = self.sent_lsn = self.flushed_lsn
        pgconn.put_copy_data(standby_status(lsn, lsn, time.time_ns() // 1000))
        pgconn.flush()


class Stream:
    """One session's stream: decodes messages and hands whole transactions to the store.

    ``pending`` holds changes not yet handed over; ``pending[:complete]`` belong to
    transactions whose Commit has arrived, the last of them ``committed`` (commit_lsn,
    end_lsn). A position no commit carries (keepalives and heartbeats while nothing is
    captured) is written to the store before it is confirmed, so the slot never passes it.
    """

    def __init__(
        self,
        src: PostgresSource,
        position: SlotPosition,
        repl: psycopg.Connection[Any],
        catalog: psycopg.Connection[Any],
        writer: SourceWriter,
        relations: Relations,
        stop: threading.Event,
    ) -> None:
        self.src = src
        self.position = position
        self.pgconn = repl.pgconn
        self.catalog = catalog
        self.relations = relations
        self.checkpoint_lsn = writer.checkpoint().commit_lsn
        self.stop = stop
        self.max_batch, self.max_wait = src.max_batch, src.max_batch_wait.total_seconds()
        self.status_every = src.status_interval.total_seconds()
        self.heartbeat_every = src.heartbeat_interval.total_seconds()
        self.pending: list[Change] = []
        self.complete = 0
        self.committed: tuple[int, int] | None = None
        self.in_txn = False
        self.skip = False  # this transaction is already in the store
        self.txn_lsn = 0
        self.txn_ts = ""
        self.idx = 0
        self.batch_started = 0.0
        self.last_status = self.last_data = self.last_advance = time.monotonic()
        self.store = StoreThread(writer, position.stored, position.confirmed)
        self.txn_mark = (0, 0)  # changes pending and store items when the transaction began
        self.next_tick = 0.0  # when a commit next lets the follower look (a second apart)
        tables = writer.collections.tables()
        self.follower = TableFollower(src, catalog, relations, self.store, tables, self._drop)
        # What the records were made with: the tables' oids and columns.
        relations.identities.tables = {c: relid for c, (_, relid) in tables.items()}
        relations.identities.noted = writer.collections.shapes()
        self.on_message = {"I": self._change, "U": self._change, "D": self._change,
                           "B": self._begin, "C": self._commit, "T": self._truncate,
                           "R": self._relation, "M": self._logical}  # fmt: skip

    def run(self) -> None:
        """Read until ``stop``; then keep what is complete and drop the partial transaction
        (Postgres sends it again to the next session)."""
        pgconn = self.pgconn
        sel = selectors.DefaultSelector()
        sel.register(pgconn.socket, selectors.EVENT_READ)
        on_message, stopped, keepalive = self.on_message, self.stop.is_set, self._keepalive
        try:
            while True:
                nbytes, data = pgconn.get_copy_data(1)
                if nbytes > 0:
                    if data[0] == 107:  # 'k' keepalive
                        keepalive(bytes(data))
                    else:  # XLogData; 'Y' types and 'O' origins need nothing
                        m = decode(bytes(data[XLOG_HEADER:]))
                        step = on_message.get(m[0])
                        if step is not None:
                            step(m)
                elif nbytes == 0:  # all read: a moment to stop, flush, confirm and wait
                    if stopped():
                        break
                    self._idle(sel)
                else:
                    result = pgconn.get_result()
                    message = result.error_message.decode(errors="replace") if result else ""
                    raise psycopg.OperationalError(
                        said("replication stream ended: %s", message.strip())
                    )
            if self.committed is not None:
                self._flush()
            self.store.finish()
            self.position.send_status(pgconn)
        except BaseException:
            self.store.abort()
            raise

    # -- messages -------------------------------------------------------------------------------

    def _keepalive(self, data: bytes) -> None:
        _, wal_end, reply = decode_copy_data(data)
        self._advance(wal_end)
        if reply:
            self.position.send_status(self.pgconn)
            self.last_status = time.monotonic()

    def _begin(self, m: tuple[Any, ...]) -> None:
        """A transaction begins: skipped whole when the store has it already (a resend)."""
        self.in_txn = True
        self.txn_lsn, self.txn_ts, self.idx = m[1], _iso(m[2]), 0
        self.skip = self.txn_lsn <= self.checkpoint_lsn
        self.txn_mark = (len(self.pending), self.store.submitted)
        if self.committed is None:
            self.batch_started = time.monotonic()

    def _commit(self, m: tuple[Any, ...]) -> None:
        """A transaction is complete. Steps: 1. let the follower look at the tables (a second
        apart, as ``_idle`` may not come under load); 2. a transaction without a change of the
        source's moves the slot as a keepalive does; 3. otherwise it joins the batch, which is
        flushed once it holds ``max_batch`` changes or waited ``max_batch_wait``."""
        self.in_txn = False
        now = self.last_data = time.monotonic()
        # Step 1
        if now >= self.next_tick:
            self.next_tick = now + 1.0
            self.follower.tick(now)
        # Step 2: nothing of the source's (the store's own writes, in a publication for all
        # tables, say): no store commit follows.
        if self.committed is None and self.txn_mark == (len(self.pending), self.store.submitted):
            self._advance(m[3])
            return
        # Step 3
        if not self.skip:
            self.committed, self.complete = (m[2], m[3]), len(self.pending)
            if self.complete >= self.max_batch or now - self.batch_started >= self.max_wait:
                self._flush()

    def _truncate(self, m: tuple[Any, ...]) -> None:
        if self.skip:
            return
        for relid in m[2]:
            rel = self.relations.by_id[relid]
            if not rel.ignored:
                self._append(Change(action="truncate", collection_id=rel.collection_id,
                                    record_id=None, record=None, changes=None, missing=(),
                                    old_record_id=None, version=self.txn_lsn, idx=self.idx,
                                    committed_at=self.txn_ts))  # fmt: skip

    def _relation(self, m: tuple[Any, ...]) -> None:
        self.follower.seen(self.relations.add(m))

    def _logical(self, m: tuple[Any, ...]) -> None:
        """A logical message: our heartbeat (non-transactional), or the follow trigger's."""
        if not m[1]:
            self._advance(m[2])
        elif m[3] in TABLE_MESSAGES and not self.skip:
            self.follower.message(m[3], bytes(m[4]), self.txn_lsn)

    def _drop(self, collection: str) -> None:
        """Every record of the collection becomes a tombstone, after the changes before this
        point of the transaction."""
        if self.committed is not None:
            self._flush()
        if self.pending:
            self.store.submit("write", self.pending[:])
            self.pending.clear()
        self.store.submit("drop", (collection, self.txn_lsn, self.idx, self.txn_ts))
        self.idx += 1

    def _change(self, m: tuple[Any, ...]) -> None:
        """An insert, update or delete: one change (a key change: a delete and an insert; a row
        moved between partitions: one update)."""
        if self.skip:
            return
        rel = self.relations.by_id[m[1]]
        if rel.ignored:
            return
        if rel.problem is not None:
            self._keyless(rel, _ACTIONS[m[0]])
            return
        try:
            ch = change_of(m, rel, self.txn_lsn, self.idx, self.txn_ts)
            if ch.missing and rel.was != {}:  # renamed columns, or names not to be trusted
                ch = with_sources(ch, rel.was)
        except psycopg.OperationalError:
            raise  # the source went away while its text was learned: reconnect
        except Exception as e:
            name = table_name(rel.schema, rel.table)
            raise CaptureError(
                said(
                    "source %r: cannot read a change of table %s in the transaction at %s: %s",
                    self.src.name,
                    name,
                    lsn_to_str(self.txn_lsn),
                    e,
                )
            ) from e
        if ch.old_record_id is not None and ch.old_record_id != ch.record_id:
            # The key changed: the old record is gone (a delete), the new one appears.
            old, missing = old_row(m, rel)
            self._append(Change(action="delete", collection_id=ch.collection_id,
                                record_id=ch.old_record_id, record=old, changes=None,
                                missing=missing, old_record_id=None, version=ch.version,
                                idx=self.idx, committed_at=ch.committed_at))  # fmt: skip
            ch = ch._replace(action="insert", changes=None, old_missing=(), idx=self.idx)
        pending = self.pending
        if rel.partition_key is not None and ch.action == "insert" and pending:
            prev = pending[-1]
            if (prev.action == "delete" and prev.version == ch.version
                    and prev.collection_id == ch.collection_id
                    and prev.record_id == ch.record_id
                    and other_partition(rel.partition_key, prev, ch)):  # fmt: skip
                pending[-1] = moved_row(prev, ch)  # a row moved to another partition
                return
        self._append(ch)

    def _keyless(self, rel: Relation, action: str) -> None:
        """A change of a table whose rows have no key (a publication Weir does not manage, or
        a change made before the table left the publication): stop naming it, or put it on the
        source's failed list (``on_unstorable``)."""
        err = UnstorableChange(
            said(
                "cannot capture the %s of table %s committed at %s: %s",
                action,
                table_name(rel.schema, rel.table),
                lsn_to_str(self.txn_lsn),
                rel.problem,
            )
        )
        if self.src.on_unstorable != "fail":
            raise err
        self.store.submit("refuse", (self.txn_lsn, self.idx, rel.collection_id, action, err.reason))
        self.idx += 1

    def _append(self, ch: Change) -> None:
        pending = self.pending
        pending.append(ch)
        self.idx += 1
        if len(pending) > self.max_batch:
            # A long transaction: commit the finished ones, then write this one in chunks into
            # the open store transaction. The last change stays, to meet a move's insert.
            if self.committed is not None:
                self._flush()
            self.store.submit("write", pending[:-1])
            del pending[:-1]

    def _flush(self) -> None:
        """Flush, then confirm. Steps: 1. write the complete transactions; 2. commit them with
        their checkpoint (both on the store thread, in this order); 3. forget them; 4. send a
        status: it carries the flush LSN the store thread last confirmed, so Postgres hears of
        these transactions only after the store committed them (here or with a later status).
        """
        assert self.committed is not None
        # Steps 1 and 2
        self.store.submit("flush", (self.pending[: self.complete], self.committed))
        # Step 3
        del self.pending[: self.complete]
        self.committed, self.complete = None, 0
        # Step 4
        self.position.send_status(self.pgconn)

    def _advance(self, lsn: int) -> None:
        """Everything before ``lsn`` is in the store: let the slot move there, once the store
        has it too (rate-limited: a position a second at most)."""
        now = time.monotonic()
        if (not self.in_txn and self.committed is None and lsn > self.position.flushed_lsn
                and now - self.last_advance >= ADVANCE_EVERY and self.store.idle()):  # fmt: skip
            self.last_advance = now
            self.store.submit("advance", lsn)

    def _idle(self, sel: selectors.BaseSelector) -> None:
        """Nothing more to read right now: commit what is complete (latency) and wait. A batch
        goes once it is ``FLUSH_AFTER`` old and the store thread is idle: while the store thread
        is busy a batch gains nothing by going early, it grows instead (to max_batch_wait), so a
        backlog is written in large batches rather than one per gap; and a store transaction
        costs ~1 ms of CPU whatever it holds, so a steady stream of small transactions is not
        written one or two at a time."""
        pos, now = self.position, time.monotonic()
        if self.committed is not None and (
            (self.store.idle() and now - self.batch_started >= FLUSH_AFTER)
            or now - self.batch_started >= self.max_wait
        ):
            self._flush()
        if now - self.last_status >= self.status_every or pos.flushed_lsn > pos.sent_lsn:
            pos.send_status(self.pgconn)  # periodic, or a commit is to confirm
            self.last_status = now
        if now - self.last_data >= self.heartbeat_every and not self.in_txn:
            self.catalog.execute(
                "SELECT pg_logical_emit_message(false, 'weir_heartbeat', now()::text)"
            )
            self.last_data = now
        self.follower.tick(now)
        timeout = BUSY_WAIT if self.committed else min(self.status_every, self.heartbeat_every, 1.0)
        if sel.select(timeout):  # a transaction came in: the ones right behind it come along
            time.sleep(GATHER)
        self.pgconn.consume_input()
