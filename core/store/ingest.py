"""What HTTP ingest (core/sources/http.py) reads from the store in a batch's transaction,
before the batch is written by the source's SourceWriter."""

from __future__ import annotations

from typing import Any

from psycopg import sql

from core.store import Conn, Store


def lock_batch(conn: Conn, store: Store, sync_id: Any) -> int:
    """Lock the source's row until the transaction ends, so batches of one source commit one
    after the other (also from several Weir processes); returns the number of the next batch
    (the source's ``commit_lsn`` plus one)."""
    row = conn.execute(
        sql.SQL("SELECT commit_lsn FROM {} WHERE sync_id = %s FOR UPDATE").format(
            store.table("sources")
        ),
        (sync_id,),
    ).fetchone()
    assert row is not None, "source not registered"
    last = row[0]
    assert isinstance(last, int)
    return last + 1


def current_records(
    conn: Conn, store: Store, sync_id: Any, keys: list[tuple[str, str, str]]
) -> dict[tuple[str, str], tuple[int, bool, dict[str, Any]]]:
    """The stored (version, deleted, record) of each ``(collection, record id, record token)``
    of ``keys`` that the records stream holds, by (collection, record id)."""
    rows: list[Any] = conn.execute(
        sql.SQL(
            "SELECT r.collection_id, coalesce(r.full_record_id, r.record_id), r.version,"
            " r.deleted, r.record"
            " FROM {} r JOIN unnest(%s::text[], %s::text[]) k(c, i)"
            " ON r.sync_id = %s AND r.collection_id = k.c AND r.record_id = k.i"
        ).format(store.table("records")),
        ([c for c, _, _ in keys], [t for _, _, t in keys], sync_id),
    ).fetchall()
    return {(c, i): (v, d, rec) for c, i, v, d, rec in rows}
