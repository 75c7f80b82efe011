"""Schemas as real databases have them, changing while Weir runs or while capture lags behind:
DDL, tables created on the fly, partitions, odd keys and names, other encodings. The check is
the user's: the records stream (and a NATS subscriber) equal the table, capture goes on."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import psycopg
import pytest

from core.runtime.service import prepare
from devkit.embedded import EmbeddedNats, EmbeddedPostgres
from tests.adversarial.stack import Stack
from tests.helpers import stored
from tests.helpers.capture import wait_for
from tests.helpers.sql import execute, wait_records
from tests.helpers.weir import serving, weir_config


def _table(url: str, query: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(url) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return {str(r["id"]): dict(r) for r in cur.execute(query).fetchall()}


def _live(stack: Stack, collection: str) -> dict[str, Any]:
    return {rid: rec for rid, (deleted, rec) in stack.store_records(collection).items()
            if not deleted}  # fmt: skip


def test_columns_added_dropped_and_renamed_leave_the_records_stream(
    db_url: str, nats_server: EmbeddedNats
) -> None:
    """After DDL, the next version of a record has exactly the table's columns, also when the
    update leaves a TOASTed value out (the stored one is kept, the dropped ones are not)."""
    execute(db_url, "CREATE TABLE t (id int PRIMARY KEY, a text, b text, big text)",
          "ALTER TABLE t ALTER COLUMN big SET STORAGE EXTERNAL")  # fmt: skip
    stack = Stack(db_url, nats_server, None)
    with stack.running():
        execute(
            db_url, "INSERT INTO t VALUES (1, 'a1', 'b1', repeat('x', 5000)), (2, 'a2', 'b2', 'y')"
        )
        stack.sync()
        execute(db_url, "ALTER TABLE t DROP COLUMN b", "ALTER TABLE t RENAME COLUMN a TO a2",
              "ALTER TABLE t ADD COLUMN c int DEFAULT 7",
              "UPDATE t SET c = 8 WHERE id = 1",  # big is sent as an unchanged TOAST value
              "UPDATE t SET a2 = 'z' WHERE id = 2")  # fmt: skip
        stack.sync()
        want = _table(db_url, "SELECT * FROM t")
        assert _live(stack, "public:t") == want
        got = stack.subscriber_records("public:t")["nats-records"]
        assert {rid: rec for rid, (_, rec) in got.items()} == want


def test_key_renamed_or_replaced_while_capture_lags(db_url: str) -> None:
    """Changes read after their table's key was renamed or replaced are keyed as they were
    made (pgoutput describes the relation as of the change), not as the catalog has it now."""
    execute(db_url, "CREATE TABLE t (id int PRIMARY KEY, n int)")
    cfg = weir_config(db_url, [])
    prepare(cfg)  # the slot: what follows waits in the WAL
    execute(db_url, "BEGIN; INSERT INTO t VALUES (1, 1); ALTER TABLE t RENAME COLUMN id TO uid;"
                  " INSERT INTO t VALUES (2, 2); COMMIT",
          "ALTER TABLE t ADD COLUMN k text NOT NULL DEFAULT 'k'",
          "ALTER TABLE t DROP CONSTRAINT t_pkey, ADD PRIMARY KEY (k, uid)",
          "INSERT INTO t VALUES (3, 3, 'x')")  # fmt: skip
    with serving(cfg):
        wait_for(lambda: len(stored.events(db_url)) == 3, what="3 events")
    assert [e["record_id"] for e in stored.events(db_url)] == ["1", "2", "x,3"]


def test_tables_created_while_weir_runs_are_captured_from_their_first_row(
    db_url: str, nats_server: EmbeddedNats
) -> None:
    """A table created in a followed schema is captured from its first committed row (even in
    the transaction that made it); one without a key is left out, and the user's writes to it
    still work; given a key later, or made with its rows (CREATE TABLE AS), its rows are
    backfilled and its changes captured from then on."""
    stack = Stack(db_url, nats_server, None)
    with stack.running():
        execute(db_url, "BEGIN; CREATE TABLE fresh (id int PRIMARY KEY, v text);"
                      " INSERT INTO fresh VALUES (1, 'first'); COMMIT",
              "INSERT INTO fresh VALUES (2, 'second')",
              "CREATE TABLE loose (a int, b text)", "INSERT INTO loose VALUES (1, 'x')",
              "UPDATE loose SET b = 'y'", "DELETE FROM loose",  # no replica identity: still works
              "CREATE TABLE later (id int, v text)", "INSERT INTO later VALUES (1, 'before')",
              "ALTER TABLE later ADD PRIMARY KEY (id)", "INSERT INTO later VALUES (2, 'after')",
              "CREATE UNLOGGED TABLE scratch (id int PRIMARY KEY)",
              "INSERT INTO scratch VALUES (1)",
              "CREATE TABLE copied AS SELECT i AS id FROM generate_series(1, 30) i",
              "ALTER TABLE copied ADD PRIMARY KEY (id)")  # fmt: skip
        stack.sync()
        assert _live(stack, "public:fresh") == _table(db_url, "SELECT * FROM fresh")
        assert stack.store_records("public:loose") == {}
        assert stack.store_records("public:scratch") == {}
        got = stack.subscriber_records("public:fresh")["nats-records"]
        assert sorted(got) == ["1", "2"]
        wait_records(db_url, "public:later", 2)  # the row from before its key: a backfill
        assert _live(stack, "public:later") == _table(db_url, "SELECT * FROM later")
        wait_records(db_url, "public:copied", 30)


def test_a_table_created_while_weir_was_down_is_backfilled(db_url: str) -> None:
    """Its rows from before Weir came back never reached the WAL under the publication: a
    backfill brings them into the records stream; later rows are captured."""
    execute(db_url, "CREATE TABLE t (id int PRIMARY KEY)")
    cfg = weir_config(db_url, [])
    with serving(cfg):
        execute(db_url, "INSERT INTO t VALUES (1)")
        wait_records(db_url, "public:t", 1)
    # Down: the event trigger is dropped (as without a superuser), then a table appears.
    execute(db_url, "DROP EVENT TRIGGER weir_follow_weir_pub",
          "CREATE TABLE late (id int PRIMARY KEY, v text)",
          "INSERT INTO late SELECT i, 'v' FROM generate_series(1, 50) i")  # fmt: skip
    with serving(cfg):
        execute(db_url, "INSERT INTO late VALUES (51, 'live')")
        wait_records(db_url, "public:late", 51)


def test_partitioned_tables_are_one_collection(db_url: str, nats_server: EmbeddedNats) -> None:
    """Rows of every partition (one made while Weir runs too) arrive under the parent's
    collection, and a row moved to another partition is an update of one record."""
    execute(db_url, "CREATE TABLE orders (id int, region text, v int, PRIMARY KEY (id, region))"
                  " PARTITION BY LIST (region)",
          "CREATE TABLE orders_eu PARTITION OF orders FOR VALUES IN ('eu')",
          "CREATE TABLE orders_us PARTITION OF orders FOR VALUES IN ('us')")  # fmt: skip
    # Keyed by id alone (key_columns; a partitioned table's primary key must hold the partition
    # column), so a row can move between partitions and stay one record.
    execute(db_url, "CREATE TABLE moves (id int NOT NULL, region text NOT NULL, v int)"
                  " PARTITION BY LIST (region)",
          "CREATE TABLE moves_eu PARTITION OF moves FOR VALUES IN ('eu')",
          "CREATE TABLE moves_us PARTITION OF moves FOR VALUES IN ('us')",
          "ALTER TABLE moves REPLICA IDENTITY FULL", "ALTER TABLE moves_eu REPLICA IDENTITY FULL",
          "ALTER TABLE moves_us REPLICA IDENTITY FULL")  # fmt: skip
    # Partitioned by an expression: whether a row moved is not known from the key's columns.
    execute(db_url, "CREATE TABLE expr (id int NOT NULL, v int) PARTITION BY RANGE ((id % 2))",
          "CREATE TABLE expr_0 PARTITION OF expr FOR VALUES FROM (0) TO (1)",
          "CREATE TABLE expr_1 PARTITION OF expr FOR VALUES FROM (1) TO (2)",
          *[f"ALTER TABLE {t} REPLICA IDENTITY FULL"
            for t in ("expr", "expr_0", "expr_1")])  # fmt: skip
    stack = Stack(db_url, nats_server, None)
    with stack.running(key_columns={"public.moves": ["id"], "public.expr": ["id"]}):
        execute(db_url, "INSERT INTO orders VALUES (1, 'eu', 1), (2, 'us', 2)",
              "CREATE TABLE orders_ap PARTITION OF orders FOR VALUES IN ('ap')",
              "INSERT INTO orders VALUES (3, 'ap', 3)",
              "INSERT INTO moves VALUES (1, 'eu', 1)",
              "UPDATE moves SET region = 'us', v = 2 WHERE id = 1",
              # Deleted and inserted anew in one partition: that is what happened.
              "BEGIN; DELETE FROM moves WHERE id = 1;"
              " INSERT INTO moves VALUES (1, 'us', 3); COMMIT",
              "BEGIN; INSERT INTO expr VALUES (1, 1); DELETE FROM expr WHERE id = 1;"
              " INSERT INTO expr VALUES (1, 2); COMMIT")  # fmt: skip
        stack.sync()
        assert [e["action"] for e in stack.events("public:expr")] == ["insert", "delete", "insert"]
        assert sorted(_live(stack, "public:orders")) == ["1,eu", "2,us", "3,ap"]
        assert stack.store_records("public:orders_eu") == {}
        events = stack.events("public:moves")
        assert [e["action"] for e in events] == ["insert", "update", "delete", "insert"]
        assert events[1]["changes"] == {"region": "eu", "v": 1}
        assert _live(stack, "public:moves") == {"1": {"id": 1, "region": "us", "v": 3}}


def test_an_update_that_moves_a_key_keeps_its_toasted_values(db_url: str) -> None:
    """``UPDATE t SET id = 2``: events subscribers see the old record deleted and the new one
    inserted; the server leaves the TOASTed body out, and the new record takes it from the
    old one (stored earlier, or in the same batch)."""
    execute(db_url, "CREATE TABLE t (id int PRIMARY KEY, body text)",
          "ALTER TABLE t ALTER COLUMN body SET STORAGE EXTERNAL")  # fmt: skip
    with serving(weir_config(db_url, [])):
        execute(db_url, "INSERT INTO t VALUES (1, repeat('x', 10000))")
        wait_records(db_url, "public:t", 1)
        execute(db_url, "UPDATE t SET id = 2 WHERE id = 1",
              "BEGIN; INSERT INTO t VALUES (5, repeat('y', 10000));"
              " UPDATE t SET id = 6 WHERE id = 5; COMMIT")  # fmt: skip
        wait_records(db_url, "public:t", 2)
    recs = sorted((r["record_id"], r["deleted"], len(r["record"]["body"]))
                  for r in stored.records(db_url))  # fmt: skip
    assert recs == [("1", True, 10000), ("2", False, 10000), ("5", True, 10000),
                    ("6", False, 10000)]  # fmt: skip
    evs = [(e["record_id"], e["action"]) for e in stored.events(db_url)]
    assert evs == [("1", "insert"), ("1", "delete"), ("2", "insert"), ("5", "insert"),
                   ("5", "delete"), ("6", "insert")]  # fmt: skip


def test_odd_keys_names_and_identities(db_url: str) -> None:
    """A replica identity other than the primary key keys records by its columns (a delete
    carries nothing else); schemas with ':' are collections of their own; an unlogged table
    is left out; domains nest deep; array elements keep non-ASCII spaces."""
    execute(db_url,
          "CREATE TABLE ident (id int PRIMARY KEY, email text NOT NULL UNIQUE, v text)",
          "ALTER TABLE ident REPLICA IDENTITY USING INDEX ident_email_key",
          'CREATE SCHEMA "a:b"', 'CREATE TABLE "a:b".c (id int PRIMARY KEY)',
          'CREATE SCHEMA a', 'CREATE TABLE a."b:c" (id int PRIMARY KEY)',
          "CREATE UNLOGGED TABLE scratch (id int PRIMARY KEY)",
          "CREATE DOMAIN d0 AS int", *[f"CREATE DOMAIN d{i} AS d{i - 1}" for i in range(1, 13)],
          "CREATE TABLE deep (id int PRIMARY KEY, v d12, tags text[])")  # fmt: skip
    cfg = weir_config(db_url, [], schemas=["public", "a:b", "a"])
    with serving(cfg):
        execute(db_url, "INSERT INTO ident VALUES (1, 'a@x', 'A'), (2, 'b@x', 'B')",
              "DELETE FROM ident WHERE id = 2", 'INSERT INTO "a:b".c VALUES (1)',
              'INSERT INTO a."b:c" VALUES (2)', "INSERT INTO scratch VALUES (1)",
              "INSERT INTO deep VALUES"
              " (1, 7, ARRAY[E'\\u00a0NULL', E'a\\u001f', E'\\u3000x'])")  # fmt: skip
        wait_records(db_url, "public:deep", 1)
        recs = sorted((r["collection_id"], r["record_id"], r["deleted"], r["record"])
                      for r in stored.records(db_url))  # fmt: skip
    assert [r[:3] for r in recs] == [
        ("a%3Ab:c", "1", False), ("a:b:c", "2", False), ("public:deep", "1", False),
        ("public:ident", "a%40x", False), ("public:ident", "b%40x", True),
    ]  # fmt: skip
    deep = next(r[3] for r in recs if r[0] == "public:deep")
    assert deep == {"id": 1, "v": 7, "tags": ["\u00a0NULL", "a\u001f", "\u3000x"]}


@pytest.mark.parametrize(
    ("encoding", "column", "expected"),
    [("LATIN1", "'é ÿ ©'", "é ÿ ©"),
     ("WIN1252", "convert_from('\\x81', 'WIN1252')", "\x81"),  # a byte WIN1252 has no letter for
     ("SQL_ASCII", "convert_from('\\xe9', 'SQL_ASCII')", "é"),  # any bytes: Latin-1 past UTF-8
     ("SQL_ASCII", "convert_from('\\xc3a9', 'SQL_ASCII')", "é")],
    ids=["latin1", "win1252-unmapped", "sql-ascii-latin1", "sql-ascii-utf8"],
)  # fmt: skip
def test_databases_in_other_encodings(
    pg_server: EmbeddedPostgres, db_url: str, encoding: str, column: str, expected: str
) -> None:
    """Text comes through whatever the database's encoding, names included, and no byte it
    holds can stop capture. (The store itself is a UTF-8 database.)"""
    name = f"enc_{hashlib.md5(column.encode()).hexdigest()[:8]}"
    execute(pg_server.url, f"DROP DATABASE IF EXISTS {name}",
          f"CREATE DATABASE {name} ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C'"
          " TEMPLATE template0")  # fmt: skip
    url = pg_server.url.rsplit("/", 1)[0] + "/" + name
    table = '"té"' if encoding == "LATIN1" else "t"
    execute(url, f"CREATE TABLE {table} (id int PRIMARY KEY, v text)")
    cfg = weir_config(url, [], store={"url": db_url})
    try:
        with serving(cfg):
            execute(url, f"INSERT INTO {table} VALUES (1, {column})")
            collection = "public:té" if encoding == "LATIN1" else "public:t"
            wait_records(db_url, collection, 1)
        row = [r["record"]["v"] for r in stored.records(db_url) if r["collection_id"] == collection]
        assert row == [expected]
    finally:
        execute(pg_server.url, "SELECT pg_drop_replication_slot(slot_name)"
                             f" FROM pg_replication_slots WHERE database = '{name}'",
              f"DROP DATABASE {name} WITH (FORCE)")  # fmt: skip


def test_what_other_roles_and_ddl_do_cannot_take_capture_down(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Any role may write logical messages: a forged backfill request (garbage, or naming a
    table outside the source) is ignored and capture goes on. Inheritance children are tables
    of their own (left out without a key, and the user's writes to them still work). A listed
    table dropped and made anew is captured again at once, its old records tombstoned; one
    renamed away is said to be left out, and its records become tombstones."""
    execute(db_url, "CREATE ROLE forger LOGIN",
          "CREATE TABLE a (id int PRIMARY KEY, v text)",
          "CREATE TABLE private (id int PRIMARY KEY)", "INSERT INTO private VALUES (1)",
          "CREATE TABLE parent (id int PRIMARY KEY, v text)",
          "CREATE TABLE child (extra text) INHERITS (parent)",
          "CREATE TABLE r (id int PRIMARY KEY)")  # fmt: skip
    cfg = weir_config(db_url, [], schemas=[], tables=["public.a", "public.parent", "public.r"])
    forger = db_url.replace("postgres@", "forger@")
    with serving(cfg):
        execute(forger, "SELECT pg_logical_emit_message(true, 'weir:backfill', 'not json')",
              """SELECT pg_logical_emit_message(true, 'weir:backfill', '["public", "private"]')""",
              "SELECT pg_logical_emit_message(true, 'weir:dropped', '[1, 2]')")  # fmt: skip
        execute(db_url, "INSERT INTO parent VALUES (9, 'q')")
        wait_records(db_url, "public:parent", 1)
        # A forged drop of a table that is there changes nothing.
        execute(
            forger,
            """SELECT pg_logical_emit_message(true, 'weir:dropped', '["public", "parent"]')""",
        )
        execute(db_url, "DELETE FROM parent WHERE id = 9")
        execute(db_url, "INSERT INTO a VALUES (1, 'x'), (2, 'y')",
              "INSERT INTO child VALUES (7, 'c', 'e')", "UPDATE child SET v = 'd'",
              "INSERT INTO parent VALUES (8, 'p')")  # fmt: skip
        wait_records(db_url, "public:parent", 1)
        execute(db_url, "DROP TABLE a", "CREATE TABLE a (id int PRIMARY KEY, v text)",
              "INSERT INTO a VALUES (3, 'z')", "INSERT INTO r VALUES (1)",
              "ALTER TABLE r RENAME TO r2", "INSERT INTO r2 VALUES (2)")  # fmt: skip
        want = {("public:a", "1"): True, ("public:a", "2"): True, ("public:a", "3"): False,
                ("public:parent", "8"): False, ("public:parent", "9"): True,
                ("public:r", "1"): True}  # fmt: skip

        def records() -> dict[tuple[str, str], bool]:
            return {(r["collection_id"], r["record_id"]): r["deleted"]
                    for r in stored.records(db_url)}  # fmt: skip

        wait_for(lambda: records() == want, what="the records as the tables have them")
        time.sleep(1)  # a backfill of private, were it asked for, would show by now
        assert records() == want
    assert "ignored a weir:backfill message that names no table" in caplog.text
    assert "table public.r was renamed or moved to public.r2" in caplog.text


def test_records_are_keyed_anew_when_the_key_changes(
    db_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """key_columns edited between runs (or another primary key or replica identity): the table
    is backfilled, its records under the new key live, those under the old one tombstones."""
    execute(db_url, "CREATE TABLE t (a int NOT NULL, b text NOT NULL, v int)",
          "ALTER TABLE t REPLICA IDENTITY FULL",
          "INSERT INTO t VALUES (1, 'x', 1), (2, 'y', 2)")  # fmt: skip
    with serving(weir_config(db_url, [], key_columns={"public.t": ["a"]},
                             backfill={"tables": ["public.t"]})):  # fmt: skip
        wait_records(db_url, "public:t", 2)
        execute(db_url, "INSERT INTO t VALUES (3, 'z', 3)")
        wait_records(db_url, "public:t", 3)
    with serving(weir_config(db_url, [], key_columns={"public.t": ["b"]})):
        execute(db_url, "UPDATE t SET v = 30 WHERE a = 3")  # a change under the new key

        def keyed_anew() -> bool:
            got = [(r["record_id"], r["deleted"]) for r in stored.records(db_url)]
            return sorted(got) == [("1", True), ("2", True), ("3", True), ("x", False),
                                    ("y", False), ("z", False)]  # fmt: skip

        wait_for(keyed_anew, timeout=60, what="the records keyed anew")
    assert "table public.t is keyed by b now, no longer by a" in caplog.text


def test_the_swap_migration_leaves_the_records_stream_equal_to_the_table(db_url: str) -> None:
    """Build a new table, rename the old one away and the new one into its place, drop the old:
    the collection's records are the new table's rows, whatever changed when."""
    execute(db_url, "CREATE TABLE a (id int PRIMARY KEY, v text)",
          "INSERT INTO a VALUES (1, 'old'), (2, 'old')")  # fmt: skip
    with serving(weir_config(db_url, [], backfill={"tables": ["public.a"]})):
        wait_records(db_url, "public:a", 2)
        execute(db_url, "CREATE TABLE a_new (id int PRIMARY KEY, v text)",
              "INSERT INTO a_new VALUES (2, 'new'), (3, 'new')",
              "BEGIN; ALTER TABLE a RENAME TO a_old; ALTER TABLE a_new RENAME TO a; COMMIT",
              "DROP TABLE a_old", "INSERT INTO a VALUES (4, 'after')")  # fmt: skip

        def live() -> dict[str, Any]:
            return {r["record_id"]: r["record"]["v"] for r in stored.records(db_url, live_only=True)
                    if r["collection_id"] == "public:a"}  # fmt: skip

        wait_for(lambda: live() == {"2": "new", "3": "new", "4": "after"}, timeout=60,
                 what="public:a as the new table has it")  # fmt: skip
