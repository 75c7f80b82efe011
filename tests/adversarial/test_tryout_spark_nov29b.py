"""Tryout of the Spark integration (docs/spark.md) by a new user, Nov 29 (b): each test is a
problem it found, fixed since (what was seen is in each docstring); real servers (embedded
Postgres, ``weir run`` in a thread, a local[2] Spark JVM where marked slow), no mocks."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pyspark.sql import Row

from core.config.load import load_config
from devkit.server import free_port
from spark.options import spec_of
from spark.position import bounds, run
from spark.sink import SinkError, Target, write_rows
from tests.helpers import stored
from tests.helpers.api import TOKEN, api_serving
from tests.helpers.capture import wait_for
from tests.helpers.weir import insert_t, serving


def _head(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT events_seq FROM weir.sources WHERE name = 'app'").fetchone()
    return int(row[0]) if row else 0


def _config(tmp_path: Path, url: str) -> Path:
    config = tmp_path / "weir.yaml"
    source = {"name": "app", "kind": "postgres", "url": url, "schemas": ["public"]}
    config.write_text(json.dumps({"sources": [source], "connectors": []}))
    return config


# -- 1. a second query of the same name: the first runs one more micro-batch ------------------

_TWO_QUERIES = r"""
import json, sys, time
from spark.session import spark_session
from spark.source import WeirSource
config, work = sys.argv[1], sys.argv[2]
spark = spark_session("local[2]", None, app="tryout-names")
spark.dataSource.register(WeirSource)

def say(*a):
    print("SAY", json.dumps(a, default=str), flush=True)

def start(ckpt, sink):
    return (spark.readStream.format("weir").option("config", config).option("source", "app")
            .option("name", "lake").load().writeStream.format("memory").queryName(sink)
            .option("checkpointLocation", f"{work}/{ckpt}")
            .trigger(processingTime="1 second").start())

first = start("first.ckpt", "qa")
first.processAllAvailable()
second = start("second.ckpt", "qb")  # same name, its own checkpoint, while the first runs
second.processAllAvailable()
time.sleep(3)  # the first idles through a few triggers
say("ready")
sys.stdin.readline()  # more changes are stored now
deadline = time.time() + 40
while time.time() < deadline and first.isActive:
    time.sleep(1)
error = first.exception()
say("first", first.isActive, str(error) if error else None,
    [r.seq for r in spark.sql("SELECT seq FROM qa ORDER BY seq").collect()])
for q in spark.streams.active:
    q.stop()
spark.stop()
"""


@pytest.mark.slow
def test_a_second_query_of_one_name_fails_the_first_at_its_next_micro_batch(
    tmp_path: Path, table: str
) -> None:
    """docs/spark.md: "A second query of the same name started while the first runs takes it
    too, and the first then fails at its next micro-batch". The first query, idle when the
    second started, runs its next micro-batch (seqs 6-8) to the end, writes and commits it, and
    fails only at the one after: Position.note is skipped when latestOffset's start equals the
    seq already noted, which it is after an idle trigger."""
    config = _config(tmp_path, table)
    driver = tmp_path / "two_queries.py"
    driver.write_text(_TWO_QUERIES)
    said: dict[str, Any] = {}
    with serving(load_config(config)):
        insert_t(table, range(5))
        wait_for(lambda: _head(table) == 5, what="5 changes stored")
        p = subprocess.Popen([sys.executable, str(driver), str(config), str(tmp_path)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert p.stdin and p.stdout
        try:
            for line in p.stdout:
                if not line.startswith("SAY "):
                    continue
                what = json.loads(line[4:])
                said[what[0]] = what[1:]
                if what[0] == "ready":
                    insert_t(table, range(5, 8))
                    wait_for(lambda: _head(table) == 8, what="3 more changes stored")
                    p.stdin.write("go\n")
                    p.stdin.flush()
            p.wait(60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(30)
    active, error, seqs = said["first"]
    assert not active and error and "another query named 'lake'" in error, error
    # Found: [1, 2, 3, 4, 5, 6, 7, 8]: the micro-batch of 6-8 ran, was written and committed.
    assert seqs == [1, 2, 3, 4, 5], seqs


# -- 2-4. the writer changes or invents what it writes ---------------------------------------


def _target(port: int) -> Target:
    return Target(f"http://127.0.0.1:{port}/v1/sources/stripe/records", TOKEN, "stripe")


def test_a_null_record_id_is_refused_not_written_as_the_text_none(table: str) -> None:
    """docs/spark.md: ``record_id`` (text or a whole number). A row whose record_id is null is
    posted as ``str(None)``: the record ``"None"`` is stored and forwarded (accepted=1)."""
    port = free_port()
    with api_serving(table, port=port, api={"listen": f"127.0.0.1:{port}", "tokens": [TOKEN]}):
        row = Row(collection_id="totals", record_id=None, data='{"a": 1}', version=1)
        with contextlib.suppress(SinkError):  # refused: fine
            write_rows(_target(port), iter([row]))
        ids = [r["record_id"] for r in stored.records(table)]
    assert "None" not in ids, ids


def test_a_json_text_data_keeps_its_numbers_as_written(table: str) -> None:
    """docs/spark.md: ``data`` is a JSON text (…; a decimal in it is written as its digits).
    The writer parses the text with orjson and writes it again: an integer beyond 64 bits
    becomes a double (1.2345678901234568e+22) and a long fraction is cut to 0.1, silently,
    where the API itself refuses such a body ("… is beyond 64 bits: send such numbers as
    strings") rather than change it."""
    port = free_port()
    with api_serving(table, port=port, api={"listen": f"127.0.0.1:{port}", "tokens": [TOKEN]}):
        data = '{"big": 12345678901234567890123, "fine": 0.1000000000000000000001}'
        row = Row(collection_id="totals", record_id="c1", data=data, version=1)
        try:
            write_rows(_target(port), iter([row]))
        except SinkError:
            return  # refused, as the API refuses it: fine
        got = stored.record(table, "totals", "c1")
    assert got is not None
    # Found: '{"big":1.2345678901234568e+22,"fine":0.1}'
    assert "12345678901234567890123" in got["record_json"], got["record_json"]
    assert "0.1000000000000000000001" in got["record_json"], got["record_json"]


def test_a_struct_with_a_nan_double_is_not_written_as_null(table: str) -> None:
    """``data`` as a struct (an aggregate's): a DOUBLE that is NaN (an average of nothing) is
    written by orjson as ``null``, silently: the stored record says the value is missing,
    where Weir writes a NaN as "NaN" (docs/spark.md's FLOAT/DOUBLE row) or could refuse it."""
    port = free_port()
    with api_serving(table, port=port, api={"listen": f"127.0.0.1:{port}", "tokens": [TOKEN]}):
        row = Row(collection_id="totals", record_id="c1",
                  data=Row(avg=float("nan"), n=0), version=1)  # fmt: skip
        try:
            write_rows(_target(port), iter([row]))
        except SinkError:
            return
        got = stored.record(table, "totals", "c1")
    assert got is not None
    # Found: {'avg': None, 'n': 0}
    assert got["record"]["avg"] is not None, got["record"]


# -- 5. a start time without an offset, with a store database not in UTC --------------------


def test_a_start_time_without_offset_means_the_same_whatever_the_databases_time_zone(
    tmp_path: Path, table: str
) -> None:
    """docs/spark.md: ``start``: "an ISO time". The reader takes a time without an offset as
    UTC within a batch (``at.replace(tzinfo=UTC)``) but passes it naive to Postgres to pick the
    batch (``last_committed_at >= %s``), where the store database's TimeZone reads it. With the
    database in America/New_York, a time 30 minutes ago without an offset starts after the
    head (nothing read), while the same time with ``Z`` or ``+00:00`` reads all 5 events."""
    with psycopg.connect(table, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE \"{conn.info.dbname}\" SET timezone = 'America/New_York'")
    config = _config(tmp_path, table)
    with serving(load_config(config)):
        insert_t(table, range(5))
        wait_for(lambda: _head(table) == 5, what="5 changes stored")
    ago = datetime.now(UTC) - timedelta(minutes=30)
    with_z = run(bounds(spec_of({"config": str(config), "start": ago.isoformat()})))
    naive = ago.replace(tzinfo=None).isoformat()
    without = run(bounds(spec_of({"config": str(config), "start": naive})))
    assert with_z == (0, 5)
    assert without == with_z, (naive, without)  # Found: (5, 5)
