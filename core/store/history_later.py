"""The store's migrations from 10 on (core/store/history.py has the first nine and says how
they are kept)."""

from __future__ import annotations

# Each migration is SQL with {s} standing for the quoted schema name.
LATER: list[tuple[int, str, str]] = [
    (
        10,
        "consumer queue rows say whether they are outstanding: max_ack_pending is a hard cap",
        """
-- Outstanding: delivered and neither acked nor nacked, whether or not its visibility timeout
-- ran out (docs/consume-api.md “Delivery”). Set on delivery, cleared by nack; ack deletes the
-- row. A nacked row and one whose visibility ran out looked alike (both visible), yet only the
-- nacked one takes room under max_ack_pending when delivered again. Rows delivered before count as
-- outstanding while their visibility lasts. The partial index serves the count of a receive.
ALTER TABLE {s}.consumer_messages ADD COLUMN outstanding boolean NOT NULL DEFAULT false;
UPDATE {s}.consumer_messages SET outstanding = true WHERE not_visible_until > now();
CREATE INDEX consumer_messages_outstanding ON {s}.consumer_messages (consumer) WHERE outstanding;
""",
    ),
    (
        11,
        "paused and API-made connectors, retries asked of failed lists",
        """
-- Connectors an operator paused (weir connector pause, the management API): no instance runs
-- them until resumed; their cursors stay where they were.
CREATE TABLE {s}.connector_controls (
    name       text PRIMARY KEY,
    paused     boolean NOT NULL DEFAULT false,
    changed_at timestamptz NOT NULL DEFAULT now()
);

-- Connectors made over the management API (a connector's config as YAML gives it, as JSON):
-- run by every instance beside the file's, picked up within seconds.
CREATE TABLE {s}.api_connectors (
    name       text PRIMARY KEY,
    config     jsonb NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT now()
);

-- A failed message an operator asked to retry: its connector sends it again (in order for its
-- group) and takes it off the list once the broker has it; failing again clears the request.
ALTER TABLE {s}.failed_messages ADD COLUMN retry_requested_at timestamptz;
CREATE INDEX failed_messages_retry ON {s}.failed_messages (connector, sync_id)
    WHERE retry_requested_at IS NOT NULL;
""",
    ),
    (  # its second half, moving what the old tables held, is core/store/upgrade.py
        12,
        "streams as batches of entries; the records stream's index unlogged",
        """
-- The events stream: one row per store write, its changes as entries (core/store/batches.py),
-- entry i having seq first_seq + i. Their JSON is kept as the bytes that are sent, compressed
-- by Weir, so the column is not compressed again. Deleted a batch at a time by retention.
-- version_pos and version_seq: the entries that made a records-stream version, and its seq.
CREATE TABLE {s}.event_batches (
    sync_id             uuid NOT NULL,
    first_seq           bigint NOT NULL,
    last_seq            bigint NOT NULL,
    first_committed_at  timestamptz NOT NULL,  -- of its entries, for start positions by time
    last_committed_at   timestamptz NOT NULL,
    inserted_at         timestamptz NOT NULL DEFAULT now(),
    data                bytea NOT NULL,
    version_pos         integer[],
    version_seq         bigint[],
    PRIMARY KEY (sync_id, first_seq)
);
ALTER TABLE {s}.event_batches ALTER COLUMN data SET STORAGE EXTERNAL,
    ALTER COLUMN version_pos SET STORAGE EXTERNAL, ALTER COLUMN version_seq SET STORAGE EXTERNAL;
CREATE INDEX event_batches_last ON {s}.event_batches (sync_id, last_seq);
CREATE INDEX event_batches_inserted_at ON {s}.event_batches USING brin (inserted_at);
CREATE INDEX event_batches_committed_at ON {s}.event_batches USING brin (last_committed_at);

-- Records-stream versions that no change of the events stream carries: rows of backfills and
-- seeds, tombstones of truncated and dropped tables, and versions moved out of events batches
-- that retention deleted.
CREATE TABLE {s}.record_batches (
    sync_id      uuid NOT NULL,
    id           bigint NOT NULL,             -- sources.record_batches gives them out
    entries      integer NOT NULL,
    inserted_at  timestamptz NOT NULL DEFAULT now(),
    data         bytea NOT NULL,
    PRIMARY KEY (sync_id, id)
);
ALTER TABLE {s}.record_batches ALTER COLUMN data SET STORAGE EXTERNAL;
ALTER TABLE {s}.sources ADD COLUMN record_batches bigint NOT NULL DEFAULT 0;

-- The records stream's index (core/store/index.py): each record's newest version and where
-- its entry is (batch: an events batch's first_seq, or minus a records batch's id; pos: the
-- entry's place in it, from 0). Unlogged, hence no WAL: Weir rebuilds it from the batches when
-- Postgres empties it (after a crash); record_index_state holds a row while it is whole.
CREATE UNLOGGED TABLE {s}.record_index (
    sync_id        uuid NOT NULL,
    collection_id  text COLLATE "C" NOT NULL,
    record_id      text COLLATE "C" NOT NULL,   -- the record token (core/envelope.py)
    seq            bigint NOT NULL,
    version        bigint NOT NULL,
    version_idx    integer NOT NULL,
    deleted        boolean NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    batch          bigint NOT NULL,
    pos            integer NOT NULL,
    PRIMARY KEY (record_id, collection_id, sync_id)
);
CREATE UNIQUE INDEX record_index_seq ON {s}.record_index (sync_id, seq) INCLUDE (batch, pos);
CREATE UNLOGGED TABLE {s}.record_index_state (built_at timestamptz NOT NULL);
""",
    ),
    (
        13,
        "an id for each making of a connector over the API",
        """
-- A connector deleted and made again under its name is another connector: its sessions carry
-- the id they were made for and stop once it is gone (core/store/cursors.py).
ALTER TABLE {s}.api_connectors ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY;
""",
    ),
    (
        14,
        "each collection's columns as capture last saw them",
        """
-- Each published column of a collection's table as 'name:type oid', in order, as capture last
-- saw them (null: not yet): when they change (ADD or DROP COLUMN, a type changed), the table
-- is backfilled, so that its records take the new shape (core/sources/pg/follower.py).
ALTER TABLE {s}.collections ADD COLUMN columns text[];
""",
    ),
    (  # its check is core/store/upgrade.py
        15,
        "the store's advisory locks and NOTIFY channel carry its schema",
        """
-- No table changes. From here on the keys of the store's advisory locks and its NOTIFY channel
-- carry its schema (core/store/shared.py), so that two stores in one database never meet; a
-- Weir of an earlier version, which takes the old keys, must not run beside this one.
""",
    ),
    (
        16,
        "an HTTP pull consumer's queue is read in id order",
        """
-- A receive takes the first visible rows in id order. With this index the planner, its
-- statistics taken while the queue was small, read every visible row (up to the 50,000 a
-- queue holds) and sorted them, for each receive: 25-200 ms where the id order stops after
-- the first rows (core/store/functions.py consumer_receive).
DROP INDEX {s}.consumer_messages_visible;
""",
    ),
    (
        17,
        "where start_position end starts for a connector made over the API",
        """
-- Each source's heads (events seq, records seq) when a connector was made over the API: its
-- start_position end starts there, not where its first start found the streams a lease poll
-- later (changes committed after the 201 were skipped: found by an outside tryout).
ALTER TABLE {s}.api_connectors ADD COLUMN heads jsonb;
""",
    ),
    (
        18,
        "where a source added to a connector by a change starts",
        """
-- Each source a change over the API added to a connector, and its heads (events seq, records
-- seq) at the change: the connector reads it from there on, whatever its start_position (it
-- was read from the start_position: its history sent after the change, found by an outside
-- tryout).
ALTER TABLE {s}.api_connectors ADD COLUMN added jsonb;
""",
    ),
    (
        19,
        "the newest commit time of the events retention deleted",
        """
-- A source's newest commit time of the events retention deleted: a Spark query whose start time
-- comes before it would begin in events that are gone, and fails saying so (it began after
-- them without a word: found by an outside tryout).
ALTER TABLE {s}.sources ADD COLUMN events_pruned_to timestamptz;
-- A source whose first events retention deleted before this migration: their times are gone
-- with them, so the first kept event's commit stands for them (a start time up to it fails).
UPDATE {s}.sources s SET events_pruned_to = coalesce(
    (SELECT min(b.first_committed_at) FROM {s}.event_batches b WHERE b.sync_id = s.sync_id), now())
WHERE s.events_seq > 0 AND NOT EXISTS (
    SELECT 1 FROM {s}.event_batches b WHERE b.sync_id = s.sync_id AND b.first_seq = 1);
""",
    ),
]
