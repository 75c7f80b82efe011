"""One replication session's stream: pgoutput messages in, whole transactions out to the
store (core/pg/store_thread.py), positions confirmed to Postgres once the store has them.

Its state is a few fields, each step a method: a message of each kind, a change (with the two
rewrites it makes: a key change is a delete and an insert, a row moved between partitions one
update), a flush of the complete transactions, an idle tick (status, heartbeat, a batch that
waited long enough).
"""

from __future__ import annotations

import logging
import selectors
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import orjson
import psycopg
from psycopg import sql

from core.ids import collection_id_of
from core.pg.follow import (
    ALTERED_PREFIX,
    BACKFILL_PREFIX,
    DROPPED_PREFIX,
    LEFT_PREFIX,
    MISSED_PREFIX,
)
from core.pg.pgoutput import XLOG_HEADER, decode, decode_copy_data, lsn_to_str
from core.pg.relations import (
    Relation,
    Relations,
    SourceSchemaError,
    change_of,
    moved_row,
    old_row,
    other_partition,
)
from core.pg.setup import complete_publication
from core.pg.store_thread import StoreThread
from core.pg.watch import PublicationWatch
from core.store.change import Change, UnstorableChange
from core.store.writer import SourceWriter
from core.tables import table_name

if TYPE_CHECKING:
    from core.pg.capture import PostgresCapture

log = logging.getLogger("weir.source")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
BUSY_WAIT = 0.002  # seconds between looks at a busy store thread while a batch waits
ADVANCE_EVERY = 1.0  # seconds between positions written for the slot while nothing is captured
PUBLICATION_AGAIN = 10  # seconds before the publication is changed again, when it could not be
_TABLE_MESSAGES = (BACKFILL_PREFIX, DROPPED_PREFIX, MISSED_PREFIX, LEFT_PREFIX, ALTERED_PREFIX)
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
        # Each collection's table as last seen (its key's columns, its oid), and back.
        self.tables = writer.tables()
        self.by_relid = {relid: c for c, (_, relid) in self.tables.items()}
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
        self.publication_again: float | None = None  # when to change it again (_missed)
        self.watch = (
            None
            if src.create_publication
            else PublicationWatch(catalog, src.publication, relations.wanted)
        )

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
            self._watch(self.last_data)
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
            self._seen(self.relations.add(m))
        elif tag == "M" and not m[1]:  # a non-transactional message: our heartbeat
            self._advance(m[2])
        elif tag == "M" and m[3] in _TABLE_MESSAGES and not self.skip:
            self._table_message(m[3], bytes(m[4]))
        # 'Y' types and 'O' origins need nothing

    def _seen(self, rel: Relation) -> None:
        """A table described (again): note its key and oid. When its key changed (key_columns
        edited, another primary key or replica identity), backfill it, so its records are keyed
        anew and the old ones become tombstones (the backfill's sweep). When it had another
        name (renamed, moved to another schema), the old name's records are gone, and the new
        name's are backfilled; one moved out of the config's tables is remembered, by its oid,
        so that it is backfilled if it comes back (its changes in between were not taken)."""
        if rel.problem is not None or rel.partition:
            return
        before = self.by_relid.get(rel.relid)
        away = ((), rel.relid)  # a table moved out of the config's tables: no key of its own
        if before is not None and before != rel.collection_id:
            self._renamed(before, rel.relid, rel.schema, rel.table, ignored=rel.ignored)
        if rel.ignored:
            return
        key = tuple(rel.names[i] for i in rel.key)
        known = self.tables.get(rel.collection_id)
        if known == (key, rel.relid):
            return
        if known == away:
            self._backfill(rel.schema, rel.table, "the table came back into the source's tables")
        elif known is not None and known[0] and known[0] != key:
            log.warning("source %s: table %s is keyed by %s now, no longer by %s: its records "
                        "are keyed anew by a backfill", self.src.name,
                        table_name(rel.schema, rel.table), ", ".join(key),
                        ", ".join(known[0]))  # fmt: skip
            self._backfill(rel.schema, rel.table, "the table's key changed")
        elif known is not None:  # another table took the name (one renamed to it, say)
            self._backfill(rel.schema, rel.table, "another table took the name")
        self.tables[rel.collection_id] = (key, rel.relid)
        self.by_relid[rel.relid] = rel.collection_id
        self.store.submit("table", (rel.collection_id, key, rel.relid))

    def _renamed(self, before: str, relid: int, schema: str, table: str, *, ignored: bool) -> None:
        """The table known as ``before`` has another name: the old name's records are gone, and
        the new name's are backfilled; moved out of the config's tables (``ignored``) it is
        remembered as away until it comes back."""
        away = ((), relid)
        was_away = self.tables.get(before) == away
        if not was_away:
            self._drop(before)
        if ignored:  # its records are tombstones until it comes back (backfilled then)
            if not was_away:
                self.tables[before] = away
                self.store.submit("table", (before, (), relid))
            return
        self.tables.pop(before, None)
        self.store.submit("table", (before, None, relid))
        self._backfill(schema, table, "the table was renamed")

    def _altered(self, relid: int, schema: str, table: str) -> None:
        """A published table was altered (the trigger says so by its oid): renamed, it is taken
        as such now, not at its next change (a table seldom written would keep its old name)."""
        collection = collection_id_of(schema, table)
        before = self.by_relid.get(relid)
        if before is None or before == collection or self._named_now(relid, "", "") != (
            schema, table):  # fmt: skip
            return  # not one capture knows, not renamed, or not so named now (forged)
        self._renamed(before, relid, schema, table, ignored=False)
        self.by_relid[relid] = collection

    def _backfill(self, schema: str, table: str, reason: str) -> None:
        """A backfill of the table, after any that runs already (its snapshot may be older
        than what is missing)."""
        self.store.submit("backfill", ((schema, table), reason))

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

    def _table_message(self, prefix: str, content: bytes) -> None:
        """A message of Weir's event trigger or setup (core/pg/setup.py): a table joined the
        publication with rows of its own (backfill it), or was dropped (its records are gone).
        Any role may write such a message: only a table of this source's is taken, and a drop
        only of a table that is gone."""
        try:
            schema, table, *why = orjson.loads(content)
            if not all(isinstance(v, str) for v in (schema, table, *why)):
                raise ValueError(content)
        except (ValueError, TypeError):
            log.warning("source %s: ignored a %s message that names no table, in the "
                        "transaction at %s", self.src.name, prefix,
                        lsn_to_str(self.txn_lsn))  # fmt: skip
            return
        if prefix == BACKFILL_PREFIX and why and why[0].isdigit():
            schema, table = self._named_now(int(why[0]), schema, table)
        wanted = self.relations.wanted
        if wanted is not None and not wanted(schema, table):
            return
        if prefix == BACKFILL_PREFIX:
            # Asked for anew also while one runs: its snapshot may be older than changes made
            # while the table was out of the publication (it left and came back).
            self._backfill(schema, table, "the table joined the publication with rows in it")
            return
        if prefix == ALTERED_PREFIX:
            if why and why[0].isdigit():
                self._altered(int(why[0]), schema, table)
            return
        if prefix == MISSED_PREFIX:
            self._missed(table_name(schema, table), " ".join(why))
            return
        if prefix == LEFT_PREFIX:
            log.warning("source %s: table %s left the publication: it has no key now (a "
                        "primary key or replica identity), so Postgres would refuse its updates "
                        "and deletes; it is captured again, and backfilled, once it has one",
                        self.src.name, table_name(schema, table))  # fmt: skip
            return
        collection = collection_id_of(schema, table)
        known = self.tables.get(collection)
        # Gone, or attached as a partition (its rows are its root's now).
        gone_sql = "SELECT coalesce((SELECT relispartition FROM pg_class WHERE oid = {}), true)"
        if known is not None:
            gone = self.catalog.execute(gone_sql.format("%s"), (known[1],)).fetchone()
        else:
            name = sql.Identifier(schema, table).as_string(self.catalog)
            gone = self.catalog.execute(gone_sql.format("to_regclass(%s)"), (name,)).fetchone()
        if gone is None or not gone[0]:
            return  # the table is there: nothing was dropped
        self._drop(collection)
        if known is not None:
            self.tables.pop(collection)
            self.by_relid.pop(known[1], None)
            self.store.submit("table", (collection, None, known[1]))

    def _named_now(self, relid: int, schema: str, table: str) -> tuple[str, str]:
        """The table's name now (renamed since the message, say), known by its oid from here on,
        so that capture follows a rename that comes before its first change."""
        row = self.catalog.execute(
            "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n"
            " ON n.oid = c.relnamespace WHERE c.oid = %s", (relid,)).fetchone()  # fmt: skip
        if row is None:
            return schema, table
        self.by_relid.setdefault(relid, collection_id_of(row[0], row[1]))
        return str(row[0]), str(row[1])

    def _missed(self, name: str, why: str) -> None:
        """The event trigger could not add a new table to the publication (a lock timeout,
        say): add it now (it is backfilled); its changes in between are not captured."""
        log.warning("source %s: table %s could not join the publication as it was made (%s); "
                    "adding it now (its rows are backfilled, its changes until now are not "
                    "captured)", self.src.name, name, why)  # fmt: skip
        self._complete_publication()

    def _complete_publication(self) -> None:
        """Add (or take out) what the trigger could not, waiting for the publication's lock a
        few seconds at most, and again a while later until that is done."""
        try:
            self.catalog.execute("SET lock_timeout = '5s'")
            complete_publication(self.catalog, self.src)
            self.publication_again = None
        except psycopg.Error as e:
            log.warning("source %s: could not change publication %s (%s): trying again in %ds",
                        self.src.name, self.src.publication, str(e).strip(),
                        PUBLICATION_AGAIN)  # fmt: skip
            self.publication_again = time.monotonic() + PUBLICATION_AGAIN
        finally:
            self.catalog.execute("RESET lock_timeout")

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

    def _watch(self, now: float) -> None:
        """A DBA's publication: a table taken out of it is named, and backfilled once back."""
        for schema, table in self.watch.left(now) if self.watch is not None else ():
            name, pub = table_name(schema, table), self.src.publication
            log.warning("source %s: table %s was taken out of publication %s: its changes are "
                        "not captured until it is added again (ALTER PUBLICATION %s ADD TABLE "
                        "%s); it is backfilled then", self.src.name, name, pub, pub,
                        name)  # fmt: skip
            self._backfill(schema, table, f"until it is in publication {pub}")

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
        self._watch(now)
        if self.publication_again is not None and now >= self.publication_again:
            self._complete_publication()
        timeout = BUSY_WAIT if self.committed else min(self.status_every, self.heartbeat_every, 1.0)
        sel.select(timeout)
        self.pgconn.consume_input()
