"""Capture from a real PostgreSQL into the store: every action, type and ordering rule."""

from __future__ import annotations

import base64
import threading
import time

import psycopg
import pytest

from tests.helpers.capture import (
    KINDS_DDL,
    KINDS_ROW,
    capturing,
    count_events,
    events,
    pg_source,
    records,
    wait_for,
)
from tests.helpers.sql import execute


def test_insert_update_delete_truncate_in_commit_order(db_url: str) -> None:
    execute(
        db_url,
        "CREATE TABLE users (id int PRIMARY KEY, name text)",
        "CREATE TABLE full_users (id int PRIMARY KEY, name text, plan text)",
        "ALTER TABLE full_users REPLICA IDENTITY FULL",
    )
    src = pg_source(db_url)
    with capturing(src):
        execute(
            db_url,
            "INSERT INTO users VALUES (1, 'Paul'), (2, 'Jessica')",
            "UPDATE users SET name = 'Leto' WHERE id = 1",
            "DELETE FROM users WHERE id = 2",
            "INSERT INTO full_users VALUES (7, 'Chani', 'trial')",
            "UPDATE full_users SET plan = 'pro' WHERE id = 7",
            "DELETE FROM full_users WHERE id = 7",
            "TRUNCATE users",
        )
        wait_for(lambda: count_events(db_url) == 8, what="8 events")
    got = [
        (e["seq"], e["collection_id"], e["record_id"], e["action"], e["record"], e["changes"])
        for e in events(db_url)
    ]
    assert got == [
        (1, "public:users", "1", "insert", {"id": 1, "name": "Paul"}, None),
        (2, "public:users", "2", "insert", {"id": 2, "name": "Jessica"}, None),
        # Without REPLICA IDENTITY FULL the old values are unknown: changes is null.
        (3, "public:users", "1", "update", {"id": 1, "name": "Leto"}, None),
        (4, "public:users", "2", "delete", {"id": 2}, None),
        (5, "public:full_users", "7", "insert", {"id": 7, "name": "Chani", "plan": "trial"}, None),
        (6, "public:full_users", "7", "update", {"id": 7, "name": "Chani", "plan": "pro"},
         {"plan": "trial"}),
        (7, "public:full_users", "7", "delete", {"id": 7, "name": "Chani", "plan": "pro"}, None),
        (8, "public:users", None, "truncate", None, None),
    ]  # fmt: skip
    lsns = [e["commit_lsn"] for e in events(db_url)]
    assert lsns == sorted(lsns)
    # Records stream: every record is a tombstone now, keeping its last known values.
    assert records(db_url) == []
    tombstones = {(r["collection_id"], r["record_id"]): r for r in records(db_url, False)}
    assert tombstones[("public:users", "2")]["record"] == {"id": 2, "name": "Jessica"}
    assert tombstones[("public:users", "1")]["record"] == {"id": 1, "name": "Leto"}
    assert all(r["deleted"] for r in tombstones.values())
    seqs = [r["seq"] for r in records(db_url, False)]
    assert seqs == sorted(set(seqs))


def test_a_truncate_that_starts_a_store_write_is_stored(db_url: str) -> None:
    """A TRUNCATE makes no record version of its own: alone in a store write, or first in it,
    it was lost while its seq was used (found by an outside tryout)."""
    execute(db_url, "CREATE TABLE users (id int PRIMARY KEY, name text)")
    src = pg_source(db_url)
    with capturing(src):
        execute(db_url, "INSERT INTO users VALUES (1, 'a')")
        wait_for(lambda: count_events(db_url) == 1, what="the insert")
        execute(db_url, "TRUNCATE users")
        wait_for(lambda: count_events(db_url) == 2, what="the truncate alone")
        execute(db_url, "TRUNCATE users; INSERT INTO users VALUES (2, 'b')")
        wait_for(lambda: count_events(db_url) == 4, what="the truncate and the insert")
    got = [(e["seq"], e["action"], e["record_id"]) for e in events(db_url)]
    assert got == [(1, "insert", "1"), (2, "truncate", None), (3, "truncate", None),
                   (4, "insert", "2")]  # fmt: skip
    with psycopg.connect(db_url) as conn:
        assert conn.execute("SELECT events_seq FROM weir.sources").fetchone() == (4,)


def test_every_value_type_is_encoded_as_documented(db_url: str) -> None:
    execute(db_url, *KINDS_DDL)
    src = pg_source(db_url)
    with capturing(src):
        execute(db_url, KINDS_ROW)
        wait_for(lambda: count_events(db_url) == 1, what="the insert")
    rec = events(db_url)[0]["record"]
    assert rec == {
        "id": 9007199254740993,
        "i2": -3,
        "i4": 2147483647,
        "f4": 1.5,
        "f8": 0.1,
        "nan": "NaN",
        "num": "12345678.1234",
        "b": True,
        "t": 'line1\n            "quoted" \\ back',
        "vc": "abc",
        "c": "x  ",
        "ts": "2026-11-22T10:00:00.500000",
        "tstz": "2026-11-22T10:00:00.123456Z",
        "d": "2026-11-22",
        "tm": "10:11:12",
        "iv": "P1DT2H",
        "j": {"a": [1, 2]},
        "jb": {"b": {"c": None}},
        "u": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        "by": base64.b64encode(b"\x00\xff\x10").decode(),
        "arr": [1, None, 3],
        "tarr": ["a,b", 'c"d', None, ""],
        "nested": [[1, 2], [3, 4]],
        "m": "happy",
        "dom": 5,
        "nul": None,
    }


def test_unchanged_toast_is_taken_from_the_version_before_on_both_streams(db_url: str) -> None:
    big = "x" * 100_000  # stored out of line (TOAST), not sent again when unchanged
    execute(
        db_url,
        "CREATE TABLE docs (id int PRIMARY KEY, title text, body text)",
        "ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL",
    )
    src = pg_source(db_url)
    with capturing(src):
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("INSERT INTO docs VALUES (1, 'a', %s)", (big,))
            conn.execute("UPDATE docs SET title = 'b' WHERE id = 1")
        wait_for(lambda: count_events(db_url) == 2, what="2 events")
    update = events(db_url)[1]
    assert update["action"] == "update"
    assert update["record"] == {"id": 1, "title": "b", "body": big}  # the insert's
    [rec] = records(db_url)
    assert rec["record"] == {"id": 1, "title": "b", "body": big}


def test_composite_and_odd_keys_become_subject_safe_record_ids(db_url: str) -> None:
    execute(db_url, "CREATE TABLE pairs (a text, b int, PRIMARY KEY (a, b))")
    src = pg_source(db_url)
    with capturing(src):
        execute(db_url, "INSERT INTO pairs VALUES ('a.b c', 1), ('', 2), ('é>*', 3)")
        wait_for(lambda: count_events(db_url) == 3, what="3 events")
    assert [e["record_id"] for e in events(db_url)] == ["a%2Eb%20c,1", "%EMPTY,2", "%C3%A9%3E%2A,3"]


def test_transactions_land_in_commit_order_not_start_order(db_url: str) -> None:
    execute(db_url, "CREATE TABLE t (id int PRIMARY KEY, v text)")
    src = pg_source(db_url)
    with (
        capturing(src),
        psycopg.connect(db_url) as first,
        psycopg.connect(db_url) as second,
    ):
        first.execute("INSERT INTO t VALUES (1, 'first-started')")
        second.execute("INSERT INTO t VALUES (2, 'second-started')")
        second.execute("INSERT INTO t VALUES (3, 'second-started')")
        second.commit()
        first.execute("INSERT INTO t VALUES (4, 'first-started')")
        first.commit()
        wait_for(lambda: count_events(db_url) == 4, what="4 events")
    evs = events(db_url)
    assert [e["record_id"] for e in evs] == ["2", "3", "1", "4"]
    assert [e["commit_idx"] for e in evs] == [0, 1, 0, 1]
    assert evs[0]["commit_lsn"] == evs[1]["commit_lsn"] < evs[2]["commit_lsn"]


def test_only_the_tables_of_the_config_are_captured(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A publication may hold more tables than the config names (a DBA's, FOR ALL TABLES, one
    removed from tables:): their changes are left out, and the log says so once. So is the
    store's own schema when it lives in the source's database (its writes would be captured
    over and over)."""
    execute(db_url, "CREATE TABLE a (id int PRIMARY KEY)", "CREATE TABLE b (id int PRIMARY KEY)",
          "CREATE PUBLICATION weir_pub FOR ALL TABLES")  # fmt: skip
    src = pg_source(db_url, schemas=[], tables=["public.a"], create_publication=False)
    with capturing(src):
        execute(db_url, "INSERT INTO a VALUES (1)", "INSERT INTO b VALUES (1)",
              "INSERT INTO a VALUES (2)", "INSERT INTO b VALUES (2)")  # fmt: skip
        wait_for(lambda: count_events(db_url) == 2, what="the inserts into a")
        time.sleep(1)  # the store's own writes, were they captured, would show by now
    assert [(e["collection_id"], e["record_id"]) for e in events(db_url)] == [
        ("public:a", "1"),
        ("public:a", "2"),
    ]
    assert "leaving out the changes of public.b: it is in the publication" in caplog.text


def test_a_long_transaction_is_written_in_chunks_and_committed_once(db_url: str) -> None:
    execute(db_url, "CREATE TABLE t (id int PRIMARY KEY, v int)")
    src = pg_source(db_url, max_batch=100)
    with capturing(src):
        execute(
            db_url,
            "INSERT INTO t SELECT g, 0 FROM generate_series(1, 1050) g",
            "UPDATE t SET v = 1 WHERE id <= 10",
        )
        wait_for(lambda: count_events(db_url) == 1060, what="1060 events")
    evs = events(db_url)
    assert [e["seq"] for e in evs] == list(range(1, 1061))
    assert {e["commit_lsn"] for e in evs[:1050]} == {evs[0]["commit_lsn"]}
    assert [e["commit_idx"] for e in evs[:1050]] == list(range(1050))
    recs = records(db_url)
    assert len(recs) == 1050
    assert sorted(r["record"]["v"] for r in recs) == [0] * 1040 + [1] * 10


KILL = {  # a connection of the capture that the server drops under load
    "walsender": "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
    "WHERE slot_name = 'weir_slot' AND active_pid IS NOT NULL",
    "store writer": "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
    "WHERE application_name = 'weir' AND datname = current_database()",
}


@pytest.mark.parametrize("victim", list(KILL))
def test_capture_reconnects_after_a_connection_is_dropped_and_loses_nothing(
    db_url: str, victim: str
) -> None:
    execute(db_url, "CREATE TABLE t (id int PRIMARY KEY)")
    src = pg_source(db_url)
    stop = threading.Event()

    def load() -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            for i in range(1, 2001):
                conn.execute("INSERT INTO t VALUES (%s)", (i,))
        stop.set()

    with capturing(src), psycopg.connect(db_url, autocommit=True) as admin:
        writer = threading.Thread(target=load)
        writer.start()
        while not stop.wait(0.3):  # a few times under load
            admin.execute(KILL[victim])
        writer.join()
        wait_for(lambda: count_events(db_url) >= 2000, timeout=60, what="2000 events")
    assert [int(e["record_id"]) for e in events(db_url)] == list(range(1, 2001))


def test_heartbeats_keep_the_slot_moving_on_an_idle_database(
    db_url: str, pg_server: object
) -> None:
    execute(db_url, "CREATE TABLE t (id int PRIMARY KEY)")
    src = pg_source(db_url, heartbeat_interval="200ms", status_interval="200ms")
    other_db = db_url.rsplit("/", 1)[0] + "/postgres"

    def confirmed() -> int:
        with psycopg.connect(db_url) as conn:
            row = conn.execute(
                "SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots "
                "WHERE slot_name = 'weir_slot'"
            ).fetchone()
            return int(row[0]) if row else 0

    with capturing(src):
        # WAL written elsewhere on the server; nothing in this source's tables.
        with psycopg.connect(other_db, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS busy (v text)")
            conn.execute("INSERT INTO busy SELECT repeat('x', 100) FROM generate_series(1, 5000)")
            row = conn.execute("SELECT pg_current_wal_lsn() - '0/0'").fetchone()
            assert row is not None
            target = int(row[0])
        wait_for(lambda: confirmed() >= target, timeout=20, what="the slot to pass the WAL end")
    assert count_events(db_url) == 0
