"""The Python half of store migrations that move data into a new layout (core/store/history.py
makes the tables; core/store/migrations.py runs both, in one transaction).

Migration 12 moves the streams of a store made by Weir up to migration 11, a row per event and a
row per record with their JSON as jsonb, into batches (core/store/batches.py): every event keeps
its seq, every record its seq, version and tombstone, so cursors, consumer queues and failed
lists, which name messages by seq, stay valid. Their JSON is jsonb's text of it.

Migration 15 changes no table, but the keys of the store's advisory locks: it refuses while an
instance of an earlier Weir runs on the store (its lease connections are open), which would take
the same works under the old keys.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from psycopg import sql

from core.envelope import record_token
from core.redact import said
from core.store.batches import Entries, Version
from core.store.shared import lease_application

log = logging.getLogger("weir.store")

CHUNK = 1000  # entries per batch made from the old rows
PROGRESS_EVERY = 10.0  # seconds between progress lines
ISO = """to_char({} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""


def _batches(conn: Any, query: sql.Composable, key: Callable[[Any], Any]) -> Any:
    """The rows of ``query`` in chunks of at most ``CHUNK`` whose ``key`` stays the same."""
    with conn.cursor(name="weir_upgrade") as cur:
        cur.itersize = 5000
        cur.execute(query)
        chunk: list[Any] = []
        for row in cur:
            if chunk and (len(chunk) >= CHUNK or key(row) != key(chunk[-1])):
                yield chunk
                chunk = []
            chunk.append(row)
        if chunk:
            yield chunk


def to_batches(conn: Any, schema: str) -> None:
    """Migration 12: the old ``events`` and ``records`` tables into batches and the index."""

    def t(name: str) -> sql.Identifier:
        return sql.Identifier(schema, name)

    started = said = time.monotonic()
    moved = 0
    row = conn.execute(sql.SQL("SELECT (SELECT count(*) FROM {}) + (SELECT count(*) FROM {})")
                       .format(t("events"), t("records"))).fetchone()  # fmt: skip
    total = row[0] if row else 0

    def progress(n: int) -> None:  # a line every 10 s: a large store takes minutes
        nonlocal moved, said
        moved += n
        if time.monotonic() - said >= PROGRESS_EVERY:
            said = time.monotonic()
            log.info("store: upgrading: moved %d of %d events and records into batches (%d%%)",
                     moved, total, 100 * moved // max(total, 1))  # fmt: skip

    events = sql.SQL(
        "SELECT sync_id, seq, collection_id, record_id, action, commit_lsn, commit_idx, "
        + ISO.format("committed_at")
        + ", record::text, changes::text, inserted_at, seq - row_number() OVER"
        " (PARTITION BY sync_id ORDER BY seq) FROM {} ORDER BY sync_id, seq"
    ).format(t("events"))
    insert = sql.SQL(
        "INSERT INTO {} (sync_id, first_seq, last_seq, first_committed_at, last_committed_at,"
        " inserted_at, data) VALUES (%s, %s, %s, %s, %s, %s, %s)"
    ).format(t("event_batches"))
    # A run of consecutive seqs shares (sync_id, seq - its row number): a batch never spans a gap.
    for rows in _batches(conn, events, lambda r: (r[0], r[11])):
        e = Entries()
        for r in rows:
            e.add(r[2], r[3], r[4], r[5], r[6], r[7], _text(r[8]), _text(r[9]))
        conn.execute(
            insert,
            (
                rows[0][0],
                rows[0][1],
                rows[-1][1],
                min(e.ts),
                max(e.ts),
                max(r[10] for r in rows),
                e.encode(),
            ),
        )
        progress(len(rows))
    records = sql.SQL(
        "SELECT sync_id, collection_id, coalesce(full_record_id, record_id), seq, version,"
        " version_idx, deleted, " + ISO.format("upstream_updated_at") + ", record::text,"
        " updated_at FROM {} ORDER BY sync_id, seq"
    ).format(t("records"))
    counts: dict[Any, int] = {}
    for rows in _batches(conn, records, lambda r: r[0]):
        sid = rows[0][0]
        n = counts[sid] = counts.get(sid, 0) + 1
        e = Entries()
        for r in rows:
            e.add_version(Version(r[1], r[2], r[3], r[4], r[5], r[6], r[7], _text(r[8]) or b"{}"))
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (sync_id, id, entries, inserted_at, data) VALUES"
                " (%s, %s, %s, %s, %s)"
            ).format(t("record_batches")),
            (sid, n, len(rows), max(r[9] for r in rows), e.encode()),
        )
        with (
            conn.cursor() as cur,
            cur.copy(
                sql.SQL(
                    "COPY {} (sync_id, collection_id, record_id, seq, version, version_idx,"
                    " deleted, updated_at, batch, pos) FROM STDIN"
                ).format(t("record_index"))
            ) as copy,
        ):
            for pos, r in enumerate(rows):
                copy.write_row(
                    (sid, r[1], record_token(r[2]), r[3], r[4], r[5], r[6], r[9], -n, pos)
                )
        progress(len(rows))
    for sid, n in counts.items():
        conn.execute(
            sql.SQL("UPDATE {} SET record_batches = %s WHERE sync_id = %s").format(t("sources")),
            (n, sid),
        )
    conn.execute(sql.SQL("DROP TABLE {}, {}").format(t("events"), t("records")))
    conn.execute(sql.SQL("INSERT INTO {} VALUES (now())").format(t("record_index_state")))
    if moved:
        log.info(
            "store: moved %d events and records into batches in %.1fs",
            moved,
            time.monotonic() - started,
        )


def _text(value: str | None) -> bytes | None:
    return None if value is None else value.encode()


def none_earlier_runs(conn: Any, schema: str) -> None:
    """Refuse while a ``weir run`` of an earlier version runs on the store: it does not see the
    leases, writer locks and fences this version takes, so both would run the same works."""
    row = conn.execute(
        "SELECT string_agg(DISTINCT application_name, ', ') FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name LIKE %s",
        (lease_application(schema, "%") + "%",),
    ).fetchone()
    if row[0] is not None:
        raise RuntimeError(
            said(
                "instances of an earlier Weir run on the store (schema %s; their "
                "lease connections: %s): stop every instance of the store, then "
                "start this version (its locks carry the store's schema; "
                "docs/operations.md “Upgrading”)",
                schema,
                row[0],
            )
        )


# By migration: what runs after its SQL, in the same transaction.
CONVERSIONS: dict[int, Callable[[Any, str], None]] = {12: to_batches, 15: none_earlier_runs}
