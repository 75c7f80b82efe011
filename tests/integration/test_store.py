"""Upgrading the stream store's schema (core/store/migrations.py) keeps what it holds."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from core.store import Store, migrations

KEY_COLUMNS = """
SELECT array_agg(a.attname::text ORDER BY k.n)
FROM pg_index i
JOIN unnest(i.indkey) WITH ORDINALITY k(attnum, n) ON true
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indexrelid = 'weir.records_pkey'::regclass
"""


def test_records_key_migration_keeps_every_record_and_its_uniqueness(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = Store(db_url)
    sources = [uuid.uuid4(), uuid.uuid4()]
    with store.connect() as conn:
        monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:6])
        assert migrations.migrate(conn, store.schema) == 6
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
        before = conn.execute("SELECT * FROM weir.records ORDER BY sync_id, seq").fetchall()
        assert len(before) == 4000
        monkeypatch.undo()

        assert migrations.migrate(conn, store.schema) == len(migrations.MIGRATIONS)
        assert conn.execute("SELECT * FROM weir.records ORDER BY sync_id, seq").fetchall() == before
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
