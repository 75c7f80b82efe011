"""The ``weir`` Spark data source, writer and ``weir spark stream`` as a user meets them
(docs/spark.md): wrong options, reads with nothing in them, every change once in both splits,
the records stream equal to the table, values kept as written, the writer's version guard and
its column types, a streaming write Spark runs again, and a Parquet stream killed (SIGKILL) at
random moments and started again from its checkpoint.

One Spark job (tests/adversarial/spark_probe.py) runs the read and write checks against a live
``weir run``; each test reads its results. Spark on local[2], loopback only.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
import psycopg
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from core.config.load import load_config
from core.store import Store, retention
from devkit.server import free_port
from tests.helpers.api import TOKEN
from tests.helpers.capture import wait_for
from tests.helpers.weir import cursor_of, serving

pytestmark = pytest.mark.slow
WEIR = str(Path(sys.executable).parent / "weir")
PROBE = str(Path(__file__).parent / "spark_probe.py")
BIG = "ß" * 200_000  # TOASTed


def _heads(url: str) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        return {n: s for n, s in conn.execute("SELECT name, events_seq FROM weir.sources")}


def _settled(url: str, at_least: int) -> int:
    wait_for(lambda: _heads(url).get("app", 0) >= at_least, what="the changes stored")
    while True:  # and nothing more coming
        head = _heads(url)["app"]
        time.sleep(1.5)
        if _heads(url)["app"] == head:
            return head


class World:
    def __init__(self, url: str, config: Path, client: httpx.Client, tmp: Path) -> None:
        self.url, self.config, self.client, self.tmp = url, config, client, tmp
        self.checks: dict[str, Any] = {}
        self.head = 0


def _ops(conn: psycopg.Connection[Any]) -> int:
    """Generated inserts, updates (one of the key) and deletes on t; the events they make."""
    rnd = random.Random(34)
    live: set[int] = set()
    events = 0
    for step in range(300):
        i = rnd.randrange(60)
        if i not in live:
            conn.execute("INSERT INTO t VALUES (%s, %s)", (i, f"ü{step} 😀"))
            live.add(i)
            events += 1
        elif rnd.random() < 0.25:
            conn.execute("DELETE FROM t WHERE id = %s", (i,))
            live.discard(i)
            events += 1
        elif rnd.random() < 0.1 and (j := i + 1000) not in live:
            conn.execute("UPDATE t SET id = %s WHERE id = %s", (j, i))  # a key change
            live.discard(i)
            live.add(j)
            events += 2  # a delete of the old key, an insert of the new
        else:
            conn.execute("UPDATE t SET body = %s WHERE id = %s", (f"b{step}", i))
            events += 1
    return events


@pytest.fixture(scope="module")
def world(adv_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("spark")
    with psycopg.connect(adv_db, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, body text NOT NULL)")
        conn.execute("ALTER TABLE t REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE v (id int PRIMARY KEY, n numeric, j jsonb, u text, big text,"
                     " nul text)")  # fmt: skip
        conn.execute("ALTER TABLE v REPLICA IDENTITY FULL")  # an update's changes: old values
        conn.execute("CREATE TABLE tr (id int PRIMARY KEY)")
    port = free_port()
    config = tmp / "weir.yaml"
    config.write_text(json.dumps({
        "api": {"listen": f"127.0.0.1:{port}", "tokens": [TOKEN]}, "connectors": [],
        "store": {"readers_hold": "30d"},
        "sources": [{"name": "app", "kind": "postgres", "url": adv_db, "schemas": ["public"]},
                    {"name": "stripe", "kind": "http", "provider": "stripe"}]}))  # fmt: skip
    with serving(load_config(config)), httpx.Client(
        base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=30,
    ) as client, psycopg.connect(adv_db, autocommit=True) as conn:  # fmt: skip
        events = _ops(conn)
        conn.execute("INSERT INTO v VALUES (1, 12345678901234567890.123456789, "
                     "'{\"a\": [1, null, \"😀\"], \"n\": 1.50}', 'naïve 😀', %s, NULL)",
                     (BIG,))  # fmt: skip
        conn.execute("UPDATE v SET u = 'changed' WHERE id = 1")  # big: unchanged, TOASTed
        conn.execute("INSERT INTO tr VALUES (1), (2)")
        conn.execute("TRUNCATE tr")
        w = World(adv_db, config, client, tmp)
        w.head = _settled(adv_db, events + 5)
        yield w


@pytest.fixture(scope="module")
def checks(world: World) -> dict[str, Any]:
    """The results of the probe job (one Spark job for all of them)."""
    done = subprocess.run([sys.executable, PROBE, str(world.config), str(world.tmp),
                           str(free_port())], capture_output=True, text=True,
                          timeout=400)  # fmt: skip
    out = {}
    for line in done.stdout.splitlines():
        if line.startswith("CHECK "):
            name, result = json.loads(line[6:])
            out[name] = result
    assert done.returncode == 0 and out, done.stderr[-3000:]
    return out


@pytest.mark.parametrize(
    ("check", "says"),
    [
        ("no_config", 'option "config" is required'),
        ("unknown_source", "option \"source\": no source 'nope' among the config's sources"),
        ("several_sources", 'option "source": name one of'),
        ("stream", "option \"stream\": events or records, not 'changes'"),
        ("partitions", "option \"partitions\": a whole number of at least 1, not '0'"),
        ("start", "option \"start\": beginning, end, seq:N or an ISO time, not 'yesterday'"),
        ("split", "option \"split\": hash or seq, not 'range'"),
        ("actions", 'option "actions": insert, update, delete or truncate'),
        ("maxMessagesPerTrigger", 'option "maxMessagesPerTrigger": a whole number'),
        (
            "schema-type",
            'option "schema": field gap INTERVAL YEAR TO MONTH: INTERVAL YEAR TO '
            "MONTH is not supported",
        ),
        ("schema-clash", 'option "schema": field seq BIGINT: seq is a column of the envelope'),
        ("schema-ddl", "PARSE_SYNTAX_ERROR"),
        ("schemaMode", "option \"schemaMode\": failfast or permissive, not 'lenient'"),
    ],
)
def test_a_wrong_option_fails_naming_it(checks: dict[str, Any], check: str, says: str) -> None:
    assert says in checks["option:" + check]["error"], checks["option:" + check]


@pytest.mark.parametrize("check", ["end", "beyond", "future", "http-source", "records-end",
                                   "no-match"])  # fmt: skip
def test_a_batch_read_with_nothing_to_read_is_empty_not_an_error(
    checks: dict[str, Any], check: str
) -> None:
    """start=end, seq:N beyond the head, a future time, a source nothing was pushed into: 0
    rows. (Before the fix: ``AssertionError`` in ``read``, Spark's one empty partition.)"""
    assert checks["empty:" + check] == {"ok": 0}


def test_every_event_once_in_both_splits_and_from_a_seq(
    world: World, checks: dict[str, Any]
) -> None:
    for split in ("hash", "seq"):
        assert sorted(checks[f"seqs:{split}"]["ok"]) == list(range(1, world.head + 1)), split
    assert checks["seqs:from-5"]["ok"] == list(range(5, world.head + 1))


def test_the_records_stream_equals_the_table_and_values_are_kept(
    world: World, checks: dict[str, Any]
) -> None:
    records = checks["records"]["ok"]
    with psycopg.connect(world.url) as conn:
        table = {str(i): {"id": i, "body": b} for i, b in conn.execute("SELECT id, body FROM t")}
    live = {r["record_id"]: json.loads(r["record"]) for r in records
            if r["collection_id"] == "public:t" and not r["deleted"]}  # fmt: skip
    assert live == table
    assert all(r["action"] == ("delete" if r["deleted"] else "upsert") for r in records)
    events = [e for e in checks["events"]["ok"] if e["collection_id"] == "public:v"]
    assert [e["action"] for e in events] == ["insert", "update"]
    for e in events:
        rec = json.loads(e["record"])
        assert rec["n"] == "12345678901234567890.123456789"  # every digit, as text
        assert rec["j"] == {"a": [1, None, "😀"], "n": 1.50}
        assert rec["big"] == BIG and rec["nul"] is None
    assert json.loads(events[1]["record"])["u"] == "changed"
    assert json.loads(events[1]["changes"]) == {"u": "naïve 😀"}
    tr = sorted((e["seq"], e["action"], e["record_id"]) for e in checks["events"]["ok"]
                if e["collection_id"] == "public:tr")  # fmt: skip
    assert [(a, r) for _, a, r in tr] == [("insert", "1"), ("insert", "2"), ("truncate", None)]


def test_the_writer_keeps_its_version_guard_and_deletes(checks: dict[str, Any]) -> None:
    for name in ("write:json", "write:older", "write:delete", "write:struct"):
        assert "error" not in checks[name], (name, checks[name])
    stored = {(c, r): (a, json.loads(d) if d else None)
              for c, r, a, d in checks["write:stored"]["ok"]}  # fmt: skip
    assert stored[("c:w", "1")] == ("upsert", {"a": 1})  # the older version was skipped
    assert stored[("c:w", "2")][0] == "delete"
    assert stored[("c:w", "3")] == ("upsert", {"n": 1, "s": "ü"})


def test_wrong_writes_fail_naming_what_to_fix(checks: dict[str, Any]) -> None:
    assert "the rows need the columns collection_id, record_id, data: record_id missing" in \
        checks["write:missing"]["error"]  # fmt: skip
    assert 'option "source": one of the config\'s http sources (stripe)' in \
        checks["write:not-http"]["error"]  # fmt: skip
    assert "cannot be reached" in checks["write:api-down"]["error"]


def test_a_streaming_write_spark_runs_again_stores_nothing_twice(
    checks: dict[str, Any],
) -> None:
    before, after, ran_again = checks["write:replay"]["ok"]
    assert ran_again == 1 and before > 0
    assert after == before


def test_a_struct_with_a_decimal_and_a_timestamp_version_are_written(
    checks: dict[str, Any],
) -> None:
    """docs/spark.md: ``data`` is a JSON text or a struct (an aggregate's holds decimals, which
    failed in the task), ``version`` a whole number or a timestamp (a window's end, which failed
    with int()'s TypeError); a column of another type is refused before any task, naming it."""
    assert checks["write:struct-decimal"] == {"ok": "saved"}, checks["write:struct-decimal"]
    assert checks["write:version-timestamp"] == {"ok": "saved"}, checks["write:version-timestamp"]
    stored = {(c, r): (a, json.loads(d) if d else None)
              for c, r, a, d in checks["write:stored"]["ok"]}  # fmt: skip
    assert stored[("c:w", "4")] == ("upsert", {"amount": 12.5})
    assert stored[("c:w", "5")] == ("upsert", {"a": 1})
    assert 'column "version" is string: it takes a whole number or a timestamp' in \
        checks["write:version-text"]["error"]  # fmt: skip


# -- weir spark stream --------------------------------------------------------------------------


def _cli(world: World, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [WEIR, "spark", "stream", "--config", str(world.config), "--source", "app",
         "--master", "local[2]", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)  # fmt: skip


def test_the_cli_names_a_wrong_option_in_its_one_line_error(world: World) -> None:
    p = _cli(world, "--out", str(world.tmp / "x"), "--checkpoint", str(world.tmp / "xc"),
             "--start", "yesterday", "--available-now")  # fmt: skip
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1
    last = [line for line in err.splitlines() if line.startswith("weir spark: ")][-1]
    assert last == "weir spark: option \"start\": beginning, end, seq:N or an ISO time, not " \
        "'yesterday'", err[-2000:]  # fmt: skip


def _parquet(out: Path) -> list[dict[str, Any]]:
    """The rows of the files the sink's log lists; a record's seqs rise within each file."""
    files: set[str] = set()
    log = out / "_spark_metadata"
    for entry in sorted(log.glob("[0-9]*")) if log.exists() else []:
        for line in entry.read_text().splitlines()[1:]:
            f = json.loads(line)
            (files.add if f["action"] == "add" else files.discard)(f["path"])
    rows: list[dict[str, Any]] = []
    for path in sorted(files):
        got = pq.read_table(unquote(path.removeprefix("file://"))).to_pylist()
        last: dict[str, int] = {}
        for r in got:
            assert r["seq"] > last.get(r["record_id"], 0), (path, r)
            last[r["record_id"]] = r["seq"]
        rows += got
    return rows


def test_a_stream_killed_at_random_moments_writes_every_change_once(world: World) -> None:
    out, ckpt = world.tmp / "lake", world.tmp / "lake.ckpt"
    args = ("--out", str(out), "--checkpoint", str(ckpt), "--name", "lake", "--partitions", "7")
    rnd = random.Random(7)
    for _ in range(2):  # killed after some micro-batches of 3 seqs each
        p = _cli(world, *args, "--available-now", "--max-per-trigger", "3")
        wait_for(lambda p=p: len(_parquet(out)) > 0 or p.poll() is not None, timeout=120,
                 what="a micro-batch written")  # fmt: skip
        time.sleep(rnd.uniform(0.2, 3.0))
        os.kill(p.pid, signal.SIGKILL)
        p.wait(30)
    p = _cli(world, *args, "--available-now")
    _, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    head = _heads(world.url)["app"]
    assert sorted(r["seq"] for r in _parquet(out)) == list(range(1, head + 1))
    # --max-per-trigger 3: micro-batches of 3 seqs at most (Spark lower-cases option names)
    first = json.loads((ckpt / "offsets" / "0").read_text().splitlines()[-1])
    assert first == {"seq": 3}, first
    assert cursor_of(world.url, "spark:lake")[0] == head
    # listed with its lag once more changes come
    with psycopg.connect(world.url, autocommit=True) as conn:
        conn.execute("INSERT INTO t VALUES (5000, 'late')")
    wait_for(lambda: _heads(world.url)["app"] > head, what="the late change stored")
    queries = world.client.get("/v1/spark-queries").json()
    assert {
        "name": "lake",
        "source": "app",
        "stream": "events",
        "seq": head,
        "lag_messages": 1,
    }.items() <= next(q for q in queries if q["name"] == "lake").items()
    status = subprocess.run([WEIR, "status", "--config", str(world.config), "--interval", "0.2"],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert any(line.split()[:1] == ["spark:lake"] for line in status.stdout.splitlines()), \
        status.stdout  # fmt: skip
    world.client.post("/console/login", data={"token": TOKEN})
    assert '<tr data-spark="lake">' in world.client.get("/console").text


def test_a_query_whose_events_retention_deleted_fails_naming_them_in_one_line(
    world: World,
) -> None:
    """An unnamed query's events are not held: retention deletes them, and the query (from the
    beginning, a new checkpoint) fails with the documented error as the CLI's last line."""
    with psycopg.connect(world.url, autocommit=True) as conn:
        conn.execute("DELETE FROM weir.cursors WHERE connector LIKE 'spark:%'")
        first = conn.execute("SELECT min(first_seq) FROM weir.event_batches").fetchone()
    cfg = load_config(world.config)
    assert retention.delete_older(Store(cfg.store_url), timedelta(0), timedelta(0)) > 0
    with psycopg.connect(world.url) as conn:
        oldest = conn.execute("SELECT min(first_seq) FROM weir.event_batches").fetchone()
    p = _cli(world, "--out", str(world.tmp / "gone"), "--checkpoint",
             str(world.tmp / "gone.ckpt"), "--available-now")  # fmt: skip
    _, err = p.communicate(timeout=300)
    assert p.returncode == 1
    gone_to = (oldest[0] if oldest and oldest[0] else _heads(world.url)["app"] + 1) - 1
    assert first and first[0] == 1
    said = [line for line in err.splitlines() if line.startswith("weir spark: ")]
    assert len(said) == 1, err[-3000:]
    assert said[0].startswith(f"weir spark: events 1 to {gone_to} of source "), said
    assert "deleted by retention" in said[0]
    assert _parquet(world.tmp / "gone") == []


# -- the schema option: typed columns -----------------------------------------------------------

_INT32 = st.integers(-(2**31), 2**31 - 1)
_TEXT = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"),
                max_size=12)  # fmt: skip
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**25), 10**25) | _TEXT
    | st.decimals(-(10**12), 10**12, places=6, allow_nan=False),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=8,
)  # fmt: skip
_ROW = st.fixed_dictionaries({
    "i": st.none() | _INT32, "b": st.none() | st.integers(-(2**63), 2**63 - 1),
    "n": st.none() | st.decimals(-(10**20) + 1, 10**20 - 1, places=9, allow_nan=False),
    "t": st.none() | _TEXT, "f": st.none() | st.booleans(),
    "x": st.none() | st.floats(allow_nan=False, width=64),
    "ts": st.none() | st.datetimes(dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30),
                                   timezones=st.just(dt.UTC)),
    "d": st.none() | st.dates(), "by": st.none() | st.binary(max_size=12),
    "j": st.none() | _JSON, "a": st.none() | st.lists(st.none() | _INT32, max_size=4),
})  # fmt: skip
_COLUMNS = ("i int, b bigint, n numeric, t text, f bool, x float8, ts timestamptz, d date, "
            "by bytea, j jsonb, a int[]")  # fmt: skip
_SCHEMA = ("id INT, i INT, b BIGINT, n DECIMAL(38,9), t STRING, f BOOLEAN, x DOUBLE, ts TIMESTAMP, "
           "d DATE, by BINARY, j STRING, a ARRAY<INT>")  # fmt: skip
_made = iter(range(1, 10**6))
_PHASES = (Phase.explicit, Phase.generate)  # no shrinking: each example is a Spark read


def _json_text(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ",".join(f"{json.dumps(k)}: {_json_text(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(_json_text(x) for x in v) + "]"
    return str(v) if isinstance(v, Decimal) else json.dumps(v)


class Reads:
    """The probe serving reads (one JVM for every example): :meth:`read` a table's records."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.p = subprocess.Popen([sys.executable, PROBE, str(world.config), str(world.tmp),
                                   str(free_port()), "serve"], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)  # fmt: skip

    def read(self, table: str, **options: str) -> Any:
        out = self.world.tmp / f"{table}-{next(_made)}.parquet"
        ask = {"options": {"source": "app", "stream": "records", "collections": f"public:{table}",
                           **options}, "out": str(out)}  # fmt: skip
        assert self.p.stdin and self.p.stdout
        self.p.stdin.write(json.dumps(ask) + "\n")
        self.p.stdin.flush()
        while not (line := self.p.stdout.readline()).startswith("DONE"):
            assert line, "the probe ended"
        result = json.loads(line[5:])
        return {"ok": pq.read_table(out).to_pylist()} if "ok" in result else result


@pytest.fixture(scope="module")
def reads(world: World) -> Iterator[Reads]:
    r = Reads(world)
    yield r
    assert r.p.stdin
    r.p.stdin.close()
    r.p.wait(120)


def _insert(world: World, table: str, columns: str, rows: list[tuple[Any, ...]]) -> None:
    """Rows into a new table, waiting until capture stored them."""
    with psycopg.connect(world.url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, {columns})")
        head = _heads(world.url)["app"]
        marks = ", ".join(["%s"] * (len(rows[0]))) if rows else ""
        with conn.transaction():
            for row in rows:
                conn.execute(f"INSERT INTO {table} VALUES ({marks})", row)
    wait_for(lambda: _heads(world.url)["app"] >= head + len(rows), what="the rows stored")


def test_generated_values_read_through_a_schema_equal_the_table(world: World, reads: Reads) -> None:
    """Each type's generated values (NULLs among them), written to a table and read back as
    typed columns, equal psycopg's read of it: a numeric of 29 digits, text of any plane,
    timestamps and dates over years 1 to 9999, bytea, float8, jsonb as its JSON text (every
    digit), int[]."""

    @given(rows=st.lists(_ROW, min_size=1, max_size=6))
    @settings(max_examples=6, deadline=None, database=None, phases=_PHASES,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    def check(rows: list[dict[str, Any]]) -> None:
        table = f"g{next(_made)}"
        _insert(world, table, _COLUMNS, [
            (i, *(None if r[k] is None else _json_text(r[k]) if k == "j" else r[k]
               for k in _ROW_KEYS))
            for i, r in enumerate(rows)])  # fmt: skip
        got = reads.read(table, schema=_SCHEMA)
        assert "ok" in got, got
        with psycopg.connect(world.url) as conn:
            picks = ", ".join("j::text" if k == "j" else k for k in _ROW_KEYS)
            cur = conn.execute(f"SELECT id, {picks} FROM {table} ORDER BY id")
            want = [dict(zip(["id", *_ROW_KEYS], r, strict=True)) for r in cur.fetchall()]
        typed = [{k: r[k] for k in ["id", *_ROW_KEYS]}
                 for r in sorted(got["ok"], key=lambda r: r["id"])]  # fmt: skip
        for r in want:
            r["by"] = None if r["by"] is None else bytes(r["by"])
        for t, w in zip(typed, want, strict=False):  # jsonb: compared as JSON, numbers exactly
            if w["j"] is not None:
                w["j"] = json.loads(w["j"], parse_float=Decimal)
                if not isinstance(w["j"], str):  # STRING takes a string as it is (CI: '\x96')
                    t["j"] = json.loads(t["j"], parse_float=Decimal)
        assert typed == want

    check()


_ROW_KEYS = ["i", "b", "n", "t", "f", "x", "ts", "d", "by", "j", "a"]


def _fits(n: Decimal, t: str) -> tuple[bool, bool]:
    """Whether n fits DECIMAL(5,2) and t INT."""
    whole = re.fullmatch(r"-?[0-9]{1,20}", t) is not None and -(2**31) <= int(t) < 2**31
    return abs(n) < 1000 and n == round(n, 2), whole


def test_a_value_that_does_not_fit_fails_the_read_in_one_line_or_is_null_when_permissive(
    world: World, reads: Reads
) -> None:
    """Generated numerics for DECIMAL(5,2) (too many digits either side of the point) and text
    for INT: failfast fails naming the source, the seq and the record of a misfit, its field,
    JSON type and the schema's type; permissive gives null for exactly the misfits."""

    @given(
        rows=st.lists(
            st.tuples(
                st.decimals(-(10**5), 10**5, places=4, allow_nan=False),
                st.one_of(_TEXT, st.integers(-(2**40), 2**40).map(str)),
            ),
            min_size=1,
            max_size=6,
        )
    )
    @settings(max_examples=5, deadline=None, database=None, phases=_PHASES,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    def check(rows: list[tuple[Decimal, str]]) -> None:
        table = f"m{next(_made)}"
        _insert(world, table, "n numeric, t text", [(i, n, t) for i, (n, t) in enumerate(rows)])
        schema = "n DECIMAL(5,2), t INT"
        loose = reads.read(table, schema=schema, schemaMode="permissive")
        assert "ok" in loose, loose
        misfits = {}
        for r in loose["ok"]:
            n, t = rows[int(r["record_id"])]
            n_fits, t_fits = _fits(n, t)
            assert r["n"] == (n if n_fits else None) and r["t"] == (int(t) if t_fits else None)
            if not n_fits:
                misfits[(r["seq"], r["record_id"], "n")] = "DECIMAL(5,2)"
            if not t_fits:
                misfits[(r["seq"], r["record_id"], "t")] = "INT"
        strict = reads.read(table, schema=schema)
        if not misfits:
            assert "ok" in strict, strict
            return
        said = strict.get("error", "")
        m = re.search(r"SourceError: source app: seq (\d+) \(public:\w+, record (\d+)\): field "
                      r"(\w+) is a JSON string that does not fit (\S+) \(.+\); option schemaMode "
                      r"permissive makes such values null$", said)  # fmt: skip
        assert m, said
        seq, rid, field, kind = m.groups()
        assert misfits.get((int(seq), rid, field)) == kind, (said, misfits)

    check()
