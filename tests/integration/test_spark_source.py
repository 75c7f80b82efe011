"""Weir's streams as a Spark data source on local[2] (docs/spark.md): a query of the events
stream reads every change once, in order within each record, while ``weir run`` captures, and
again once after its driver is killed and restarted from its checkpoint; a batch read of the
records stream equals the table; a query whose events retention deleted fails, naming them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import psycopg
import pyarrow.parquet as pq
import pytest

from core.config.load import load_config
from core.store import Store, retention
from devkit.embedded import EmbeddedNats
from devkit.server import free_port
from tests.connectors.nats.harness import NatsHarness
from tests.helpers.api import TOKEN, api_serving
from tests.helpers.brokers import wait_delivered
from tests.helpers.capture import wait_for
from tests.helpers.weir import cursor_of, serving

WEIR = str(Path(sys.executable).parent / "weir")


def _config(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "weir.yaml"
    source = {"name": "app", "kind": "postgres", "url": url, "schemas": ["public"]}
    path.write_text(json.dumps({"sources": [source], "connectors": []}))
    return path


def _stream(config: Path, tmp_path: Path, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [WEIR, "spark", "stream", "--config", str(config), "--source", "app", "--master",
         "local[2]", "--out", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "cp"),
         "--name", "q", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip


def _finish(p: subprocess.Popen[bytes], timeout: float = 300) -> str:
    out, _ = p.communicate(timeout=timeout)
    text = out.decode(errors="replace")
    assert p.returncode == 0, text[-3000:]
    return text


def _read(tmp_path: Path) -> list[dict[str, Any]]:
    """The rows of the files the query's sink committed, as Spark reads them: those its log
    (``_spark_metadata``) lists; a killed batch's files are not (it is written again)."""
    log = tmp_path / "out" / "_spark_metadata"
    files: set[str] = set()
    for entry in sorted(log.glob("*")) if log.exists() else []:
        if entry.name.startswith("."):
            continue
        for line in entry.read_text().splitlines()[1:]:  # after the version line
            f = json.loads(line)
            (files.add if f["action"] == "add" else files.discard)(f["path"])
    rows: list[dict[str, Any]] = []
    for path in sorted(files):
        local = unquote(path.removeprefix("file://"))  # a URI
        collection = unquote(Path(local).parent.name.removeprefix("collection_id="))
        got = pq.read_table(local).to_pylist()
        last: dict[str, int] = {}
        for r in got:  # a record's messages in seq order within each file (a partition's)
            assert r["seq"] > last.get(r["record_id"], 0), (local, r)
            last[r["record_id"]] = r["seq"]
        rows += [{**r, "collection_id": collection} for r in got]
    return rows


def _store_seqs(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT events_seq FROM weir.sources WHERE name = 'app'").fetchone()
    return int(row[0]) if row else 0


def _changes(url: str, ids: range, rounds: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for i in ids:
            conn.execute("INSERT INTO t VALUES (%s, 'v0')", (i,))
        for r in range(1, rounds):
            for i in ids:
                conn.execute("UPDATE t SET body = %s WHERE id = %s", (f"v{r}", i))
        for i in ids[::3]:
            conn.execute("DELETE FROM t WHERE id = %s", (i,))


def _check(rows: list[dict[str, Any]], head: int, ids: range, rounds: int) -> None:
    """Every seq up to ``head`` once; each record's changes in the order made."""
    seqs = sorted(r["seq"] for r in rows)
    assert seqs == list(range(1, head + 1)), (len(seqs), head)
    by_record: dict[str, list[Any]] = {}
    for r in sorted(rows, key=lambda r: r["seq"]):
        body = json.loads(r["record"])["body"]
        by_record.setdefault(r["record_id"], []).append((r["action"], body))
    for i in ids:
        want = [("insert", "v0")] + [("update", f"v{n}") for n in range(1, rounds)]
        if i % 3 == ids[0] % 3:
            want.append(("delete", f"v{rounds - 1}"))
        assert by_record[str(i)] == want, (i, by_record[str(i)])


@pytest.mark.slow
def test_a_query_reads_every_change_once_in_order_across_a_sigkill(
    tmp_path: Path, table: str
) -> None:
    with psycopg.connect(table, autocommit=True) as conn:
        conn.execute("ALTER TABLE t REPLICA IDENTITY FULL")  # a delete's record: the whole row
    config = _config(tmp_path, table)
    with serving(load_config(config)):
        _changes(table, range(0, 60), 3)
        wait_for(lambda: _store_seqs(table) >= 60 * 3 + 20, what="the first changes stored")
        _finish(_stream(config, tmp_path, "--available-now", "--max-per-trigger", "50"))
        first = _store_seqs(table)
        _check(_read(tmp_path), first, range(0, 60), 3)
        assert cursor_of(table, "spark:q")[0] == first  # the query's position, in the store
        # A query running while changes come, killed mid-stream, then run again from its
        # checkpoint: every change still once.
        running = _stream(config, tmp_path, "--every", "0.5", "--max-per-trigger", "40")
        _changes(table, range(100, 160), 4)
        wait_for(lambda: len(_read(tmp_path)) > first + 40, timeout=180, what="a batch written")
        os.kill(running.pid, signal.SIGKILL)
        running.wait(30)
        wait_for(lambda: _store_seqs(table) >= first + 60 * 4 + 20, what="all changes stored")
        _finish(_stream(config, tmp_path, "--available-now"))
        _check(_read(tmp_path), _store_seqs(table), range(100, 160), 4)
        _check(_read(tmp_path), _store_seqs(table), range(0, 60), 3)
        assert cursor_of(table, "spark:q")[0] == _store_seqs(table)


BATCH_READ = """
import sys
import time
from spark.session import spark_session
from spark.source import WeirSource
spark = spark_session("local[2]", None, app="weir-test")
spark.dataSource.register(WeirSource)
df = spark.read.format("weir").option("config", sys.argv[1]).option("stream", "records").load()
for r in df.where("NOT deleted").select("record_id", "record").collect():
    print(r.record_id, r.record)
"""


@pytest.mark.slow
def test_a_batch_read_of_the_records_stream_equals_the_table_and_a_pruned_query_fails(
    tmp_path: Path, table: str
) -> None:
    config = _config(tmp_path, table)
    with serving(load_config(config)):
        _changes(table, range(0, 30), 3)
        wait_for(lambda: _store_seqs(table) >= 30 * 3 + 10, what="the changes stored")
    done = subprocess.run([sys.executable, "-c", BATCH_READ, str(config)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1])
           for line in done.stdout.splitlines()}  # fmt: skip
    with psycopg.connect(table) as conn:
        rows = conn.execute("SELECT id, body FROM t").fetchall()
    assert got == {str(i): {"id": i, "body": body} for i, body in rows}
    # Retention deleted the first events (as core/store/retention.py does): a new query from
    # the beginning fails, naming them, and writes nothing.
    with psycopg.connect(table, autocommit=True) as conn:
        first = conn.execute("SELECT min(first_seq), min(last_seq) FROM weir.event_batches"
                             ).fetchone()  # fmt: skip
        assert first is not None
        conn.execute("DELETE FROM weir.event_batches WHERE first_seq = %s", (first[0],))
    p = _stream(config, tmp_path, "--available-now")
    out, _ = p.communicate(timeout=300)
    assert p.returncode != 0
    assert f"events 1 to {first[1]} of source" in out.decode(), out.decode()[-3000:]
    assert "deleted by retention" in out.decode()
    assert _read(tmp_path) == []


@pytest.mark.slow
def test_a_stopped_query_holds_retention_back_up_to_readers_hold(
    tmp_path: Path, table: str
) -> None:
    """Events past retention that a stopped query has not read stay, and it reads them when it
    starts again; beyond ``store.readers_hold`` they go, and the query fails naming them."""
    config = _config(tmp_path, table)
    cfg = load_config(config)
    store = Store(cfg.store_url)
    with serving(cfg):
        _changes(table, range(0, 20), 2)
        wait_for(lambda: _store_seqs(table) >= 20 * 2 + 6, what="the first changes stored")
        _finish(_stream(config, tmp_path, "--available-now"))
        read = cursor_of(table, "spark:q")[0]
        assert read == _store_seqs(table)
        _changes(table, range(50, 70), 2)
        wait_for(lambda: _store_seqs(table) >= read + 46, what="more changes stored")
    head = _store_seqs(table)
    status = subprocess.run([WEIR, "status", "--config", str(config), "--interval", "0.2"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    row = next(line.split() for line in status.stdout.splitlines() if "spark:q" in line)
    assert row[0] == "spark:q" and row[2:5] == ["app", "events", str(head - read)], status.stdout
    with psycopg.connect(table) as conn:
        kept = conn.execute("SELECT count(*) FROM weir.event_batches WHERE last_seq > %s",
                            (read,)).fetchone()  # fmt: skip
    assert retention.delete_older(store, timedelta(0), timedelta(days=1)) == read
    with psycopg.connect(table) as conn:
        assert conn.execute("SELECT count(*) FROM weir.event_batches").fetchone() == kept
    _finish(_stream(config, tmp_path, "--available-now"))
    assert sorted(r["seq"] for r in _read(tmp_path)) == list(range(1, head + 1))
    # a second query that has read nothing, stopped for longer than readers_hold
    with psycopg.connect(table, autocommit=True) as conn:
        conn.execute("UPDATE weir.cursors SET seq = %s WHERE connector = 'spark:q'", (read,))
    assert retention.delete_older(store, timedelta(0), timedelta(0)) == head - read
    p = _stream(config, tmp_path / "again", "--start", f"seq:{read + 1}")
    out, _ = p.communicate(timeout=300)
    assert p.returncode != 0 and f"events {read + 1} to {head} of source" in out.decode()


@pytest.mark.slow
def test_the_example_aggregate_reaches_a_nats_subscriber_once_after_a_replay(
    tmp_path: Path, table: str, nats_server: EmbeddedNats
) -> None:
    """Per-customer totals computed from the events stream, written through the writer into
    the http source ``stripe`` and forwarded by its NATS connector; a micro-batch Spark runs
    again (its commit removed from the checkpoint, as after a crash) reaches no one twice."""
    with psycopg.connect(table, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY, customer_id int, total numeric)")
    nats = NatsHarness(nats_server)
    c = nats.connector("totals", "events", sources=["stripe"])
    nats.prepare(c)
    port = free_port()
    config = tmp_path / "weir.yaml"  # what api_serving runs
    config.write_text(json.dumps({
        "api": {"listen": f"127.0.0.1:{port}", "tokens": [TOKEN]}, "connectors": [c],
        "sources": [{"name": "app", "kind": "postgres", "url": table, "schemas": ["public"]},
                    {"name": "stripe", "kind": "http", "provider": "stripe"}]}))  # fmt: skip
    checkpoint = tmp_path / "cp"

    def run() -> None:
        done = subprocess.run(
            [sys.executable, "-m", "spark.examples.customer_totals", "--config", str(config),
             "--source", "app", "--into", "stripe", "--checkpoint", str(checkpoint),
             "--master", "local[2]", "--available-now"],
            capture_output=True, text=True, timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]

    with api_serving(table, port=port, connectors=[c]) as client, \
            psycopg.connect(table, autocommit=True) as conn:  # fmt: skip
        for i, (customer, total) in enumerate([(1, "10.5"), (2, "3"), (1, "4.5"), (3, "1")]):
            conn.execute("INSERT INTO orders VALUES (%s, %s, %s)", (i, customer, total))
        wait_for(lambda: _store_seqs(table) >= 4, what="the orders stored")
        run()
        got = wait_delivered(nats, c, 3, settle=1.0)
        totals = {d.payload["record"]["customer_id"]: (d.payload["record"]["orders"],
                                                       d.payload["record"]["amount"])
                  for d in got}  # fmt: skip
        assert totals == {1: (2, 15.0), 2: (1, 3.0), 3: (1, 1.0)} and len(got) == 3
        conn.execute("INSERT INTO orders VALUES (10, 2, 7)")
        wait_for(lambda: _store_seqs(table) >= 5, what="the new order stored")
        run()
        got = wait_delivered(nats, c, 4, settle=1.0)
        assert got[-1].payload["record"] == {"customer_id": 2, "orders": 2, "amount": 10.0}
        # Spark runs the last micro-batch again when its commit is missing (a crash after
        # the sink wrote): the same totals, with the same versions, are skipped.
        commits = sorted((checkpoint / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
        commits[-1].unlink()
        (commits[-1].parent / f".{commits[-1].name}.crc").unlink(missing_ok=True)
        run()
        assert commits[-1].exists()  # the micro-batch ran again, and its totals were written
        time.sleep(2)
        assert len(nats.read(c)) == 4
        # The named query is listed with where it is, over the API and in the console.
        queries = client.get("/v1/spark-queries").json()
        assert queries == [{"name": "customer-totals", "source": "app", "stream": "events",
                            "seq": 5, "lag_messages": 0, "lag_seconds": 0.0}]  # fmt: skip
        client.post("/console/login", data={"token": TOKEN})
        page = client.get("/console").text
        assert '<tr data-spark="customer-totals">' in page and "<td>app</td>" in page


TYPED = (
    "id INT, big BIGINT, n DECIMAL(38,9), txt STRING, flag BOOLEAN, at TIMESTAMP, day DATE, "
    "doc STRUCT<a: INT, b: ARRAY<STRING>>, list ARRAY<BIGINT>, raw BINARY, other STRING, "
    "iv INTERVAL DAY TO SECOND"
)
TYPED_READ = """
import sys
import pyarrow.parquet as pq
from spark.session import spark_session
from spark.source import WeirSource
spark = spark_session("local[2]", None, app="weir-test")
spark.dataSource.register(WeirSource)
config, schema, out = sys.argv[1:]
batch = (spark.read.format("weir").option("config", config).option("stream", "records")
         .option("schema", schema).load())
pq.write_table(batch.where("NOT deleted").toArrow(), out + "/batch.parquet")
q = (spark.readStream.format("weir").option("config", config).option("schema", schema)
     .option("collections", "public:typed").load().writeStream.format("memory")
     .queryName("typed").trigger(availableNow=True).start())
q.awaitTermination()
pq.write_table(spark.sql("SELECT * FROM typed").toArrow(), out + "/stream.parquet")
"""


@pytest.mark.slow
def test_the_schema_option_types_the_record_as_the_table_holds_it(
    tmp_path: Path, table: str
) -> None:
    """A batch read of the records stream and a streaming read of the events stream, with a
    schema: each column equals what psycopg reads of the table, typed (numeric beyond a
    double's digits, non-ASCII text, timestamptz, date, jsonb as a struct, an array and text,
    bytea, an interval, NULLs)."""
    with psycopg.connect(table, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE typed (id int PRIMARY KEY, big bigint, n numeric, txt text, flag bool, "
            "at timestamptz, day date, doc jsonb, list jsonb, raw bytea, other jsonb, iv interval)"
        )
    config = _config(tmp_path, table)
    with serving(load_config(config)), psycopg.connect(table, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO typed VALUES (1, 9223372036854775807, 12345678901234567890.123456789, "
            "'naïve 😀 ß', true, '2026-03-04 05:06:07.891234+00', '2024-02-29', "
            """'{"a": 7, "b": ["x", null, "ü"]}', '[1, -2, 9007199254740993]', '\\x00ff10', """
            """'{"n": 12345678901234567890.123456789, "t": [true, null, "😀"]}', """
            "'1 day 02:03:04.5'), "
            "(2, -1, -0.5, '', false, '1970-01-01 00:00:00+00', '0001-01-01', '{}', '[]', '', "
            "'1.50', '-3 days +00:00:01.000001'), "
            "(3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)"
        )
        wait_for(lambda: _store_seqs(table) >= 3, what="the rows stored")
    done = subprocess.run([sys.executable, "-c", TYPED_READ, str(config), TYPED, str(tmp_path)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    with psycopg.connect(table) as conn:
        cur = conn.execute("SELECT id, big, n, txt, flag, at, day, doc, list, raw, other::text, iv "
                           "FROM typed ORDER BY id")  # fmt: skip
        names = [c.name for c in cur.description or []]
        want = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
    for row in want:
        row["raw"] = None if row["raw"] is None else bytes(row["raw"])
        if row["doc"] == {}:
            row["doc"] = {"a": None, "b": None}  # a struct has every field
    for name in ("batch", "stream"):
        got = sorted(pq.read_table(tmp_path / f"{name}.parquet").to_pylist(),
                     key=lambda r: r["id"])  # fmt: skip
        typed = [{k: r[k] for k in names} for r in got]
        for r in typed:  # jsonb read as STRING: its JSON text, every digit kept
            r["other"] = None if r["other"] is None else json.loads(r["other"], parse_float=str)
        for r in want:
            if isinstance(r["other"], str):
                r["other"] = json.loads(r["other"], parse_float=str)
        assert typed == want, name
        assert [r["record_id"] for r in got] == ["1", "2", "3"]  # the envelope's columns too
    assert typed[0]["other"]["n"] == "12345678901234567890.123456789"
