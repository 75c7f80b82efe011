"""Upgrading the stream store's schema (core/store/migrations.py) keeps what it holds."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from core.store import Store, index, migrations, open_store, retention
from core.store.change import Change
from core.store.functions import FUNCTIONS
from core.store.snapshot_writer import SnapshotWriter
from core.store.writer import SourceWriter
from tests.helpers import stored
from tests.helpers.weir import weir_config

KEY_COLUMNS = """
SELECT array_agg(a.attname::text ORDER BY k.n)
FROM pg_index i
JOIN unnest(i.indkey) WITH ORDINALITY k(attnum, n) ON true
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indexrelid = 'weir.record_index_pkey'::regclass
"""
COLUMNS = "sync_id, collection_id, record_id, seq, version, version_idx, deleted, record"
KEPT = ("sync_id", "collection_id", "record_id", "seq", "version", "version_idx", "deleted",
        "record")  # fmt: skip


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
        assert conn.execute(KEY_COLUMNS).fetchone() == (["record_id", "collection_id", "sync_id"],)
        conn.commit()
        after = sorted(tuple(r[k] for k in KEPT) for r in stored.records(db_url))
        assert after == sorted(before)
        # The snapshot writer turns to its checked merge on exactly this constraint's violation.
        with pytest.raises(psycopg.errors.UniqueViolation) as raised:
            conn.execute(
                "INSERT INTO weir.record_index (sync_id, collection_id, record_id, seq, version,"
                " version_idx, deleted, batch, pos) VALUES (%s, 'public:t1', '0', 9999, 1, 0,"
                " false, -1, 0)",
                (sources[1],),
            )
        assert raised.value.diag.constraint_name == "record_index_pkey"


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
        keys = conn.execute("SELECT record_id FROM weir.record_index ORDER BY seq").fetchall()
    token = "~" + hashlib.sha256(long_id.encode()).hexdigest()
    assert keys == [(token,), (short_id,)]
    assert [r["record_id"] for r in stored.records(db_url)] == [long_id, short_id]


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
            expected = migrations.render(body, store.schema).as_string(conn).split("$$")[1]
            assert conn.execute(source, (name,)).fetchone() == (expected,)


def _change(action: str, rid: str | None, record: dict[str, object] | None, lsn: int, idx: int,
            missing: tuple[str, ...] = (), old: str | None = None) -> Change:  # fmt: skip
    return Change(action=action, collection_id="public:t", record_id=rid, record=record,
                  changes=None, missing=missing, old_record_id=old, version=lsn, idx=idx,
                  committed_at="2026-11-27T10:00:00.000000Z")  # fmt: skip


INDEX = "SELECT sync_id, collection_id, record_id, seq, version, version_idx, deleted, batch," \
        " pos FROM weir.record_index ORDER BY sync_id, seq"  # fmt: skip


def test_the_records_index_is_rebuilt_as_it_was(db_url: str) -> None:
    """Postgres empties the unlogged records index after a crash: rebuilt from the batches, it
    is what it was, after versions of every kind (missing columns, tombstones of deletes and
    truncates, a key change, a backfill's rows, versions moved by retention and compaction)."""
    cfg = weir_config(db_url, [])
    store, sid = open_store(cfg), cfg.sources[0].sync_id
    with store.connect() as conn:
        w = SourceWriter(conn, store, sid)
        w.lock("app")
        w.write([_change("insert", str(i), {"id": i, "big": "B" * i}, 10, i) for i in range(6)])
        w.commit(10, 10)
        changes = [
            _change("update", "1", {"id": 1}, 20, 0, missing=("big",)),
            _change("delete", "2", {"id": 2}, 20, 1, missing=("big",)),
            _change("delete", "3", {"id": 3, "big": "B"}, 20, 2),
            _change("insert", "30", {"id": 30}, 20, 3, missing=("big",), old="3"),
        ]
        w.write(changes)
        w.commit(20, 20)
        conn.execute("UPDATE weir.event_batches SET inserted_at = now() - interval '9 days'"
                     " WHERE first_seq = 1")  # fmt: skip
        conn.commit()
        assert (
            retention.delete_older(store, timedelta(days=7), timedelta(days=30)) == 6
        )  # 0, 4, 5 kept
        snap = SnapshotWriter(conn, store, sid, 15, datetime.now(UTC))
        assert snap.write("public:t", [("7", b'{"id":7}'), ("1", b'{"id":1}')]) == (2, 1)
        conn.commit()
        w.write([_change("insert", "8", {"id": 8}, 30, 0), _change("truncate", None, None, 30, 1),
                 _change("insert", "9", {"id": 9}, 30, 2)])  # fmt: skip
        w.drop("public:u", 35, 0, "2026-11-27T10:00:00.000000Z")
        w.commit(40, 40)
    assert retention.compact(store) == 2  # the kept versions' batch and the backfill's
    with psycopg.connect(db_url) as conn:
        before, records = conn.execute(INDEX).fetchall(), stored.records(db_url)
        assert {r["record_id"]: r["deleted"] for r in records} == {
            "0": True, "1": True, "2": True, "3": True, "4": True, "5": True, "30": True,
            "7": True, "8": True, "9": False}  # fmt: skip
        assert next(r for r in records if r["record_id"] == "1")["record"] == {"id": 1, "big": "B"}
        conn.execute("TRUNCATE weir.record_index, weir.record_index_state")  # as after a crash
        conn.commit()
    with store.connect() as conn:
        index.ensure(conn, store)
    with psycopg.connect(db_url) as conn:
        assert conn.execute(INDEX).fetchall() == before
    assert [{k: v for k, v in r.items() if k != "updated_at"} for r in stored.records(db_url)] \
        == [{k: v for k, v in r.items() if k != "updated_at"} for r in records]  # fmt: skip


def test_the_notifier_tells_each_commit_and_passes_over_a_payload_not_its_own(db_url: str) -> None:
    """A commit notification wakes the source's readers and keeps its heads; one on Weir's
    channel that is not Weir's (``s1:x:y``, sent by another program) wakes them too, keeps no
    heads and stops nothing: the one after it is told at once."""
    import asyncio

    from core.store.notifier import Notifier
    from core.store.shared import channel

    async def run() -> tuple[list[str], dict[str, tuple[int, int]]]:
        store = Store(db_url)
        notifier = Notifier(store)
        woken: list[str] = []
        for sid in ("s1", "s2"):
            notifier.subscribe(sid, lambda sid=sid: woken.append(sid))
        await notifier.start()
        try:
            async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
                while not woken:  # listening: subscribers are told once it listens
                    await asyncio.sleep(0.05)
                woken.clear()
                for payload in ("s1:x:y", "s2:7:3"):
                    await conn.execute("SELECT pg_notify(%s, %s)", (channel(store.schema), payload))
                for _ in range(100):
                    if len(woken) == 2:
                        break
                    await asyncio.sleep(0.05)
        finally:
            await notifier.stop()
        return woken, notifier.heads

    woken, heads = asyncio.run(run())
    assert woken == ["s1", "s2"]
    assert heads == {"s2": (7, 3)}
