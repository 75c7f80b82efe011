"""Writes rows read from a source table (the seed job, backfills) into a source's records
stream, with the snapshot version guard (DESIGN.md section 13): a row never replaces a newer
live change.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from psycopg import errors, sql

from core.envelope import MAX_RECORD_TOKEN, RECORD_TOKEN_SQL
from core.store import Conn, Store
from core.store.records import REPLACE_RECORD, TRUNCATE_RECORDS
from core.store.writer import ADD_FAILURE, _advance, _lock_source

# The records stream's key is the record token (core/envelope.py); a long record id is kept
# whole beside it. The snapshot merges make both from the staged record id.
_KEYS_SQL = (
    RECORD_TOKEN_SQL.format(c="s.record_id") + " AS record_id, CASE WHEN"
    f" octet_length(s.record_id) > {MAX_RECORD_TOKEN} THEN s.record_id END AS full_record_id"
)

log = logging.getLogger("weir.store")
SNAPSHOT_IDX = -1  # the version_idx of rows read from a table: below every captured change

# Snapshot rows carry version (L, -1): they replace only records older than L (DESIGN.md 13).
# Every writer of a source holds its lock (_lock_source), so no record appears while a merge
# runs, and a merge is one of two statements:
# - INSERT_SNAPSHOT, while no staged row has met a stored record: a plain insert of them all,
#   numbered by their order in the chunk: the ``ord`` the writer staged with them, since
#   ``row_number() OVER ()`` here cost 0.6-1.2 us a row more, under the lock (400k rows, two
#   runs). A stored record makes it fail (records_pkey) and roll back, and the writer turns
#   to MERGE_SNAPSHOT. A seed's rows are nearly all new, and the insert's own uniqueness check
#   is the only lookup: it costs ~35% less than the merge.
# - MERGE_SNAPSHOT looks up each row's stored version (LATERAL ... LIMIT 1, an index probe each:
#   a hash join would read every record of the source on every merge). New records go in by a
#   plain insert, ~30% cheaper than a speculative one (EXPLAIN: 103 against 142 ms for 20k
#   rows), and only the stored ones through ON CONFLICT. (Capture's upsert keeps one INSERT ...
#   ON CONFLICT: there, this split made updates ~10% slower, for inserts ~13% quicker.)
# Both yield how many rows were accepted.
# The accepted rows into the records stream; ``which`` picks the new or the stored ones.
_INSERT_ACCEPTED = """
INSERT INTO {{records}} AS r (sync_id, collection_id, record_id, full_record_id, seq, version,
                            version_idx, deleted, record, upstream_updated_at)
SELECT %(sid)s, %(collection)s, record_id, full_record_id, seq, %(version)s, %(idx)s, false,
       record, %(at)s
FROM accepted WHERE {which}
"""
INSERT_SNAPSHOT = (
    """
WITH accepted AS (
    SELECT """
    + _KEYS_SQL
    + """, s.record, %(base)s::int8 + s.ord AS seq
    FROM weir_snapshot_stage s
)"""
    + _INSERT_ACCEPTED.format(which="true")
)
MERGE_SNAPSHOT = (
    """
WITH keyed AS (
    SELECT """
    + _KEYS_SQL
    + """, s.record FROM weir_snapshot_stage s
), accepted AS (
    SELECT s.record_id, s.full_record_id, s.record, o.version IS NOT NULL AS stored,
           %(base)s::int8 + row_number() OVER () AS seq
    FROM keyed s
    LEFT JOIN LATERAL (
        SELECT o.version, o.version_idx FROM {records} o
        WHERE o.sync_id = %(sid)s AND o.collection_id = %(collection)s
          AND o.record_id = s.record_id
        LIMIT 1
    ) o ON true
    WHERE o.version IS NULL OR (o.version, o.version_idx) < (%(version)s, %(idx)s)
), added AS ("""
    + _INSERT_ACCEPTED.format(which="NOT stored")
    + """RETURNING 1
), replaced AS ("""
    + _INSERT_ACCEPTED.format(which="stored")
    + REPLACE_RECORD
    + """RETURNING 1
)
SELECT (SELECT count(*) FROM added) + (SELECT count(*) FROM replaced)
"""
)


class SnapshotWriter:
    """Writes rows read from a source table (seed job, backfill) into the records stream.

    ``write`` stages a chunk of rows by COPY into a temporary table with no lock held, so
    several writers (Spark partitions) stage in parallel. It then takes the source row's lock,
    the one every writer of the source takes (which keeps seqs gap-free and in commit order),
    and upserts the staged rows whose version is newer than the stored one. It does not commit:
    the caller commits, with its own progress in the same transaction, and so releases the lock.
    """

    def __init__(
        self, conn: Conn, store: Store, sync_id: uuid.UUID, version: int, at: datetime
    ) -> None:
        self.conn = conn
        self.sync_id = sync_id
        self.version = version
        self.at = at
        self._all_new = True  # no staged row has met a stored record yet: INSERT_SNAPSHOT
        self._lock_row = _lock_source(store)
        records = store.table("records")
        self._insert = sql.SQL(INSERT_SNAPSHOT).format(records=records)
        self._merge = sql.SQL(MERGE_SNAPSHOT).format(records=records)
        self._sweep = sql.SQL(TRUNCATE_RECORDS).format(records=records)
        self._advance = _advance(store, ("records_seq",))
        self._refuse = sql.SQL(ADD_FAILURE).format(store.table("source_failures"))
        conn.execute(
            "CREATE TEMP TABLE IF NOT EXISTS weir_snapshot_stage"
            " (ord int8, record_id text, record jsonb) ON COMMIT DELETE ROWS"
        )

    def write(self, collection_id: str, rows: Iterable[bytes]) -> tuple[int, int]:
        """Stage rows of one collection and merge them; returns (staged, accepted).

        A row is ``record id <tab> record JSON <newline>`` in COPY's text format, UTF-8
        (``core.sources.pg.snapshot.records_of``, or the source server's own COPY of such rows).
        """
        n = 0
        with self.conn.cursor() as cur, cur.copy("COPY weir_snapshot_stage FROM STDIN") as copy:
            block: list[bytes] = []
            for row in rows:
                n += 1
                block.append(b"%d\t%b" % (n, row))
                if len(block) == 1000:  # a write per row costs 0.6-1.6 us a row more
                    copy.write(b"".join(block))
                    block.clear()
            if block:
                copy.write(b"".join(block))
        return n, self._merge_staged(collection_id) if n else 0

    def refuse(self, collection_id: str, record_id: str, reason: str) -> None:
        """Put a row the store refused on the source's failed list, at the snapshot's
        version, with why (which names it)."""
        log.warning("on the source's failed list (weir.source_failures): %s", reason)
        self.conn.execute(self._refuse, (self.sync_id, self.version, SNAPSHOT_IDX,
                                         collection_id, record_id, "backfill", reason))  # fmt: skip

    def _merge_staged(self, collection_id: str) -> int:
        """Upsert the staged rows that are newer than the stored versions; returns how many."""
        row = self.conn.execute(self._lock_row, (self.sync_id,)).fetchone()
        assert row is not None, "source not registered"
        base = int(row[1])  # type: ignore[call-overload]
        params = {"sid": self.sync_id, "collection": collection_id, "base": base,
                  "version": self.version, "idx": SNAPSHOT_IDX, "at": self.at}  # fmt: skip
        accepted = self._insert_all(params) if self._all_new else None
        if accepted is None:
            with self.conn.cursor() as cur:
                cur.execute(self._merge, params)
                counted = cur.fetchone()
                assert counted is not None
                accepted = int(counted[0])  # type: ignore[call-overload]
        if accepted:
            self.conn.execute(self._advance, (base + accepted, self.sync_id))
        return accepted

    def sweep(self, collection_id: str) -> int:
        """Once every row of the table was written: its live records older than the snapshot
        were not read, so their rows are gone (deleted while nothing captured them), and they
        become tombstones. Returns how many; the caller commits."""
        row = self.conn.execute(self._lock_row, (self.sync_id,)).fetchone()
        assert row is not None, "source not registered"
        base = int(row[1])  # type: ignore[call-overload]
        gone = self.conn.execute(self._sweep, {
            "sid": self.sync_id, "collections": [collection_id], "version": self.version,
            "idx": SNAPSHOT_IDX, "ts": self.at, "base": base,
        }).rowcount  # fmt: skip
        if gone:
            self.conn.execute(self._advance, (base + gone, self.sync_id))
        return gone

    def _insert_all(self, params: dict[str, Any]) -> int | None:
        """INSERT_SNAPSHOT in a savepoint; None when a staged row met a stored record."""
        try:
            with self.conn.transaction(), self.conn.cursor() as cur:
                cur.execute(self._insert, params)
                return cur.rowcount
        except errors.UniqueViolation as e:
            if e.diag.constraint_name != "records_pkey":
                raise
            self._all_new = False
            return None
