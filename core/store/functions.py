"""The current body of every SQL function of the store, in one place.

``migrate`` (core/store/migrations.py) creates or replaces each of them after the numbered
migrations, on every start, under the migration lock: what runs is what this file says, also in
a store made by an earlier version. Migrations that created a function earlier stay as they
shipped (history); change a function here. A change of its arguments or result type needs a
numbered migration that drops the old one first (``CREATE OR REPLACE`` cannot change them).
"""

from __future__ import annotations

# Each function is SQL with {s} standing for the quoted schema name, and {consume_lock} for the
# key of the lock on a consumer's receives without the consumer's name, as a literal (the
# store's schema is in it: core/store/shared.py).
FUNCTIONS: dict[str, str] = {
    # The shard of a record of a connector split into p_shards (core/shards.py says why, and
    # computes the same in Python): the first 32 bits of the MD5 of collection/record_id.
    "shard_of": """
CREATE OR REPLACE FUNCTION {s}.shard_of(p_collection text, p_record text, p_shards integer)
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (('x' || left(md5(p_collection || '/' || coalesce(p_record, '')), 8))::bit(32)::bigint
            % p_shards)::integer
$$;
""",
    # One receive of the Consume API (core/store/consumers.py, docs/consume-api.md “Delivery”):
    # picks up to p_n deliverable rows of a consumer's queue and makes them invisible for p_wait_ms.
    # Deliverable: the lowest row of its group and visible. p_max_pending is a hard cap on the
    # outstanding rows (delivered, neither acked nor nacked, expired or not: the column
    # outstanding): an expired outstanding row is delivered again freely, being counted
    # already; a new or nacked row only within the room the cap leaves. Receives of a consumer
    # are serialised by an advisory lock; being one statement, the lock is held only for the
    # server's own work. Rows delivered p_max_deliver times come back with dead = true and
    # unchanged, for the caller to move to the failed list (they take no room). The plans stay
    # bounded when the queue's statistics are stale (a new or fast-changing queue): the
    # outstanding rows are counted by their partial index, the chosen rows are updated through
    # their ctid (a join on id could read the whole queue), and no bitmap scans (the in-flight
    # count's bitmap scan walked every dead index entry of the last ack_wait_ms on every call;
    # index scans mark them dead).
    "consumer_receive": """
CREATE OR REPLACE FUNCTION {s}.consumer_receive(p_consumer text, p_n integer, p_max_pending integer,
                                                p_wait_ms integer, p_max_deliver integer)
RETURNS TABLE (id bigint, sync_id uuid, seq bigint, deliver_count integer, dead boolean)
LANGUAGE plpgsql SET enable_bitmapscan = off AS $$
#variable_conflict use_column
DECLARE
    room integer;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended({consume_lock} || p_consumer, 0));
    SELECT p_max_pending - count(*) INTO room FROM (
        SELECT 1 FROM {s}.consumer_messages c
        WHERE c.consumer = p_consumer AND c.outstanding LIMIT p_max_pending) q;
    RETURN QUERY
    WITH cand AS (
        SELECT m.ctid AS tid, m.id, m.sync_id, m.seq, m.deliver_count, m.outstanding,
               (p_max_deliver > 0 AND m.deliver_count >= p_max_deliver) AS dead
        FROM {s}.consumer_messages m
        WHERE m.consumer = p_consumer AND m.not_visible_until <= now()
          AND (room > 0 OR m.outstanding
               OR (p_max_deliver > 0 AND m.deliver_count >= p_max_deliver))
          AND NOT EXISTS (SELECT 1 FROM {s}.consumer_messages o WHERE o.consumer = p_consumer
                          AND o.group_key = m.group_key AND o.id < m.id)
        ORDER BY m.id LIMIT p_n
    ), chosen AS (
        SELECT cand.* FROM (
            SELECT cand.*, row_number() OVER (
                PARTITION BY NOT cand.outstanding AND NOT cand.dead ORDER BY cand.id) AS r
            FROM cand) cand
        WHERE cand.dead OR cand.outstanding OR cand.r <= room
    ), upd AS (
        UPDATE {s}.consumer_messages m
        SET deliver_count = m.deliver_count + 1,
            not_visible_until = now() + make_interval(secs => p_wait_ms / 1000.0),
            outstanding = true
        WHERE m.ctid = ANY(ARRAY(SELECT chosen.tid FROM chosen WHERE NOT chosen.dead))
    )
    SELECT chosen.id, chosen.sync_id, chosen.seq, chosen.deliver_count, chosen.dead
    FROM chosen ORDER BY chosen.id;
END
$$;
""",
}
