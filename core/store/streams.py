"""The SQL that finds messages of a source's streams in the store's tables (core/store/batches.py
says how a batch holds them): one place for what names those tables, for the readers, the
failed lists, the consumer queues and ``weir status``.
"""

from __future__ import annotations

from psycopg import sql

from core.store import Store
from core.store.index import MISSING_ROW

# Whether the message ``{row}.seq`` of source ``{row}.sync_id`` is in the stream: an event whose
# batch retention has not deleted; a version that is still its record's newest.
PRESENT = {
    "events": "EXISTS (SELECT 1 FROM {events} b WHERE b.sync_id = {row}.sync_id"
    " AND b.last_seq >= {row}.seq AND b.first_seq <= {row}.seq)",
    "records": "EXISTS (SELECT 1 FROM {index} i WHERE i.sync_id = {row}.sync_id"
    " AND i.seq = {row}.seq)",
}


def present(store: Store, stream: str, row: str) -> sql.Composed:
    return sql.SQL(PRESENT[stream].replace("{row}", row)).format(
        events=store.table("event_batches"), index=store.table("record_index")
    )


def event_batches(store: Store) -> sql.Composed:
    """Events batches holding seqs in (after, upto], in order: params sync_id, after, upto,
    how many batches at most."""
    return sql.SQL(
        "SELECT first_seq, data FROM {} WHERE sync_id = %s AND last_seq > %s AND first_seq <= %s"
        " ORDER BY last_seq LIMIT %s"
    ).format(store.table("event_batches"))


def record_page(store: Store) -> sql.Composed:
    """Versions with seq in (after, upto], in seq order: (seq, batch, pos), and a row of seq -1
    when the index is not whole; params sync_id, after, upto, limit."""
    return sql.SQL(
        "(SELECT seq, batch, pos FROM {} WHERE sync_id = %s AND seq > %s AND seq <= %s"
        " ORDER BY seq LIMIT %s)" + MISSING_ROW
    ).format(store.table("record_index"), state=store.table("record_index_state"))


def record_seqs(store: Store) -> sql.Composed:
    """The versions of these seqs still current: (seq, batch, pos), and seq -1 when the index
    is not whole; params sync_id, seqs."""
    return sql.SQL(
        "(SELECT seq, batch, pos FROM {} WHERE sync_id = %s AND seq = ANY(%s))" + MISSING_ROW
    ).format(store.table("record_index"), state=store.table("record_index_state"))


def events_at(store: Store) -> sql.Composed:
    """The first seqs of the events batches holding these seqs: params sync_id, seqs."""
    return sql.SQL(
        "SELECT DISTINCT (SELECT max(first_seq) FROM {} x WHERE x.sync_id = %s AND"
        " x.first_seq <= s) FROM unnest(%s::int8[]) s"
    ).format(store.table("event_batches"))
