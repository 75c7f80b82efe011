"""What HTTP ingest (core/sources/http.py) reads from the store in a batch's transaction,
before the batch is written by the source's SourceWriter."""

from __future__ import annotations

import json
from typing import Any

from psycopg import sql

from core.store import Conn, Store, array
from core.store.index import Batches
from core.store.records import LOOKUP


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
    by_token = {(c, t): (c, i) for c, i, t in keys}
    rows: list[Any] = conn.execute(
        sql.SQL(LOOKUP).format(index=store.table("record_index")),
        (array(c for c, _, _ in keys), array(t for _, _, t in keys), sync_id),
    ).fetchall()
    batches = Batches(store, sync_id)
    held = batches.load(conn, (r[2] for r in rows))
    out = {}
    for coll, token, batch, pos, version, _, deleted in rows:
        v = held[batch].version_at(pos)
        out[by_token[(coll, token)]] = (version, deleted, json.loads(v.record))
    return out
