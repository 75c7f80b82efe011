"""Seeding (the Spark job) and backfilling tables into the records stream while they change:
the stream must end up equal to the table, and the same as capture would have made it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import orjson
import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import sql

from core.config.sources import PostgresSource
from core.envelope import utc_iso
from core.runtime.service import prepare
from core.sources.backfill import Backfill
from core.sources.pg import snapshot
from core.sources.pg.copy_out import copy_rows
from core.sources.pg.snapshot import records_of
from core.sources.pg.values import MAX_DEPTH
from core.store import index, open_store
from core.store.change import Change
from core.store.snapshot_writer import SNAPSHOT_IDX, SnapshotWriter
from core.store.writer import SourceWriter
from devkit.embedded import EmbeddedNats
from spark.session import LOOPBACK_CONF, java_home
from tests.connectors.nats.harness import NatsHarness
from tests.helpers import stored as stored_rows
from tests.helpers.capture import KINDS_DDL, KINDS_ROW, events, pg_source, wait_for
from tests.helpers.load import WeirProcess
from tests.helpers.snapshot import (
    Mutator,
    assert_nats_delivers_the_table,
    assert_stream_equals_table,
    create_items,
    wait_captured,
    write_config,
)
from tests.helpers.weir import serving, weir_config

ROWS = 200_000
WEIR = [sys.executable, "-m", "core.cli"]
ROOT = Path(__file__).resolve().parents[2]


def _jdbc_jar() -> str:
    import wbjdbc  # ships the PostgreSQL JDBC driver

    jar = Path(wbjdbc.__file__).parent / "resources/maven/postgresql/postgresql-42.7.4.jar"
    assert jar.exists(), f"no JDBC driver at {jar}"
    return str(jar)


def _backfill_state(url: str) -> tuple[int, int, int, bool]:
    """(rows read, rows written, rows when it started, finished) of the backfill of public.items."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT rows_read, rows_written, rows_total, finished_at IS NOT NULL"
            " FROM weir.backfills WHERE collection_id = 'public:items'"
        ).fetchone()
    return (int(row[0]), int(row[1]), int(row[2]), bool(row[3])) if row else (0, 0, 0, False)


def _status_of(config: Path, table: str) -> list[str]:
    """The row of ``weir status``'s backfill table for ``table``."""
    out = subprocess.run([*WEIR, "status", "--config", str(config), "--interval", "0.1"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return next(line.split() for line in out.stdout.splitlines() if line.startswith(table + " "))


def test_snapshot_rows_are_encoded_as_capture_encodes_them(db_url: str) -> None:
    """The ``backfill:`` option in ``weir run``: every record it writes equals the record of the
    captured insert of the same row (values, id), and wins over that older insert."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        for statement in KINDS_DDL:
            conn.execute(statement)
        conn.execute("CREATE TABLE pairs (a text, b int, body text, PRIMARY KEY (a, b))")
    cfg = weir_config(db_url, [], tables=["public.kinds", "public.pairs"],
                      backfill={"page_size": 2})  # fmt: skip
    prepare(cfg)  # the slot: the inserts below are captured too
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(KINDS_ROW)
        conn.execute(
            "INSERT INTO pairs VALUES ('a.b c', 1, E'tab\\there'), ('', 2, E'back\\\\slash'),"
            " ('é>*', 3, E'new\\nline'), (E'\\\\N', 4, NULL), ('x', 5, E'\\r\\b\\f\\v')"
        )
    with serving(cfg):
        wait_for(lambda: len(events(db_url)) == 6, what="6 captured inserts")
        with psycopg.connect(db_url) as conn:
            wait_for(
                lambda: (
                    conn.execute(
                        "SELECT count(*) FROM weir.backfills WHERE finished_at IS NOT NULL"
                    ).fetchone()
                    == (2,)
                ),
                what="both backfills",
            )
    stored = {(r["collection_id"], r["record_id"]): (r["record"], r["version_idx"])
              for r in stored_rows.records(db_url)}  # fmt: skip
    captured = {(e["collection_id"], e["record_id"]): e["record"] for e in events(db_url)}
    assert set(stored) == set(captured)
    for key, record in captured.items():
        assert stored[key] == (record, -1), key  # the backfill's version won, same values


def test_copy_rows_reads_every_row_and_raises_the_servers_error(db_url: str) -> None:
    """Rows come from libpq directly or through psycopg's wait; either way all of them, in
    order, an error in the middle of a COPY is raised, and the connection goes on."""
    with snapshot.connect(db_url) as conn:
        for _ in range(3):
            rows = list(copy_rows(conn, sql.SQL("SELECT i, repeat(E'\\t', i % 50)"
                                                " FROM generate_series(1, 20000) i")))  # fmt: skip
            assert rows == [[str(i).encode(), b"\t" * (i % 50)] for i in range(1, 20001)]
        failing = sql.SQL("SELECT 1 / (15000 - i) FROM generate_series(1, 20000) i")
        with pytest.raises(psycopg.errors.DivisionByZero):
            list(copy_rows(conn, failing))
        assert conn.execute("SELECT 1").fetchone() == (1,)


# Every type the source server renders itself (TypeCatalog.json_sql), with a two-column key.
WIDE_DDL = """CREATE TABLE wide (
    id bigint, u uuid, i2 smallint, i4 int, o oid, b bool, t text, num numeric, d date,
    tm time, iv interval, rng int4range, m mood, dom posint, ts timestamp, tstz timestamptz,
    jb jsonb, jb2 jsonb, by bytea, PRIMARY KEY (id, u))"""
_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | _TEXT
    | st.floats(-1e15, 1e15, allow_nan=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=8,
)  # fmt: skip


def _dumps(value: object) -> str:
    return orjson.dumps(value).decode()


# JSON that parsers take as it is, or not: numbers past 64 bits and past a double's range (and
# both sides of where a double turns infinite), and nesting on both sides of MAX_DEPTH and 1024.
_HOSTILE_JSON = st.integers(-(10**400), 10**400).map(str) | st.sampled_from(
    ["1e400", "-1e400", "1e-400", "1.7976931348623158e308", "-1.7976931348623159e308",
     "123456789012345678901234567890", "0.1000000000000000000000001", "[1e308, 1e309]",
     "[" * 1024 + "]" * 1024, "[" * 1025 + "]" * 1025, '{"a": ' + "[" * 1024 + "]" * 1024 + "}",
     "[" * MAX_DEPTH + "]" * MAX_DEPTH, "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1),
     '{"a": ' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "}"]
)  # fmt: skip


_STAMP = st.datetimes().map(str) | st.sampled_from(
    ["infinity", "-infinity", "0044-03-15 12:00:00 BC", "10000-01-01 00:00:00",
     "294276-12-31 23:59:59.999999", "0001-01-01 00:00:00"]
)  # fmt: skip
_WIDE_ROW = st.tuples(
    st.uuids().map(str), st.integers(-(2**15), 2**15 - 1), st.integers(-(2**31), 2**31 - 1),
    st.integers(0, 2**32 - 1), st.booleans(), _TEXT,
    st.decimals(allow_nan=False, allow_infinity=False, places=4).map(str),
    st.dates().map(str), st.times().map(str), st.timedeltas().map(str),
    st.sampled_from(["[1,5)", "empty", "(,3]"]), st.sampled_from(["sad", "happy"]),
    st.integers(1, 2**31 - 1), _STAMP, _STAMP, _JSON.map(_dumps), _HOSTILE_JSON,
    st.binary(max_size=120),
)  # fmt: skip


def test_records_rendered_by_the_source_server_equal_the_converted_ones(db_url: str) -> None:
    """What the seed job reads when the server renders records (``records_query``) is what
    capture's converters and ``record_id_of`` make of the same rows, for every type it renders;
    a table with a type it cannot render (floats, arrays) or a text key is converted in Python.
    """
    with snapshot.connect(db_url) as conn:
        for statement in (*KINDS_DDL, WIDE_DDL, "CREATE TABLE slugs (k text PRIMARY KEY)"):
            conn.execute(statement)
        src = pg_source(db_url)
        assert snapshot.table_plan(conn, src, "public.kinds").rendered is None
        assert snapshot.table_plan(conn, src, "public.slugs").rendered is None
        plan = snapshot.table_plan(conn, src, "public.wide")
        query = plan.records_query(None, None)
        assert query is not None

        def records(pairs: list[tuple[str, bytes]]) -> dict[str, object]:
            return {rid: json.loads(rec) for rid, rec in pairs}  # exact numbers, deep nesting

        @settings(max_examples=40, deadline=None)
        @given(st.lists(_WIDE_ROW, min_size=1, max_size=25))
        def check(rows: list[tuple[object, ...]]) -> None:
            conn.execute("TRUNCATE wide")
            marks = ", ".join(["%s"] * 19)
            with conn.cursor() as cur:
                cur.executemany(f"INSERT INTO wide VALUES ({marks})",
                                [(i, *row) for i, row in enumerate(rows)])  # fmt: skip
                cur.execute("INSERT INTO wide (id, u) VALUES (-1, gen_random_uuid())")  # nulls
                cur.execute(
                    "INSERT INTO wide (id, u, by) VALUES (-2, gen_random_uuid(),"
                    " decode(repeat('ab', 300), 'hex'))"
                )  # base64 past 76 characters
            server = list(snapshot.read_records(conn, plan, None, None))
            converted = list(records_of(plan.rel, copy_rows(conn, plan.range_query(None, None))))
            assert len(server) == len(rows) + 2
            assert records(server) == records(converted)

        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(10_000)
        try:
            check()
        finally:
            sys.setrecursionlimit(limit)


def test_snapshot_writer_inserts_until_a_row_meets_a_stored_record(db_url: str) -> None:
    """Snapshot rows at version 40 go in by a plain insert until one meets a stored record;
    that batch and the later ones are checked row by row. Either way a stored version newer
    than the snapshot wins, an older one is replaced, and seqs are given out gap-free."""
    cfg = weir_config(db_url, [])
    store, sid, at = open_store(cfg), cfg.sources[0].sync_id, datetime.now(UTC)
    with store.connect() as conn:
        live = SourceWriter(conn, store, sid)
        live.write(
            [
                Change(
                    action="insert",
                    collection_id="public:t",
                    record_id=rid,
                    record={"v": "live"},
                    changes=None,
                    missing=(),
                    old_record_id=None,
                    version=lsn,
                    idx=0,
                    committed_at=utc_iso(at),
                )
                for rid, lsn in (("newer", 50), ("older", 30))
            ]
        )
        live.commit(50, 50)
        w = SnapshotWriter(conn, store, sid, 40, at)

        def merge(*ids: str) -> int:
            staged, accepted = w.write("public:t", [(rid, b'{"v": "snapshot"}') for rid in ids])
            conn.commit()
            assert staged == len(ids)
            return accepted

        assert merge("a1", "a2") == 2
        conn.execute("CREATE FUNCTION weir.poison() RETURNS trigger LANGUAGE plpgsql AS $$"
                     " BEGIN IF NEW.record_id = 'bad' THEN RAISE EXCEPTION 'refused'"
                     " USING ERRCODE = '54000'; END IF; RETURN NEW; END $$")  # fmt: skip
        conn.execute("CREATE TRIGGER poison BEFORE INSERT ON weir.record_index FOR EACH ROW"
                     " EXECUTE FUNCTION weir.poison()")  # fmt: skip
        conn.commit()
        w.write("public:t", [("lost", b"{}")])
        with pytest.raises(psycopg.errors.ProgramLimitExceeded):
            w.write("public:t", [("bad", b"{}")])
        conn.rollback()
        assert merge("a3") == 1  # numbered from 1 again: no gap in seqs
        assert merge("a4", "newer", "older") == 2  # the insert fails: checked row by row
        assert merge("a5") == 1
        records = {
            r["record_id"]: (r["seq"], r["version"], r["version_idx"], r["record"]["v"])
            for r in stored_rows.records(db_url)
        }
        (records_seq,) = conn.execute("SELECT records_seq FROM weir.sources").fetchone() or ()
    assert records.pop("newer") == (1, 50, 0, "live")
    from_snapshot = (40, SNAPSHOT_IDX, "snapshot")
    assert {rid: r[1:] for rid, r in records.items()} == dict.fromkeys(
        ["a1", "a2", "a3", "a4", "older", "a5"], from_snapshot
    )
    assert [records[rid][0] for rid in ("a1", "a2", "a3")] == [3, 4, 5]
    assert {records["a4"][0], records["older"][0]} == {6, 7}
    assert records["a5"][0] == records_seq == 8


def test_a_change_waiting_for_a_backfills_lock_does_not_replace_its_newer_row(db_url: str) -> None:
    """Capture's one-statement write of a change older than a backfill's snapshot, made while
    the backfill holds the source's lock, ends behind it: the backfilled row (newer) stays the
    record's version, and the records seqs given out stay unique."""
    cfg = weir_config(db_url, [])
    store, sid, at = open_store(cfg), cfg.sources[0].sync_id, datetime.now(UTC)
    with store.connect() as backfill_conn, store.connect() as capture_conn:
        capture = SourceWriter(capture_conn, store, sid)
        w = SnapshotWriter(backfill_conn, store, sid, 40, at)
        assert w.write("public:t", [("r", b'{"v": "snapshot"}')]) == (1, 1)  # holds the lock
        pid = capture_conn.info.backend_pid
        change = Change(action="update", collection_id="public:t", record_id="r",
                        record={"v": "captured"}, changes=None, missing=(), old_record_id=None,
                        version=30, idx=0, committed_at=utc_iso(at))  # fmt: skip
        thread = threading.Thread(target=capture.write_commit, args=([change], 30, 31))
        thread.start()
        wait_for(lambda: backfill_conn.execute(
            "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
        ).fetchone() == (True,), what="capture to wait for the backfill's lock")  # fmt: skip
        backfill_conn.commit()
        thread.join(30)
        assert not thread.is_alive()
        capture.write_commit([change._replace(record_id="s", version=50)], 50, 51)
    records = {r["record_id"]: r for r in stored_rows.records(db_url)}
    assert (records["r"]["version"], records["r"]["record"]["v"]) == (40, "snapshot")
    assert records["s"]["seq"] > records["r"]["seq"]
    assert [e["record"]["v"] for e in stored_rows.events(db_url)] == ["captured", "captured"]


def test_a_backfill_sends_no_record_again_whose_row_is_unchanged(db_url: str) -> None:
    """A table backfilled again: rows equal to their records keep their seqs (no reader gets
    them again), changed rows get new ones, and after an index rebuilt from the batches (as
    after a crash) the sweep of a later backfill still keeps them all."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE eq (id int PRIMARY KEY, v numeric, t text)")
        conn.execute("INSERT INTO eq SELECT i, i * 1.5, 't' || i FROM generate_series(1, 50) i")
    cfg = weir_config(db_url, [])
    store = prepare(cfg)
    src = cfg.sources[0]
    assert isinstance(src, PostgresSource)
    seqs = lambda: {r["record_id"]: r["seq"] for r in stored_rows.records(db_url)}  # noqa: E731
    Backfill(src, store, "public.eq", page_size=20).run(threading.Event(), new="always")
    first = seqs()
    assert len(first) == 50
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE eq SET v = 2.50 WHERE id = 3")  # 4.5 -> 2.50: another value
        conn.execute("UPDATE eq SET v = 6.00 WHERE id = 4")  # 6.0 -> 6.00: another scale
        conn.execute("DELETE FROM weir.record_index_state")  # and Postgres emptied the index
        conn.execute("TRUNCATE weir.record_index")
    Backfill(src, store, "public.eq", page_size=20).run(threading.Event(), new="always")
    again = seqs()
    assert {k for k in first if first[k] != again[k]} == {"3", "4"}
    assert min(again["3"], again["4"]) > max(first.values())
    with psycopg.connect(db_url, autocommit=True) as conn:  # the index rebuilt from the batches
        conn.execute("DELETE FROM weir.record_index_state")
        conn.execute("TRUNCATE weir.record_index")
        (snapshot_version,) = conn.execute("SELECT version FROM weir.backfills").fetchone() or ()
    with store.connect() as conn:
        index.ensure(conn, store)
    assert {r["version"] for r in stored_rows.records(db_url)} == {snapshot_version}
    Backfill(src, store, "public.eq", page_size=20).run(threading.Event(), new="always")
    assert seqs() == again
    live = {r["record_id"]: r["record"] for r in stored_rows.records(db_url, live_only=True)}
    assert len(live) == 50 and (live["3"]["v"], live["4"]["v"]) == ("2.50", "6.00")


def test_seed_job_under_concurrent_changes_equals_the_table(
    db_url: str, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """``weir seed`` on local[2] (the jar-less COPY reader) while rows are updated, deleted and
    inserted: the records stream equals the table, and NATS gets exactly its rows."""
    create_items(db_url, ROWS)
    config = write_config(tmp_path / "weir.yaml", db_url)
    with WeirProcess(config, tmp_path / "weir.log"):
        with Mutator(db_url, ROWS) as mutator:
            seed = subprocess.run(
                [*WEIR, "seed", "--config", str(config), "--source", "app", "--table",
                 "public.items", "--master", "local[2]", "--partitions", "4"],
                capture_output=True, text=True, timeout=600,
            )  # fmt: skip
        assert seed.returncode == 0, seed.stderr[-3000:]
        m = re.search(r"public.items: ([\d,]+) rows read in 4 partitions, ([\d,]+) written",
                      seed.stdout)  # fmt: skip
        assert m, seed.stdout
        read, written = (int(g.replace(",", "")) for g in m.groups())
        assert ROWS - mutator.deletes <= read <= ROWS + mutator.inserts
        assert written < read  # rows changed after the snapshot were left to capture
        assert mutator.updates and mutator.deletes and mutator.inserts
        wait_captured(db_url)
        records = assert_stream_equals_table(db_url)
    assert_nats_delivers_the_table(db_url, NatsHarness(nats_server), records)


def test_seed_job_through_jdbc(db_url: str, tmp_path: Path) -> None:
    """With a driver jar Spark reads through JDBC; the records are the same as the COPY path's."""
    create_items(db_url, 5000)
    config = write_config(tmp_path / "weir.yaml", db_url)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE items SET note = E'tab\\t \\\\ é' WHERE id = 7")
    seed = subprocess.run(
        [*WEIR, "seed", "--config", str(config), "--source", "app", "--table", "public.items",
         "--master", "local[2]", "--jdbc-jar", _jdbc_jar(), "--partitions", "3"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert seed.returncode == 0, seed.stderr[-3000:]
    assert "public.items: 5,000 rows read in 3 partitions, 5,000 written" in seed.stdout
    row = stored_rows.record(db_url, "public:items", "7")
    assert row is not None and row["record"] == {"id": 7, "v": 0, "note": "tab\t \\ é"}
    assert_stream_equals_table(db_url)
    # The seed noted the columns its records have: a column added, seen at the table's next
    # change (no event trigger: no superuser), reaches every record (a backfill), as after a
    # backfill.
    with WeirProcess(config, tmp_path / "weir.log"):
        wait_captured(db_url)
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("ALTER EVENT TRIGGER weir_follow_weir_pub DISABLE")
            conn.execute("ALTER TABLE items ADD COLUMN extra int DEFAULT 3")
            conn.execute("UPDATE items SET v = v + 1 WHERE id = 1")
        wait_for(lambda: all(r["record"].get("extra") == 3 for r in stored_rows.records(db_url)
                             if r["collection_id"] == "public:items" and not r["deleted"]),
                 timeout=120, what="the seeded records to take the added column")  # fmt: skip


def test_seed_job_under_spark_submit(db_url: str, tmp_path: Path) -> None:
    """``spark-submit spark/seed.py`` takes the same arguments as ``weir seed``; spark-submit
    is given the master and the network settings (loopback: tests bind only to it)."""
    create_items(db_url, 5000)
    config = write_config(tmp_path / "weir.yaml", db_url)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    home = java_home()
    if home:
        env["JAVA_HOME"] = home
    seed = subprocess.run(
        [str(Path(sys.executable).parent / "spark-submit"), "--master", "local[2]",
         *(a for k, v in LOOPBACK_CONF.items() for a in ("--conf", f"{k}={v}")),
         str(ROOT / "spark" / "seed.py"), "--config", str(config), "--source", "app",
         "--table", "public.items", "--partitions", "3"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert seed.returncode == 0, seed.stderr[-3000:]
    assert "public.items: 5,000 rows read in 3 partitions, 5,000 written" in seed.stdout
    assert_stream_equals_table(db_url)


@pytest.mark.slow
def test_backfill_killed_and_resumed_under_concurrent_changes_equals_the_table(
    db_url: str, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """``weir backfill`` SIGKILLed in the middle and run again, while rows change: it resumes
    where it was, and the records stream equals the table; NATS gets exactly its rows."""
    create_items(db_url, ROWS)
    config = write_config(tmp_path / "weir.yaml", db_url)
    command = [*WEIR, "backfill", "--config", str(config), "--source", "app",
               "--table", "public.items", "--page-size", "2000"]  # fmt: skip
    with WeirProcess(config, tmp_path / "weir.log"):
        with Mutator(db_url, ROWS) as mutator:
            first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            try:
                wait_for(lambda: _backfill_state(db_url)[0] >= 40_000, timeout=120,
                         what="the backfill to be under way")  # fmt: skip
            finally:
                first.kill()
                first.wait()
            at_kill, _, total, finished = _backfill_state(db_url)
            assert not finished and at_kill < ROWS
            assert ROWS - mutator.deletes <= total <= ROWS + mutator.inserts
            row = _status_of(config, "public.items")  # where the stopped backfill stands
            assert row[1:5] == ["app", f"{at_kill:,}", f"{total:,}", f"{at_kill * 100 // total}%"]
            assert row[6:8] == ["last", "page"], row
            second = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert second.returncode == 0, second.stderr[-3000:]
        assert "backfill public.items: resuming at version" in second.stderr
        rows_read, written, total, finished = _backfill_state(db_url)
        assert finished
        done = [f"{rows_read:,}", f"{total:,}", "100%", f"{written:,}", "finished"]
        assert _status_of(config, "public.items")[2:] == done
        assert ROWS - mutator.deletes <= rows_read <= ROWS + mutator.inserts  # none read twice
        assert mutator.updates and mutator.deletes and mutator.inserts
        wait_captured(db_url)
        records = assert_stream_equals_table(db_url)
    assert_nats_delivers_the_table(db_url, NatsHarness(nats_server), records)
