"""The store's numbered migrations, as they shipped: never edited, only added to (the
functions they made have their current bodies in core/store/functions.py). Applied by
core/store/migrations.py. The first nine are here, the later ones in history_later.py.
"""

from __future__ import annotations

from core.store.history_later import LATER

# Each migration is SQL with {s} standing for the quoted schema name.
MIGRATIONS: list[tuple[int, str, str]] = [
    (
        1,
        "sources, events stream, records stream, cursors",
        """
CREATE TABLE {s}.sources (
    sync_id      uuid PRIMARY KEY,
    name         text NOT NULL UNIQUE,
    kind         text NOT NULL,
    provider     text NOT NULL,
    events_seq   bigint NOT NULL DEFAULT 0,  -- last seq given out in the events stream
    records_seq  bigint NOT NULL DEFAULT 0,  -- last seq given out in the records stream
    commit_lsn   bigint NOT NULL DEFAULT 0,  -- last captured commit (postgres sources)
    end_lsn      bigint NOT NULL DEFAULT 0,  -- its end: where replication resumes
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

-- Every change, append-only, pruned by age.
CREATE TABLE {s}.events (
    sync_id       uuid NOT NULL,
    seq           bigint NOT NULL,
    collection_id text NOT NULL,
    record_id     text,                       -- null for truncate
    action        text NOT NULL,              -- insert | update | delete | truncate
    commit_lsn    bigint NOT NULL,
    commit_idx    integer NOT NULL,           -- position in its transaction
    committed_at  timestamptz NOT NULL,
    record        jsonb,
    changes       jsonb,
    inserted_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sync_id, seq)
);
CREATE INDEX events_inserted_at ON {s}.events USING brin (inserted_at);

-- The latest version of every record; a new version takes a new seq. Deletes stay as
-- tombstones. (version, version_idx) only grows: no writer replaces a newer version.
CREATE TABLE {s}.records (
    sync_id             uuid NOT NULL,
    collection_id       text NOT NULL,
    record_id           text NOT NULL,
    seq                 bigint NOT NULL,
    version             bigint NOT NULL,
    version_idx         integer NOT NULL,
    deleted             boolean NOT NULL,
    record              jsonb NOT NULL,
    upstream_updated_at timestamptz,
    updated_at          timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sync_id, collection_id, record_id)
);
CREATE UNIQUE INDEX records_seq ON {s}.records (sync_id, seq);

-- Where each connector is in each source's stream, and what the broker had taken.
CREATE TABLE {s}.cursors (
    connector    text NOT NULL,
    sync_id      uuid NOT NULL,
    stream       text NOT NULL,
    seq          bigint NOT NULL,
    broker_state jsonb,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connector, sync_id)
);
""",
    ),
    (
        2,
        "failed messages of connectors",
        """
-- Messages a connector gave up on after its retry policy, with the broker's last error.
CREATE TABLE {s}.failed_messages (
    connector        text NOT NULL,
    sync_id          uuid NOT NULL,
    stream           text NOT NULL,
    seq              bigint NOT NULL,
    group_key        text NOT NULL,
    idempotency_key  text NOT NULL,
    attempts         integer NOT NULL,
    error            text NOT NULL,
    payload          text NOT NULL,
    failed_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (connector, sync_id, seq)
);
""",
    ),
    (  # consumer_receive as it shipped; its current body is in core/store/functions.py
        3,
        "HTTP pull consumers and their queues",
        """
-- Consumers of the Consume API; 'config' ones are declared in YAML, 'api' ones were POSTed.
CREATE TABLE {s}.consumers (
    name        text PRIMARY KEY,
    stream      text NOT NULL,
    config      jsonb NOT NULL,
    origin      text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

-- A consumer's queue: the stream messages it selected and has not yet had acknowledged.
-- Payloads stay in the streams; a row is a reference plus its delivery state. Within a group
-- only the row with the lowest id is deliverable, so a group's messages go out one at a time.
CREATE TABLE {s}.consumer_messages (
    consumer           text NOT NULL,
    id                 bigint GENERATED ALWAYS AS IDENTITY,
    sync_id            uuid NOT NULL,
    seq                bigint NOT NULL,
    group_key          text NOT NULL,
    deliver_count      integer NOT NULL DEFAULT 0,
    not_visible_until  timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (consumer, id)
);
CREATE INDEX consumer_messages_group ON {s}.consumer_messages (consumer, group_key, id);
CREATE INDEX consumer_messages_visible ON {s}.consumer_messages (consumer, not_visible_until);

-- One receive: picks up to n deliverable rows (the lowest row of each group, visible, new ones
-- only while fewer than max_pending are outstanding) and makes them invisible for wait_ms.
-- Receives of a consumer are serialised by an advisory lock; being one statement, the lock is
-- held only for the server's own work. Rows delivered max_deliver times come back with
-- dead = true and unchanged, for the caller to move to the failed list.
CREATE FUNCTION {s}.consumer_receive(p_consumer text, p_n integer, p_max_pending integer,
                                     p_wait_ms integer, p_max_deliver integer)
RETURNS TABLE (id bigint, sync_id uuid, seq bigint, deliver_count integer, dead boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    room integer;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('weir:consume:' || p_consumer, 0));
    SELECT p_max_pending - count(*) INTO room FROM (
        SELECT 1 FROM {s}.consumer_messages c
        WHERE c.consumer = p_consumer AND c.not_visible_until > now() LIMIT p_max_pending) q;
    RETURN QUERY
    WITH cand AS (
        SELECT m.id, m.sync_id, m.seq, m.deliver_count,
               (p_max_deliver > 0 AND m.deliver_count >= p_max_deliver) AS dead
        FROM {s}.consumer_messages m
        WHERE m.consumer = p_consumer AND m.not_visible_until <= now()
          AND (m.deliver_count > 0 OR room > 0)
          AND NOT EXISTS (SELECT 1 FROM {s}.consumer_messages o WHERE o.consumer = p_consumer
                          AND o.group_key = m.group_key AND o.id < m.id)
        ORDER BY m.id LIMIT p_n
    ), chosen AS (
        SELECT cand.* FROM (
            SELECT cand.*, row_number() OVER (
                PARTITION BY cand.deliver_count = 0 AND NOT cand.dead ORDER BY cand.id) AS r
            FROM cand) cand
        WHERE cand.dead OR cand.deliver_count > 0 OR cand.r <= room
    ), upd AS (
        UPDATE {s}.consumer_messages m
        SET deliver_count = m.deliver_count + 1,
            not_visible_until = now() + make_interval(secs => p_wait_ms / 1000.0)
        FROM chosen
        WHERE m.consumer = p_consumer AND m.id = chosen.id AND NOT chosen.dead
    )
    SELECT chosen.id, chosen.sync_id, chosen.seq, chosen.deliver_count, chosen.dead
    FROM chosen ORDER BY chosen.id;
END
$$;
""",
    ),
    (
        4,
        "who owns which work (core/runtime/leases.py)",
        """
-- Written by the owner when it takes the work, with a heartbeat; for `weir status`. The lease
-- itself is a session advisory lock, which ends with the owner's connection.
CREATE TABLE {s}.owners (
    work       text PRIMARY KEY,      -- source:NAME | connector:NAME
    instance   text NOT NULL,
    since      timestamptz NOT NULL DEFAULT now(),
    heartbeat  timestamptz NOT NULL DEFAULT now()
);
""",
    ),
    (
        5,
        "table backfills and where they are",
        """
-- One row per table backfilled into a source's records stream: the snapshot version its rows
-- carry, and the keyset position of the last page written, so that a backfill resumes there.
CREATE TABLE {s}.backfills (
    sync_id        uuid NOT NULL,
    collection_id  text NOT NULL,
    keyset         text[] NOT NULL,   -- the columns paged by, in order
    version        bigint NOT NULL,   -- the snapshot LSN (version_idx -1)
    snapshot_at    timestamptz NOT NULL,
    last_key       text[],            -- the keyset values of the last row written
    rows_total     bigint NOT NULL,   -- rows in the table when it started (for progress)
    rows_read      bigint NOT NULL DEFAULT 0,
    rows_written   bigint NOT NULL DEFAULT 0,  -- the others were older than a live change
    started_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz,
    PRIMARY KEY (sync_id, collection_id)
);
""",
    ),
    (  # history: consumer_receive's current body is in core/store/functions.py
        6,
        "consumer_receive updates the rows it chose through their ctid, without bitmap scans",
        """
-- As in version 3, but with plans that stay bounded when the queue's statistics are stale (a
-- new or fast-changing queue): the chosen rows are updated through their ctid (a join on id
-- could read the whole queue), and no bitmap scans (the in-flight count's bitmap scan walked
-- every dead index entry of the last ack_wait_ms on every call; index scans mark them dead).
CREATE OR REPLACE FUNCTION {s}.consumer_receive(p_consumer text, p_n integer, p_max_pending integer,
                                                p_wait_ms integer, p_max_deliver integer)
RETURNS TABLE (id bigint, sync_id uuid, seq bigint, deliver_count integer, dead boolean)
LANGUAGE plpgsql SET enable_bitmapscan = off AS $$
#variable_conflict use_column
DECLARE
    room integer;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('weir:consume:' || p_consumer, 0));
    SELECT p_max_pending - count(*) INTO room FROM (
        SELECT 1 FROM {s}.consumer_messages c
        WHERE c.consumer = p_consumer AND c.not_visible_until > now() LIMIT p_max_pending) q;
    RETURN QUERY
    WITH cand AS (
        SELECT m.ctid AS tid, m.id, m.sync_id, m.seq, m.deliver_count,
               (p_max_deliver > 0 AND m.deliver_count >= p_max_deliver) AS dead
        FROM {s}.consumer_messages m
        WHERE m.consumer = p_consumer AND m.not_visible_until <= now()
          AND (m.deliver_count > 0 OR room > 0)
          AND NOT EXISTS (SELECT 1 FROM {s}.consumer_messages o WHERE o.consumer = p_consumer
                          AND o.group_key = m.group_key AND o.id < m.id)
        ORDER BY m.id LIMIT p_n
    ), chosen AS (
        SELECT cand.* FROM (
            SELECT cand.*, row_number() OVER (
                PARTITION BY cand.deliver_count = 0 AND NOT cand.dead ORDER BY cand.id) AS r
            FROM cand) cand
        WHERE cand.dead OR cand.deliver_count > 0 OR cand.r <= room
    ), upd AS (
        UPDATE {s}.consumer_messages m
        SET deliver_count = m.deliver_count + 1,
            not_visible_until = now() + make_interval(secs => p_wait_ms / 1000.0)
        WHERE m.ctid = ANY(ARRAY(SELECT chosen.tid FROM chosen WHERE NOT chosen.dead))
    )
    SELECT chosen.id, chosen.sync_id, chosen.seq, chosen.deliver_count, chosen.dead
    FROM chosen ORDER BY chosen.id;
END
$$;
""",
    ),
    (
        7,
        "the records' primary key leads with the record id",
        """
-- The key led with sync_id and collection_id, the same for every record of a table, so each step
-- of an index search compared three columns to place one record id; led by the record id, most
-- steps compare one. A seed of 2M rows ran 1.02-1.42x faster (11 alternating pairs, median
-- 1.17x), its merges being mostly this index's inserts. Every lookup gives all three columns.
-- Rebuilding the index holds the records table while it runs: 1.4 s for 2M records on the
-- development machine.
ALTER TABLE {s}.records DROP CONSTRAINT records_pkey,
    ADD CONSTRAINT records_pkey PRIMARY KEY (record_id, collection_id, sync_id);
""",
    ),
    (
        8,
        "long record ids kept whole beside their key; slots held to the store; backfill requests;"
        " the state of each work; the key of each collection; source failures",
        """
-- A record id longer than 256 bytes is keyed by '~' and its SHA-256 hex (core/envelope.py
-- record_token), as subjects name it: an index entry cannot hold more than ~2.7 kB. The id
-- itself is kept beside it.
ALTER TABLE {s}.records ADD COLUMN full_record_id text;
UPDATE {s}.records
SET full_record_id = record_id,
    record_id = '~' || encode(sha256(convert_to(record_id, 'UTF8')), 'hex')
WHERE octet_length(record_id) > 256;

-- Set once capture holds the replication slot to end_lsn (core/sources/pg/slot.py): from then on a
-- slot found beyond end_lsn, dropped or invalidated has lost changes.
ALTER TABLE {s}.sources ADD COLUMN slot_tracked boolean NOT NULL DEFAULT false,
    ADD COLUMN slot_name text;

-- What weir status says of each work: its state and why, as its owner last reported them.
ALTER TABLE {s}.owners ADD COLUMN state text, ADD COLUMN detail text;

-- Each collection's table as capture last saw it: the columns its records are keyed by (when
-- they change, the table is backfilled, so its records are keyed anew and the old ones become
-- tombstones) and its oid (a table renamed, or dropped, is known by it).
CREATE TABLE {s}.collections (
    sync_id        uuid NOT NULL,
    collection_id  text NOT NULL,
    key_columns    text[] NOT NULL,
    relid          bigint NOT NULL,
    PRIMARY KEY (sync_id, collection_id)
);

-- Changes of a source the store could not hold (on_unstorable: fail), with why.
CREATE TABLE {s}.source_failures (
    sync_id        uuid NOT NULL,
    commit_lsn     bigint NOT NULL,
    commit_idx     integer NOT NULL,
    collection_id  text NOT NULL,
    record_id      text,
    action         text NOT NULL,
    error          text NOT NULL,
    failed_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sync_id, commit_lsn, commit_idx)
);

-- Tables capture asked to have backfilled: after a slot was lost, or when a table joined a
-- followed schema while Weir was not running. Deleted when the backfill finishes.
CREATE TABLE {s}.backfill_requests (
    sync_id       uuid NOT NULL,
    schema_name   text NOT NULL,
    table_name    text NOT NULL,
    reason        text NOT NULL,
    requested_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sync_id, schema_name, table_name)
);
""",
    ),
    (
        9,
        "source failures of a row without a key, and of a backfill",
        """
-- Changes of a source the store could not hold or capture could not key (on_unstorable: fail),
-- and rows a backfill could not store (action 'backfill', at its snapshot), with why. A
-- refused change is charged alone, so one transaction (or backfill page) may put several on
-- the list: the record is part of the key, '' for a change that has none.
UPDATE {s}.source_failures SET record_id = '' WHERE record_id IS NULL;
ALTER TABLE {s}.source_failures ALTER COLUMN record_id SET NOT NULL,
    DROP CONSTRAINT source_failures_pkey,
    ADD PRIMARY KEY (sync_id, commit_lsn, commit_idx, collection_id, record_id);
""",
    ),
    *LATER,
]
