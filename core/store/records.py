"""The records stream's rule: one row per record, its newest version. How a batch of changes
collapses to the versions to store, and the SQL that upserts them and turns records into
tombstones (used by the writer of changes and by the snapshot writer of backfills and seeds).
"""

from __future__ import annotations

from typing import Any

from core.store.change import Change


def collapse(
    latest: dict[tuple[str, str], list[Any]],
    ch: Change,
    record_id: str | None,
    deleted: bool,
    record: dict[str, Any] | None,
    record_json: str | None,
    missing: tuple[str, ...],
    from_id: str | None = None,
) -> None:
    """Keep only the newest version of each record in a batch (the records stream is compacted).

    A version with unknown columns takes theirs from the version before it in the batch; those
    still unknown come from the stored record of ``from_id`` (a row whose key changed), else of
    its own id.
    """
    assert record_id is not None and record is not None
    key = (ch.collection_id, record_id)
    prev = latest.pop(key, None)  # re-insert: dict order becomes the order of the last change
    if prev is not None and missing and from_id is None:
        known = {k: v for k, v in prev[4].items() if k in missing}
        record = {**known, **record}
        missing = tuple(k for k in missing if k not in known)
        record_json, from_id = None, prev[7]
    latest[key] = [ch.version, ch.idx, deleted, missing, record, record_json, ch.committed_at,
                   from_id]  # fmt: skip


def moved(latest: dict[tuple[str, str], list[Any]], ch: Change) -> None:
    """An update that changed a row's key: the old record id becomes a tombstone (with the
    values known of it), and the new one takes the values the update left out from the old."""
    assert ch.record is not None and ch.old_record_id is not None
    collapse(latest, ch, ch.old_record_id, True, {}, None, (*ch.record, *ch.missing))
    old = latest[(ch.collection_id, ch.old_record_id)]
    record = {**{k: v for k, v in old[4].items() if k in ch.missing}, **ch.record}
    missing = tuple(k for k in ch.missing if k not in record)
    source = (old[7] or ch.old_record_id) if missing else None
    collapse(latest, ch, ch.record_id, False, record, None, missing, source)


# An accepted version replaces the stored one: it takes a new seq (the records stream's order).
REPLACE_RECORD = """
ON CONFLICT (sync_id, collection_id, record_id) DO UPDATE SET
    seq = excluded.seq, version = excluded.version, version_idx = excluded.version_idx,
    deleted = excluded.deleted, record = excluded.record,
    upstream_updated_at = excluded.upstream_updated_at, updated_at = now()
"""
# Inserts or replaces the latest version of each record, refusing any that is not newer than the
# stored one, and numbers the accepted ones with consecutive seqs in batch order. Answers how many
# it accepted, and the live ones still without some of the columns Postgres left out of their
# change (unchanged TOASTed values): the store held no full version of them to take those from.
UPSERT_RECORDS = (
    """
WITH incoming AS (
    SELECT u.collection_id, u.record_id, u.full_record_id, u.version, u.version_idx, u.deleted,
           u.ord, u.upstream_updated_at, u.missing,
           CASE WHEN u.missing IS NULL THEN u.record
                ELSE (SELECT coalesce(jsonb_object_agg(e.key, e.value), '{{}}')
                      FROM {records} f, jsonb_each(f.record) e
                      WHERE f.sync_id = %s AND f.collection_id = u.collection_id
                        AND f.record_id = coalesce(u.from_id, u.record_id) AND u.missing ? e.key)
                     || u.record END AS record
    FROM unnest(%b::text[], %b::text[], %b::int8[], %b::int4[], %b::bool[], %b::text[]::jsonb[],
                %b::text[]::jsonb[], %b::text[]::timestamptz[], %b::text[], %b::text[])
         WITH ORDINALITY
         AS u(collection_id, record_id, version, version_idx, deleted, missing, record,
              upstream_updated_at, full_record_id, from_id, ord)
    LEFT JOIN {records} r
           ON r.sync_id = %s AND r.collection_id = u.collection_id AND r.record_id = u.record_id
    WHERE r.record_id IS NULL OR (r.version, r.version_idx) < (u.version, u.version_idx)
), upserted AS (
INSERT INTO {records} AS r (sync_id, collection_id, record_id, full_record_id, seq, version,
                            version_idx, deleted, record, upstream_updated_at)
SELECT %s::uuid, collection_id, record_id, full_record_id,
       %s::int8 + row_number() OVER (ORDER BY ord),
       version, version_idx, deleted, record, upstream_updated_at
FROM incoming
"""
    + REPLACE_RECORD
    + """
RETURNING 1
), unfilled AS (
    SELECT collection_id, coalesce(full_record_id, record_id) AS record_id, ord FROM incoming
    WHERE missing IS NOT NULL AND NOT deleted
      AND NOT record ?& ARRAY(SELECT jsonb_array_elements_text(missing))
)
SELECT (SELECT count(*) FROM upserted),
       (SELECT array_agg(DISTINCT collection_id) FROM unfilled),
       (SELECT (array_agg(record_id ORDER BY ord))[1:3] FROM unfilled)
"""
)

# A truncate turns every live record of the collection older than it into a tombstone. It reads
# every record of the source, as the key leads with the record id (migration 7).
TRUNCATE_RECORDS = """
WITH doomed AS (
    SELECT collection_id, record_id, row_number() OVER (ORDER BY seq) AS n
    FROM {records}
    WHERE sync_id = %(sid)s AND collection_id = ANY(%(collections)s) AND NOT deleted
      AND (version, version_idx) < (%(version)s, %(idx)s)
)
UPDATE {records} r
SET deleted = true, seq = %(base)s + doomed.n, version = %(version)s, version_idx = %(idx)s,
    upstream_updated_at = %(ts)s, updated_at = now()
FROM doomed
WHERE r.sync_id = %(sid)s AND r.collection_id = doomed.collection_id
  AND r.record_id = doomed.record_id
"""
