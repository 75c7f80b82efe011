"""Upgrading the stream store's schema (core/store/migrations.py) keeps what it holds."""

from __future__ import annotations

import hashlib
import uuid

import psycopg
import pytest

from core.store import Store, migrations
from core.store.functions import FUNCTIONS

KEY_COLUMNS = """
SELECT array_agg(a.attname::text ORDER BY k.n)
FROM pg_index i
JOIN unnest(i.indkey) WITH ORDINALITY k(attnum, n) ON true
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indexrelid = 'weir.records_pkey'::regclass
"""
COLUMNS = "sync_id, collection_id, record_id, seq, version, version_idx, deleted, record"


def test_records_key_migration_keeps_every_record_and_its_uniqueness(db_url: str) -> None:
    store = Store(db_url)
    sources = [uuid.uuid4(), uuid.uuid4()]
    with store.connect() as conn:
        assert migrations.migrate_to(conn, store.schema, 6) == 6
        for s, sid in enumerate(sources):  # the same record ids in both sources and tables
            conn.execute(
                "INSERT INTO weir.records (sync_id, collection_id, record_id, seq, version,"
                " version_idx, deleted, record)"
                " SELECT %s, 'public:t' || (i %% 2), (i / 2)::text, i, i, 0, i %% 7 = 0,"
                "        jsonb_build_object('i', i, 's', %s::int)"
                " FROM generate_series(1, 2000) i",
                (sid, s),
            )
        conn.commit()
        before = conn.execute(
            f"SELECT {COLUMNS} FROM weir.records ORDER BY sync_id, seq"
        ).fetchall()
        assert len(before) == 4000

        assert migrations.migrate(conn, store.schema) == len(migrations.MIGRATIONS)
        after = conn.execute(f"SELECT {COLUMNS} FROM weir.records ORDER BY sync_id, seq")
        assert after.fetchall() == before
        assert conn.execute(KEY_COLUMNS).fetchone() == (["record_id", "collection_id", "sync_id"],)
        # The snapshot writer turns to its checked merge on exactly this constraint's violation.
        with pytest.raises(psycopg.errors.UniqueViolation) as raised:
            conn.execute(
                "INSERT INTO weir.records (sync_id, collection_id, record_id, seq, version,"
                " version_idx, deleted, record) VALUES (%s, 'public:t1', '0', 9999, 1, 0, false,"
                " '{}')",
                (sources[1],),
            )
        assert raised.value.diag.constraint_name == "records_pkey"


def test_long_record_ids_are_keyed_by_their_token_and_kept_whole(db_url: str) -> None:
    """Migration 8: a stored record id over 256 bytes becomes its record token (as subjects
    name it) and is kept whole beside it; shorter ones stay as they are."""
    store = Store(db_url)
    sid = uuid.uuid4()
    long_id, short_id = "k" * 300, "k" * 256
    with store.connect() as conn:
        assert migrations.migrate_to(conn, store.schema, 7) == 7
        conn.execute(
            "INSERT INTO weir.records (sync_id, collection_id, record_id, seq, version,"
            " version_idx, deleted, record) VALUES (%s, 'c', %s, 1, 1, 0, false, '{}'),"
            " (%s, 'c', %s, 2, 1, 0, false, '{}')",
            (sid, long_id, sid, short_id),
        )
        conn.commit()
        migrations.migrate(conn, store.schema)
        rows = conn.execute(
            "SELECT record_id, full_record_id FROM weir.records ORDER BY seq"
        ).fetchall()
    token = "~" + hashlib.sha256(long_id.encode()).hexdigest()
    assert rows == [(token, long_id), (short_id, None)]


def test_source_failures_of_one_transaction_are_kept_apart_after_migration_9(db_url: str) -> None:
    """A store of version 8 keyed a source failure by its transaction and index alone: after
    migration 9 one without a record reads as '', and two refused rows of one backfill page
    (same snapshot, index -1) are both kept."""
    store = Store(db_url)
    sid = uuid.uuid4()
    with psycopg.connect(db_url) as conn:
        assert migrations.migrate_to(conn, store.schema, 8) == 8
        conn.execute("INSERT INTO weir.source_failures (sync_id, commit_lsn, commit_idx,"
                     " collection_id, action, error) VALUES (%s, 1, 0, 'public:t', 'insert',"
                     " 'no key')", (sid,))  # fmt: skip
        assert migrations.migrate(conn, store.schema) == migrations.MIGRATIONS[-1][0]
        for record in ("a", "b"):
            conn.execute("INSERT INTO weir.source_failures (sync_id, commit_lsn, commit_idx,"
                         " collection_id, record_id, action, error) VALUES"
                         " (%s, 2, -1, 'public:t', %s, 'backfill', 'refused')",
                         (sid, record))  # fmt: skip
        got = conn.execute("SELECT commit_lsn, record_id FROM weir.source_failures"
                           " ORDER BY 1, 2").fetchall()  # fmt: skip
    assert got == [(1, ""), (2, "a"), (2, "b")]


def test_functions_get_their_current_body_from_one_file_whatever_made_the_store(
    db_url: str,
) -> None:
    """A store of version 3 holds consumer_receive as migration 3 made it: migrating it, like
    migrating any store, leaves each function as core/store/functions.py says."""
    store = Store(db_url)
    source = (
        "SELECT p.prosrc FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'weir' AND p.proname = %s"
    )
    with psycopg.connect(db_url) as conn:
        assert migrations.migrate_to(conn, store.schema, 3) == 3
        migrations.migrate(conn, store.schema)
        for name, body in FUNCTIONS.items():
            expected = body.split("$$")[1].replace("{s}", '"weir"')
            assert conn.execute(source, (name,)).fetchone() == (expected,)
