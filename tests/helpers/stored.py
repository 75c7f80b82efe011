"""What a store holds, as rows a test can read: each event and each record's current version,
decoded from the store's batches (core/store/batches.py) the way its readers decode them."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from core.store import SESSION
from core.store.batches import Entries


def _parsed(text: bytes | None) -> Any:
    return None if text is None else json.loads(text)


def events(url: str, schema: str = "weir") -> list[dict[str, Any]]:
    """Every event, by (sync_id, seq): the columns of a row of the events stream."""
    q = sql.SQL("SELECT sync_id, first_seq, inserted_at, data FROM {} ORDER BY sync_id, first_seq")
    with psycopg.connect(url, options=SESSION) as conn:
        batches = conn.execute(q.format(sql.Identifier(schema, "event_batches"))).fetchall()
    out = []
    for sid, first, inserted_at, data in batches:
        e = Entries.decode(data)
        for i in range(len(e)):
            out.append({
                "sync_id": sid, "seq": first + i, "collection_id": e.coll[i],
                "record_id": e.rid[i], "action": e.action[i], "commit_lsn": e.lsn[i],
                "commit_idx": e.idx[i], "committed_at": datetime.fromisoformat(e.ts[i]),
                "record": _parsed(e.record[i]), "changes": _parsed(e.changes[i]),
                "inserted_at": inserted_at,
            })  # fmt: skip
    return out


def records(
    url: str, schema: str = "weir", live_only: bool = False, where: tuple[str, str] | None = None
) -> list[dict[str, Any]]:
    """Every record's current version (tombstones too, unless ``live_only``), in seq order:
    the columns of a row of the records stream (``record_id`` the whole id); ``where``: only
    that (collection, record id)'s."""
    index, events, kept = (sql.Identifier(schema, t) for t in ("record_index", "event_batches",
                                                               "record_batches"))  # fmt: skip
    c, r = where or (None, None)
    with psycopg.connect(url, options=SESSION) as conn:
        rows = conn.execute(
            sql.SQL("SELECT sync_id, seq, updated_at, batch, pos FROM {} WHERE %(c)s::text IS NULL"
                    " OR (collection_id, record_id) = (%(c)s, %(r)s) ORDER BY sync_id, seq")
            .format(index), {"c": c, "r": r}).fetchall()  # fmt: skip
        batches: dict[tuple[Any, int], Entries] = {}
        for sid in {row[0] for row in rows}:
            want = {row[3] for row in rows if row[0] == sid}
            for key, data, positions, seqs in conn.execute(
                sql.SQL("SELECT first_seq, data, version_pos, version_seq FROM {}"
                        " WHERE sync_id = %s AND first_seq = ANY(%s) UNION ALL"
                        " SELECT -id, data, NULL, NULL FROM {} WHERE sync_id = %s"
                        " AND -id = ANY(%s)")
                .format(events, kept), (sid, list(want), sid, list(want))):  # fmt: skip
                batches[(sid, key)] = Entries.decode(data).numbered(positions, seqs)
    out = []
    for sid, seq, updated_at, batch, pos in rows:
        v = batches[(sid, batch)].version_at(pos)
        assert v.seq == seq, f"the index names seq {seq} where the entry holds {v.seq}"
        if live_only and v.deleted:
            continue
        out.append({
            "sync_id": sid, "seq": seq, "collection_id": v.coll, "record_id": v.rid,
            "version": v.version, "version_idx": v.idx, "deleted": v.deleted,
            "record": json.loads(v.record), "record_json": v.record.decode(),
            "upstream_updated_at": v.ts, "updated_at": updated_at,
        })  # fmt: skip
    return out


def live_count(url: str, collection: str, schema: str = "weir") -> int:
    """How many live records of ``collection`` the records stream holds."""
    q = sql.SQL("SELECT count(*) FROM {} WHERE collection_id = %s AND NOT deleted").format(
        sql.Identifier(schema, "record_index")
    )
    with psycopg.connect(url, options=SESSION) as conn:
        row = conn.execute(q, (collection,)).fetchone()
    return int(row[0]) if row else 0


def record(url: str, collection: str, record_id: str) -> dict[str, Any] | None:
    """The current version of one record (a short id), or None."""
    return next((r for r in records(url, where=(collection, record_id))), None)
