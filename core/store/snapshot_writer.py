"""Writes rows read from a source table (the seed job, backfills) into a source's records
stream, with the snapshot version guard (docs/operations.md “Backfill and seed”): a row never
replaces a newer live change.

Snapshot rows carry version (L, -1): they replace only records older than L. A chunk of rows
becomes one records batch (core/store/batches.py) and its index rows, written under the lock
every writer of a source takes (so no record appears meanwhile). While none of a writer's rows
has met an indexed record, a chunk is indexed by COPY with no lookup: the index's own
uniqueness check is the lookup, and a stored record makes the chunk fail, roll back to a
savepoint and the writer turn to the checked merge (a seed's rows are nearly all new). The
checked merge looks up the chunk's records and leaves out those whose indexed version is not
older. A row whose record equals its stored live version is no new version: it keeps its seq
(so no reader gets it again) and takes the snapshot's version, written again beside it so that
an index rebuilt from the batches has it too (core/store/index.py keeps, of one seq, the newest
version): the sweep leaves it, as it leaves every row read.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from psycopg import errors, sql

from core.envelope import record_token, utc_iso
from core.store import Conn, Store, array, index
from core.store.batches import Version
from core.store.change import Change
from core.store.record_writer import RecordWriter
from core.store.writer import ADD_FAILURE

log = logging.getLogger("weir.store")
SNAPSHOT_IDX = -1  # the version_idx of rows read from a table: below every captured change
COMPARE_BATCHES = 64  # store batches read at a time to compare a chunk's rows with records

# The ordinals of a chunk's records that the index holds, whether their version is older than
# the snapshot's, and where the live ones are: params tokens, sync_id, collection, version, idx.
INDEXED = """
SELECT u.ord, (r.version, r.version_idx) < (%s, %s), r.deleted, r.batch, r.pos
FROM unnest(%s::text[]) WITH ORDINALITY AS u(t, ord)
JOIN LATERAL (
    SELECT version, version_idx, deleted, batch, pos FROM {index} r
    WHERE r.record_id = u.t AND r.collection_id = %s AND r.sync_id = %s LIMIT 1
) r ON true
"""


def same_record(stored: bytes, read: bytes) -> bool:
    """Whether a row read holds what its stored record holds: the same names and values, each
    number as written (a column's new scale is a change), in any order."""
    if stored == read:
        return True
    return bool(_exact(stored) == _exact(read))


def _exact(text: bytes) -> Any:
    """JSON's values, each number as its text in a tuple (so never equal to a string)."""
    return json.loads(text, parse_float=_number, parse_int=_number, parse_constant=_number)


def _number(text: str) -> tuple[str]:
    return (text,)


class SnapshotWriter:
    """Writes rows read from a source table (seed job, backfill) into the records stream.

    ``write`` merges a chunk of rows under the source's lock and does not commit: the caller
    commits, with its own progress in the same transaction, and so releases the lock.
    """

    def __init__(
        self, conn: Conn, store: Store, sync_id: uuid.UUID, version: int, at: datetime
    ) -> None:
        self.conn = conn
        self.sync_id = sync_id
        self.version = version
        self.at = at
        self._ts = utc_iso(at)
        self._all_new = True  # no row has met an indexed record yet: indexed by COPY
        self._writer = RecordWriter(conn, store, sync_id)
        self._indexed = sql.SQL(INDEXED).format(index=store.table("record_index"))
        self._refuse = sql.SQL(ADD_FAILURE).format(store.table("source_failures"))
        index.ensure(conn, store)

    def write(self, collection_id: str, rows: Iterable[tuple[str, bytes]]) -> tuple[int, int]:
        """Merge rows of one collection, each (record id, record JSON); returns (rows, those
        accepted)."""
        rows = list(rows)
        if not rows:
            return 0, 0
        w = self._writer
        w._begin()  # the source's lock, until the caller commits
        w.batches = index.Batches(w.store, w.sync_id)  # the last transaction's: committed, or gone
        tokens = [record_token(rid) for rid, _ in rows]
        accepted = None
        if self._all_new:
            accepted = self._place(collection_id, rows, tokens, new=True)
        if accepted is None:
            skip, same = self._stored(collection_id, rows, tokens)
            keep = [i for i in range(len(rows)) if i not in skip]
            accepted = self._place(
                collection_id, [rows[i] for i in keep], [tokens[i] for i in keep], new=False,
                same=same,
            )  # fmt: skip
            accepted = (accepted or 0) - len(same)
        return len(rows), accepted

    def _stored(
        self, collection_id: str, rows: list[tuple[str, bytes]], tokens: list[str]
    ) -> tuple[set[int], list[tuple[str, Version]]]:
        """The rows of a chunk not to write as new versions (by index): those whose stored
        version is not older than the snapshot, and those equal to their live one; and the
        latter's stored versions, at the snapshot's version."""
        w = self._writer
        params = (self.version, SNAPSHOT_IDX, array(tokens), collection_id, self.sync_id)
        found: Any = self.conn.execute(self._indexed, params).fetchall()
        skip = {int(r[0]) - 1 for r in found if not r[1]}
        # Each live record is compared with its row, its batches read COMPARE_BATCHES at a time
        # (a table changed a few rows at a time spreads a page's records over many).
        at: dict[int, list[tuple[int, int]]] = {}  # batch -> (row, position) of its records
        for r in found:
            if r[1] and not r[2]:
                at.setdefault(int(r[3]), []).append((int(r[0]) - 1, int(r[4])))
        keys = list(at)
        same: list[tuple[str, Version]] = []
        for first in range(0, len(keys), COMPARE_BATCHES):
            held = w.batches.load(self.conn, keys[first : first + COMPARE_BATCHES])
            for batch, entries in held.items():
                for i, pos in at[batch]:
                    stored = entries.version_at(pos)
                    if same_record(stored.record, rows[i][1]):
                        skip.add(i)
                        kept = stored._replace(version=self.version, idx=SNAPSHOT_IDX)
                        same.append((tokens[i], kept))
        return skip, same

    def _place(
        self, collection_id: str, rows: list[tuple[str, bytes]], tokens: list[str], new: bool,
        same: Sequence[tuple[str, Version]] = (),
    ) -> int | None:  # fmt: skip
        """The rows as versions in a records batch, with ``same`` (versions at their own seqs);
        None when ``new`` and one was indexed."""
        if not rows and not same:
            return 0
        w = self._writer
        counters = w.records_seq, w.record_batches
        versions = [
            (
                token,
                Version(
                    collection_id,
                    rid,
                    w.records_seq + n,
                    self.version,
                    SNAPSHOT_IDX,
                    False,
                    self._ts,
                    record,
                ),
            )
            for n, ((rid, record), token) in enumerate(zip(rows, tokens, strict=True), 1)
        ] + list(same)
        try:
            with self.conn.transaction():  # a savepoint
                w.place(versions, new=new)
        except errors.UniqueViolation as e:
            if not new or e.diag.constraint_name != "record_index_pkey":
                raise
            w.records_seq, w.record_batches = counters
            self._all_new = False
            return None
        return len(versions)

    def refuse(self, collection_id: str, record_id: str, reason: str) -> None:
        """Put a row the store refused on the source's failed list, at the snapshot's
        version, with why (which names it)."""
        log.warning("on the source's failed list (weir.source_failures): %s", reason)
        self.conn.execute(
            self._refuse,
            (
                self.sync_id,
                self.version,
                SNAPSHOT_IDX,
                collection_id,
                record_id,
                "backfill",
                reason,
            ),
        )

    def sweep(self, collection_id: str) -> int:
        """Once every row of the table was written: its live records older than the snapshot
        were not read, so their rows are gone (deleted while nothing captured them), and they
        become tombstones. Returns how many; the caller commits."""
        w = self._writer
        w._begin()
        before = w.records_seq
        w._tombstone(
            Change(
                action="truncate",
                collection_id=collection_id,
                record_id=None,
                record=None,
                changes=None,
                missing=(),
                old_record_id=None,
                version=self.version,
                idx=SNAPSHOT_IDX,
                committed_at=self._ts,
            ),
            (collection_id,),
        )
        return w.records_seq - before
