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
from typing import TYPE_CHECKING, Any

import psycopg

from core.sources.pg.follow import TABLE_MESSAGES
from core.sources.pg.follower import TableFollower
from core.sources.pg.pgoutput import XLOG_HEADER, decode, decode_copy_data, lsn_to_str
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

if TYPE_CHECKING:
    from core.sources.pg.capture import PostgresCapture

log = logging.getLogger("weir.source")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
BUSY_WAIT = 0.002  # seconds between looks at a busy store thread while a batch waits
ADVANCE_EVERY = 1.0  # seconds between positions written for the slot while nothing is captured
_ACTIONS = {"I": "insert", "U": "update", "D": "delete"}


class CaptureError(SourceSchemaError):
    """A change could not be read; the message names the table and LSN."""


def _iso(us: int) -> str:
    return (_EPOCH + timedelta(microseconds=us)).isoformat()


class Stream:
    """One session's stream: decodes messages and hands whole transactions to the store.

    ``pending`` holds changes not yet handed over; ``pending[:complete]`` belong to
    transactions whose Commit has arrived, the last of them ``committed`` (commit_lsn,
    end_lsn). A position no commit carries (keepalives and heartbeats while nothing is
    captured) is written to the store before it is confirmed, so the slot never passes it.
    """

    def __init__(
        self,
        capture: PostgresCapture,
        repl: psycopg.Connection[Any],
        catalog: psycopg.Connection[Any],
        writer: SourceWriter,
        relations: Relations,
        stop: threading.Event,
    ) -> None:
        self.capture = capture
        self.src = src = capture.src
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
        self.uncommitted = 0  # changes written to the store and not yet committed
        self.store = StoreThread(writer, self._stored, self._confirmed)
        self.txn_mark = (0, 0)  # changes pending and store items when the transaction began
        self.next_tick = 0.0  # when a commit next lets the follower look (a second apart)
        self.follower = TableFollower(src, catalog, relations, self.store, writer.tables(),
                                      self._drop)  # fmt: skip

    def _stored(self, n: int) -> None:
        self.capture.stored_changes += n
        self.uncommitted += n

    def _confirmed(self, end_lsn: int) -> None:
        cap = self.capture
        cap.flushed_lsn = max(cap.flushed_lsn, end_lsn)
        cap.changes.inc(self.uncommitted)
        self.uncommitted = 0

    def run(self) -> None:
        pgconn = self.pgconn
        sel = selectors.DefaultSelector()
        sel.register(pgconn.socket, selectors.EVENT_READ)
        try:
            while not self.stop.is_set():
                nbytes, data = pgconn.get_copy_data(1)
                if nbytes > 0:
                    if data[0] == 107:  # 'k' keepalive
                        self._keepalive(bytes(data))
                    else:
                        self._message(decode(bytes(data[XLOG_HEADER:])))  # XLogData
                elif nbytes == 0:
                    self._idle(sel)
                else:
                    result = pgconn.get_result()
                    message = result.error_message.decode(errors="replace") if result else ""
                    raise psycopg.OperationalError(f"replication stream ended: {message.strip()}")
            # Stop: keep what is complete, drop the partial transaction (it will be sent again).
            if self.committed is not None:
                self._flush()
            self.store.finish()
            self.capture.send_status(pgconn)
            self.capture.state = "stopped"
        except BaseException:
            self.store.abort()
            raise

    # -- messages -------------------------------------------------------------------------------

    def _keepalive(self, data: bytes) -> None:
        _, wal_end, reply = decode_copy_data(data)
        self._advance(wal_end)
        if reply:
            self.capture.send_status(self.pgconn)
            self.last_status = time.monotonic()

    def _message(self, m: tuple[Any, ...]) -> None:
        tag = m[0]
        if tag in ("I", "U", "D"):
            if not self.skip:
                self._change(m)
        elif tag == "B":
            self.in_txn = True
            self.txn_lsn, self.txn_ts, self.idx = m[1], _iso(m[2]), 0
            self.skip = self.txn_lsn <= self.checkpoint_lsn
            self.txn_mark = (len(self.pending), self.store.submitted)
            if self.committed is None:
                self.batch_started = time.monotonic()
        elif tag == "C":
            self.in_txn = False
            self.last_data = time.monotonic()
            if self.last_data >= self.next_tick:  # under load _idle may not come for a while
                self.next_tick = self.last_data + 1.0
                self.follower.tick(self.last_data)
            if self.committed is None and self.txn_mark == (
                len(self.pending),
                self.store.submitted,
            ):
                # Nothing of the source's (the store's own writes, in a publication for all
                # tables, say): the slot moves on as for a keepalive, no store commit follows.
                self._advance(m[3])
            elif not self.skip:
                self.committed, self.complete = (m[2], m[3]), len(self.pending)
                if (self.complete >= self.max_batch
                        or self.last_data - self.batch_started >= self.max_wait):  # fmt: skip
                    self._flush()
        elif tag == "T":
            if not self.skip:
                for relid in m[2]:
                    rel = self.relations.by_id[relid]
                    if rel.ignored:
                        continue
                    self._append(Change("truncate", rel.collection_id, None, None, None, (), None,
                                        self.txn_lsn, self.idx, self.txn_ts))  # fmt: skip
        elif tag == "R":
            self.follower.seen(self.relations.add(m))
        elif tag == "M" and not m[1]:  # a non-transactional message: our heartbeat
            self._advance(m[2])
        elif tag == "M" and m[3] in TABLE_MESSAGES and not self.skip:
            self.follower.message(m[3], bytes(m[4]), self.txn_lsn)
        # 'Y' types and 'O' origins need nothing

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
        rel = self.relations.by_id[m[1]]
        if rel.ignored:
            return
        if rel.problem is not None:
            self._keyless(rel, _ACTIONS[m[0]])
            return
        try:
            ch = change_of(m, rel, self.txn_lsn, self.idx, self.txn_ts)
        except Exception as e:
            name = table_name(rel.schema, rel.table)
            raise CaptureError(
                f"source {self.src.name!r}: cannot read a change of table {name} in the "
                f"transaction at {lsn_to_str(self.txn_lsn)}: {e}"
            ) from e
        if ch.old_record_id is not None and ch.old_record_id != ch.record_id:
            # The key changed: the old record is gone (a delete), the new one appears.
            old, missing = old_row(m, rel)
            self._append(Change("delete", ch.collection_id, ch.old_record_id, old, None, missing,
                                None, ch.version, self.idx, ch.committed_at))  # fmt: skip
            ch = ch._replace(action="insert", changes=None, idx=self.idx)
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
            f"cannot capture the {action} of table {table_name(rel.schema, rel.table)} "
            f"committed at {lsn_to_str(self.txn_lsn)}: {rel.problem}"
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
        """Commit the complete transactions with their checkpoint (on the store thread); the
        flush LSN moves once they are committed, and goes out with the next status.
        """
        assert self.committed is not None
        self.store.submit("write", self.pending[: self.complete])
        self.store.submit("commit", self.committed)
        del self.pending[: self.complete]
        self.committed, self.complete = None, 0
        self.capture.send_status(self.pgconn)

    def _advance(self, lsn: int) -> None:
        """Everything before ``lsn`` is in the store: let the slot move there, once the store
        has it too (rate-limited: a position a second at most)."""
        now = time.monotonic()
        if (not self.in_txn and self.committed is None and lsn > self.capture.flushed_lsn
                and now - self.last_advance >= ADVANCE_EVERY and self.store.idle()):  # fmt: skip
            self.last_advance = now
            self.store.submit("advance", lsn)

    def _idle(self, sel: selectors.BaseSelector) -> None:
        """Nothing more to read right now: commit what is complete (latency) and wait. While
        the store thread is busy a batch gains nothing by going early: it grows instead (to
        max_batch_wait), so a backlog is written in large batches rather than one per gap."""
        cap, now = self.capture, time.monotonic()
        if self.committed is not None and (
            self.store.idle() or now - self.batch_started >= self.max_wait
        ):
            self._flush()
        if now - self.last_status >= self.status_every or cap.flushed_lsn > cap.sent_lsn:
            cap.send_status(self.pgconn)  # periodic, or a commit is to confirm
            self.last_status = now
        if now - self.last_data >= self.heartbeat_every and not self.in_txn:
            self.catalog.execute(
                "SELECT pg_logical_emit_message(false, 'weir_heartbeat', now()::text)"
            )
            self.last_data = now
        self.follower.tick(now)
        timeout = BUSY_WAIT if self.committed else min(self.status_every, self.heartbeat_every, 1.0)
        sel.select(timeout)
        self.pgconn.consume_input()
