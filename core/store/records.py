"""The records stream's rule: one current version per record, its newest. How a write's changes
collapse to the versions to index, how a change lacking values takes them from its record's
version before (on both streams), and the SQL that indexes versions and finds a collection's
live records (used by the writer of changes, the snapshot writer of backfills and seeds, and
retention).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NamedTuple

from core.envelope import RawJson, dumps
from core.store.change import Change


class Latest(NamedTuple):
    """A record's newest version in a write: the entry ``pos`` made it."""

    version: int
    idx: int
    deleted: bool
    pos: int


def collapse(latest: dict[tuple[str, str], Latest], ch: Change, pos: int) -> None:
    """Keep only the newest version of each record in a write (the records stream is
    compacted)."""
    assert ch.record_id is not None
    key = (ch.collection_id, ch.record_id)
    latest.pop(key, None)  # re-inserted: dict order is the order of the last change
    latest[key] = Latest(ch.version, ch.idx, ch.action == "delete", pos)


Row = dict[str, Any]  # a record's values (``RawJson`` for those read back from the store)
Lookup = Callable[[list[tuple[str, str]]], dict[tuple[str, str], Row]]


def source_of(ch: Change) -> tuple[str, str]:
    """The record whose previous version holds what ``ch`` lacks: its own, or for the insert
    of a key change the old key's (whose delete comes just before it)."""
    return ch.collection_id, ch.old_record_id or ch.record_id or ""


def lacks(ch: Change) -> bool:
    """Whether the WAL left values of ``ch`` out (docs/design.md “Values the WAL leaves out”)."""
    return bool(ch.missing or ch.old_missing)


class Previous:
    """The one rule for values the WAL leaves out (docs/design.md “Values the WAL leaves out”): a
    change's record takes the columns it lacks (``missing``: unchanged TOAST values, a delete's
    non-key columns) from its record's previous version, the change before it in the write or else
    the stored version; and a column whose old value was left out (``old_missing``) is in
    ``changes``, with that version's value, when the new value differs from it. Fed the
    changes of a write in order."""

    def __init__(self, changes: list[Change], lookup: Lookup) -> None:
        """``lookup``: the stored versions of records (called only when one is needed)."""
        self.active = any(map(lacks, changes))  # else every change is whole as it is
        needed = self._needed(changes) if self.active else []
        self.rows = lookup(needed) if needed else {}  # each record's newest version known
        self.unfilled: dict[str, str] = {}  # collection -> a record still lacking values

    @staticmethod
    def _needed(changes: list[Change]) -> list[tuple[str, str]]:
        """The records whose stored version a write needs: the sources of changes that lack
        values and that no change before them in the write gave."""
        given: set[tuple[str, str]] = set()
        out: list[tuple[str, str]] = []
        for ch in changes:
            if lacks(ch) and source_of(ch) not in given:
                out.append(source_of(ch))
            if ch.record_id is not None:
                given.add((ch.collection_id, ch.record_id))
        return out

    def complete(self, ch: Change) -> tuple[Row | None, dict[str, Any] | None]:
        """``ch``'s record with the values the WAL left out, and its ``changes``."""
        if not self.active or ch.record is None or ch.record_id is None:
            return ch.record, ch.changes
        record, changes = ch.record, ch.changes
        if lacks(ch):
            before = self.rows.get(source_of(ch), {})
            if ch.held_as is None:  # its names may be other columns' now: never a guess
                before = {}
            elif ch.held_as:  # a version holds one of a column's names: it is the column's
                before = before | {n: before[w] for n, ws in ch.held_as if n not in before
                                   for w in ws if w in before}  # fmt: skip
            record = {k: record.get(k, v) for k, v in before.items()
                      if k in record or k in ch.missing} | record  # fmt: skip
            if ch.old_missing:
                changes = dict(changes or {}) | {
                    k: before[k] for k in ch.old_missing
                    if k in before and k in record and dumps(before[k]) != dumps(record[k])
                }  # fmt: skip
            if ch.action != "delete" and any(k not in record for k in ch.missing):
                self.unfilled.setdefault(ch.collection_id, ch.record_id)
        self.rows[(ch.collection_id, ch.record_id)] = record
        return record, changes


def split_object(text: bytes) -> dict[str, RawJson]:
    """A JSON object's members, each value as the JSON text it is written with (numbers keep
    every digit)."""
    doc = text.decode()
    ws = " \t\n\r"
    pos = len(doc) - len(doc.lstrip(ws))
    if not doc.startswith("{", pos):
        return {}
    pos += 1
    decoder = json.JSONDecoder()
    out: dict[str, RawJson] = {}
    while True:
        while doc[pos] in ws:
            pos += 1
        if doc[pos] == "}":
            return out
        key, pos = json.decoder.scanstring(doc, pos + 1)  # type: ignore[attr-defined]
        while doc[pos] in ws or doc[pos] == ":":
            pos += 1
        _, end = decoder.raw_decode(doc, pos)
        out[key] = RawJson(doc[pos:end].encode())
        pos = end
        while doc[pos] in ws:
            pos += 1
        if doc[pos] == ",":
            pos += 1


# Each record's indexed (version, version_idx), found by a probe of the key: with a join, the
# planner may read every record of the source on every write when the index's statistics are
# stale (it read 10,000 for a write of 250). ``{keys}`` names the rows to probe for (u.c, u.t).
_PROBE = """
LEFT JOIN LATERAL (
    SELECT r.version, r.version_idx, r.deleted, r.batch, r.pos FROM {index} r
    WHERE r.record_id = u.t AND r.collection_id = u.c AND r.sync_id = %s LIMIT 1
) r ON true
"""

# One events batch of a source, and the newest version of each record it changes indexed (a
# version not newer than the indexed one is refused), numbered with consecutive seqs in their
# order; the source's counters move past both, its checkpoint to (commit, end) unless they are
# null, and its readers hear of it at commit. It takes the source's row lock, which every
# writer takes (``_lock_source``, core/store/record_writer.py). When it waited for that lock,
# its probe of the index saw the index as it was before the holder's writes (a backfill's newer
# rows): the update's own guard keeps those, and the seqs given to versions it left out are
# never used. Params by name: sid, the versions' collections (c), record tokens (t), versions
# (v), version_idxs (i), deleted (d) and entry positions (p), the batch's entries (n), first and
# last commit times, data, commit, end. Yields the source's events and records seqs now, and
# the versions' positions and seqs.
WRITE_BATCH = (
    """
WITH src AS (
    SELECT events_seq, records_seq FROM {sources} WHERE sync_id = %(sid)s FOR UPDATE
), incoming AS (
    SELECT u.*
    FROM unnest(%(c)s::text[], %(t)s::text[], %(v)s::int8[], %(i)s::int4[], %(d)s::bool[],
                %(p)s::int4[]) WITH ORDINALITY AS u(c, t, v, i, d, p, ord)"""
    + _PROBE.replace("%s", "%(sid)s")
    + """
    WHERE r.version IS NULL OR (r.version, r.version_idx) < (u.v, u.i)
), up AS (
    INSERT INTO {index} AS r (sync_id, collection_id, record_id, seq, version, version_idx,
                              deleted, batch, pos)
    SELECT %(sid)s, c, t, src.records_seq + row_number() OVER (ORDER BY ord), v, i, d,
           src.events_seq + 1, p
    FROM incoming, src
    ON CONFLICT (record_id, collection_id, sync_id) DO UPDATE SET
        seq = excluded.seq, version = excluded.version, version_idx = excluded.version_idx,
        deleted = excluded.deleted, updated_at = now(), batch = excluded.batch, pos = excluded.pos
    WHERE (r.version, r.version_idx) < (excluded.version, excluded.version_idx)
    RETURNING r.pos, r.seq
), versions AS (
    SELECT array_agg(pos ORDER BY pos) AS pos, array_agg(seq ORDER BY pos) AS seq,
           max(seq) AS last
    FROM up
), batch AS (
    INSERT INTO {events} (sync_id, first_seq, last_seq, first_committed_at, last_committed_at,
                          data, version_pos, version_seq)
    SELECT %(sid)s, src.events_seq + 1, src.events_seq + %(n)s, %(first)s, %(last)s, %(data)s,
           versions.pos, versions.seq
    FROM src, versions
), moved AS (
    -- reads src, so that src is read (and locked) before this changes its row: a row the
    -- statement changed is one FOR UPDATE skips, and then batch, when no version made up
    -- read src first (a truncate alone), inserted nothing
    UPDATE {sources} s SET events_seq = src.events_seq + %(n)s,
        records_seq = coalesce(v.last, src.records_seq),
        commit_lsn = coalesce(%(commit)s::int8, s.commit_lsn),
        end_lsn = coalesce(%(end)s::int8, s.end_lsn),
        updated_at = now()
    FROM versions v, src WHERE s.sync_id = %(sid)s
    RETURNING s.sync_id, s.events_seq, s.records_seq, v.pos, v.seq
)
SELECT events_seq, records_seq, pos, seq,
       pg_notify({channel}, sync_id::text || ':' || events_seq || ':' || records_seq)
FROM moved
"""
)

# Where each record of ``keys`` has its indexed version: (collection, token, batch, position,
# version, version_idx, deleted). Params: collections, tokens, sync_id.
LOOKUP = (
    "SELECT u.c, u.t, r.batch, r.pos, r.version, r.version_idx, r.deleted"
    " FROM unnest(%s::text[], %s::text[]) u(c, t)" + _PROBE.replace("LEFT JOIN", "JOIN")
)

# A collection's records that a truncate at (version, idx) makes tombstones, oldest seq first:
# (token, batch, position). Params: sync_id, collections, version, idx.
LIVE_BEFORE = """
SELECT record_id, collection_id, batch, pos FROM {index}
WHERE sync_id = %s AND collection_id = ANY(%s) AND NOT deleted
  AND (version, version_idx) < (%s, %s)
ORDER BY seq
"""

# Versions placed in a records batch (tombstones, rows of a backfill, versions kept after their
# batch was deleted), over what the index holds of their records: params collections, tokens,
# seqs, versions, idxs, deleted, batches, positions, sync_id. A version keeps the time it was
# written when only its place changes.
MOVE_VERSIONS = """
INSERT INTO {index} AS r (sync_id, collection_id, record_id, seq, version, version_idx, deleted,
                          batch, pos)
SELECT %s::uuid, c, t, s, v, i, d, b, p
FROM unnest(%s::text[], %s::text[], %s::int8[], %s::int8[], %s::int4[], %s::bool[], %s::int8[],
            %s::int4[]) AS u(c, t, s, v, i, d, b, p)
ON CONFLICT (record_id, collection_id, sync_id) DO UPDATE SET
    seq = excluded.seq, version = excluded.version, version_idx = excluded.version_idx,
    deleted = excluded.deleted, batch = excluded.batch, pos = excluded.pos,
    updated_at = CASE WHEN r.seq = excluded.seq THEN r.updated_at ELSE now() END
"""
