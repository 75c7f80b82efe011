"""The records stream's rule: one current version per record, its newest. How a write's changes
collapse to the versions to index, how a version missing columns takes them from the one
before, and the SQL that indexes versions and finds a collection's live records (used by the
writer of changes, the snapshot writer of backfills and seeds, and retention).
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

from core.envelope import RawJson, dumps
from core.store.change import Change


class Latest(NamedTuple):
    """A record's newest version in a write: the entry ``pos`` made it. ``missing`` names the
    columns still unknown (to take from the stored version of ``from_id``, else its own)."""

    version: int
    idx: int
    deleted: bool
    missing: tuple[str, ...]
    record: dict[str, Any]
    pos: int
    from_id: str | None
    own: bool  # ``record`` is the change's own (no column taken from another version)


def collapse(latest: dict[tuple[str, str], Latest], ch: Change, pos: int, record_id: str,
             deleted: bool, record: dict[str, Any], missing: tuple[str, ...],
             from_id: str | None = None) -> None:  # fmt: skip
    """Keep only the newest version of each record in a write (the records stream is
    compacted). A version with unknown columns takes theirs from the version before it in the
    write; those still unknown come from the stored version (of ``from_id``, else its own)."""
    key = (ch.collection_id, record_id)
    prev = latest.pop(key, None)  # re-inserted: dict order is the order of the last change
    if prev is not None and missing and from_id is None:
        known = {k: v for k, v in prev.record.items() if k in missing}
        record = {**known, **record}
        missing = tuple(k for k in missing if k not in known)
        from_id = prev.from_id
    own = record is ch.record
    latest[key] = Latest(ch.version, ch.idx, deleted, missing, record, pos, from_id, own)


def moved(latest: dict[tuple[str, str], Latest], ch: Change, pos: int) -> None:
    """An insert whose row had another key before (its delete came just before it, under the
    old key): it takes the values it lacks from the old record."""
    assert ch.record is not None and ch.record_id is not None and ch.old_record_id is not None
    old = latest.get((ch.collection_id, ch.old_record_id))
    record, missing = ch.record, ch.missing
    if old is not None:
        record = {**{k: v for k, v in old.record.items() if k in missing}, **record}
        missing = tuple(k for k in missing if k not in record)
    source = ((old.from_id if old else None) or ch.old_record_id) if missing else None
    collapse(latest, ch, pos, ch.record_id, False, record, missing, source)


def merged(
    stored: bytes, record: dict[str, Any], missing: tuple[str, ...]
) -> tuple[bytes, list[str]]:
    """A version's record with the ``missing`` columns it lacks taken from ``stored`` (the
    JSON of the version before, its values kept as written); and those ``stored`` lacks too."""
    before = split_object(stored)
    wanted = set(missing)
    # In the order of the version before (the table's columns), then the new ones.
    out = {k: record.get(k, v) for k, v in before.items() if k in record or k in wanted}
    out.update(record)
    return dumps(out), [k for k in missing if k not in before]


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
# writer takes (``_lock_source``). Params by name: sid, the versions' collections (c), record
# tokens (t), versions (v), version_idxs (i), deleted (d) and entry positions (p), the batch's
# entries (n), first and last commit times, data, commit, end. Yields the source's events and
# records seqs now, and the versions' positions and seqs.
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
    RETURNING r.pos, r.seq
), versions AS (
    SELECT array_agg(pos ORDER BY pos) AS pos, array_agg(seq ORDER BY pos) AS seq, count(*) AS n
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
        records_seq = src.records_seq + v.n,
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
