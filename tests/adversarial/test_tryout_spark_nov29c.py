"""Tryout of the Spark integration (docs/spark.md) by a new user, Nov 29 (c): each test is a problem it found (what was seen is in each docstring); real servers, no mocks."""  # noqa: E501

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pyspark.sql.types import DayTimeIntervalType, DoubleType, StructField, StructType

from core.config.load import load_config
from spark.options import spec_of
from spark.position import bounds, run
from spark.source import Bucket, _batches
from spark.typed import SourceError
from tests.helpers.capture import wait_for
from tests.helpers.weir import serving


def _head(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT events_seq FROM weir.sources WHERE name = 'app'").fetchone()
    return int(row[0]) if row else 0


def _config(tmp_path: Path, url: str, **top: Any) -> Path:
    config = tmp_path / "weir.yaml"
    source = {"name": "app", "kind": "postgres", "url": url, "schemas": ["public"]}
    config.write_text(json.dumps({"sources": [source], "connectors": [], **top}))
    return config


def _captured(tmp_path: Path, url: str, ddl: str, inserts: list[str]) -> tuple[Path, int]:
    """``ddl`` and ``inserts`` run on the source while ``weir run`` captures them; the config
    and the stream's head once all are stored."""
    config = _config(tmp_path, url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(ddl)
    with serving(load_config(config)):
        with psycopg.connect(url, autocommit=True) as conn:
            for sql in inserts:
                conn.execute(sql)
        wait_for(lambda: _head(url) >= len(inserts), what="the rows stored")
    return config, _head(url)


def _typed_read(config: Path, head: int, typed: StructType, **options: str) -> list[dict[str, Any]]:
    """What a read task of ``spark.read.format("weir")`` with the ``schema`` option yields
    (spark/source.py ``_batches``, as the executor runs it), the whole range in one bucket."""
    ddl = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in typed.fields)
    spec = replace(spec_of({"config": str(config), "schema": ddl, **options}), typed=typed)
    return [row for b in _batches(spec, Bucket(0, head, 0, 1)) for row in b.to_pylist()]


def _read_from(config: Path, start: str) -> list[int]:
    """The seqs a read with the ``start`` option yields: its bounds (spark/position.py
    ``bounds``), then a read task over them in one bucket (spark/source.py ``_batches``)."""
    spec = spec_of({"config": str(config), "start": start})
    after, head = run(bounds(spec))
    return [r["seq"] for b in _batches(spec, Bucket(after, head, 0, 1)) for r in b.to_pylist()]


# -- 1. an interval Postgres holds but Spark's INTERVAL DAY TO SECOND cannot ------------------


def test_an_interval_beyond_sparks_range_is_null_when_permissive(
    tmp_path: Path, db_url: str
) -> None:
    """docs/spark.md "Typed columns": a value that does not fit its type fails the query with
    one line naming it (failfast) or, with ``schemaMode`` permissive, "it is null". An
    ``interval '200000000 days'`` (a valid Postgres interval, written ``P200000000D``) read as
    ``INTERVAL DAY TO SECOND`` with permissive: the read task fails with pyarrow's
    ``ArrowInvalid: Timedelta too large to fit in 64-bit integer`` (raised by ``pa.array`` in
    Columns.arrays, outside the per-value conversion that makes misfits null or one line);
    failfast gives the same traceback, naming neither seq, record nor field."""
    config, head = _captured(
        tmp_path, db_url, "CREATE TABLE iv (id int PRIMARY KEY, gap interval)",
        ["INSERT INTO iv VALUES (1, interval '200000000 days')",
         "INSERT INTO iv VALUES (2, interval '1 day 2 hours')"],
    )  # fmt: skip
    typed = StructType([StructField("gap", DayTimeIntervalType())])
    rows = _typed_read(config, head, typed, schemaMode="permissive")
    gaps = {r["record_id"]: r["gap"] for r in rows if r["collection_id"] == "public:iv"}
    assert gaps["1"] is None and gaps["2"] is not None, gaps


def test_an_interval_beyond_sparks_range_fails_failfast_in_one_line(
    tmp_path: Path, db_url: str
) -> None:
    """docs/spark.md: failfast fails "with one line naming it": ``source app: seq N
    (public:iv, record 1): field gap is a JSON string that does not fit …``. Seen: pyarrow's
    ``ArrowInvalid: Timedelta too large to fit in 64-bit integer``, no seq, record or field."""
    config, head = _captured(
        tmp_path, db_url, "CREATE TABLE iv (id int PRIMARY KEY, gap interval)",
        ["INSERT INTO iv VALUES (1, interval '200000000 days')"],
    )  # fmt: skip
    typed = StructType([StructField("gap", DayTimeIntervalType())])
    with pytest.raises(SourceError, match=r"record 1\): field gap .* does not fit"):
        _typed_read(config, head, typed)


# -- 2. a numeric beyond a double's range becomes Infinity --------------------------------------


def test_a_numeric_beyond_a_double_is_not_read_as_infinity(tmp_path: Path, db_url: str) -> None:
    """docs/spark.md "Typed columns": DOUBLE takes "a number, or a string of one, NaN,
    Infinity or -Infinity"; a value that does not fit fails the query (or is null when
    permissive). A ``numeric`` of 10^400 (Weir writes it as its 401 digits, a string) read as
    DOUBLE comes out as ``inf``, silently: the row says Infinity where the table holds a finite
    number. (FLOAT refuses 1e39 as "beyond its range"; typed.py ``_double`` means to, but
    ``float(text)`` gives inf rather than OverflowError.)"""
    config, head = _captured(
        tmp_path, db_url, "CREATE TABLE n (id int PRIMARY KEY, x numeric)",
        ["INSERT INTO n VALUES (1, 1e400)"],
    )  # fmt: skip
    typed = StructType([StructField("x", DoubleType())])
    try:
        rows = _typed_read(config, head, typed)
    except SourceError:
        return  # refused as not fitting: fine
    got = [r["x"] for r in rows if r["collection_id"] == "public:n"]
    assert not any(isinstance(x, float) and math.isinf(x) for x in got), got  # Found: [inf]


# -- 3. a misspelled option is silently ignored -------------------------------------------------


@pytest.mark.parametrize(
    "option", ["colections", "partition", "maxMessagesPerTriger", "schemamod", "strat"]
)
def test_a_misspelled_option_is_refused_naming_it(tmp_path: Path, option: str) -> None:
    """docs/spark.md "Reading" lists the options; a wrong one should say what to fix in one
    line, as a wrong value of a known option does (``option "split": hash or seq, not …``).
    A misspelled name (``colections``, ``partition``, ``strat``…) is accepted without a word:
    the read goes on with the default, e.g. every collection of the source instead of the one
    asked for, or from the beginning instead of ``end``."""
    config = _config(tmp_path, "postgresql://127.0.0.1:1/none")
    with pytest.raises(SourceError, match=option):
        spec_of({"config": str(config), option: "1"})


# -- 4. a number option that is digits to isdigit() but not to int() ----------------------------


def test_a_partitions_value_of_superscript_digits_fails_naming_the_option(tmp_path: Path) -> None:
    """docs/spark.md: ``partitions`` is "read tasks a micro-batch"; a wrong value gives
    ``option "partitions": a whole number of at least 1, not …``. ``partitions = "²"`` (or
    ``maxMessagesPerTrigger = "¹⁰"``) passes ``str.isdigit`` in options.py ``_positive`` and
    fails in ``int()``: ``ValueError: invalid literal for int() with base 10: '²'``, not
    naming the option."""
    config = _config(tmp_path, "postgresql://127.0.0.1:1/none")
    with pytest.raises(SourceError, match='option "partitions"'):
        spec_of({"config": str(config), "partitions": "²"})


# -- 5-6. the writer: a map of structs, a struct holding bytes ----------------------------------

_WRITES = r"""
import json, sys
from spark.session import spark_session
from spark.source import WeirSource
config = sys.argv[1]
spark = spark_session("local[2]", None, app="tryout-writes")
spark.dataSource.register(WeirSource)
for name, sql in [
    ("map-of-structs", "SELECT 'totals' collection_id, '1' record_id, "
                       "map('eu', named_struct('n', 1, 'sum', 2.5D)) data, 1L version"),
    ("struct-with-bytes", "SELECT 'totals' collection_id, '2' record_id, "
                          "named_struct('n', 1, 'sig', X'CAFE') data, 1L version"),
]:
    try:
        (spark.sql(sql).write.format("weir").option("config", config).option("source", "stripe")
         .mode("append").save())
        said = {"ok": "saved"}
    except Exception as e:
        lines = [x for x in str(e).splitlines() if "Error: " in x]
        said = {"error": lines[-1] if lines else str(e)[:500]}
    print("SAY", json.dumps([name, said]), flush=True)
spark.createDataFrame([("plain", "0", '{"id": 1}')], "collection_id string, record_id string, "
                      "data string").write.format("weir").option("config", config) \
    .option("source", "stripe").mode("append").save()
try:  # the schema given the usual Spark way, not as the option, over the record just written
    spark.read.format("weir").schema("id INT").option("config", config) \
        .option("source", "stripe").load().count()
    said = {"ok": "read"}
except Exception as e:
    said = {"error": str(e)}
print("SAY", json.dumps(["user-schema", said]), flush=True)
spark.stop()
"""


@pytest.fixture(scope="module")
def writes(adv_db: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The two writes of ``_WRITES`` (one Spark job) into the http source ``stripe`` of a live
    ``weir run``, and the records stored after: ``{name: said, "stored": {record_id: data}}``."""
    from devkit.server import free_port
    from tests.helpers.api import TOKEN

    tmp = tmp_path_factory.mktemp("writes")
    port = free_port()
    config = tmp / "weir.yaml"
    config.write_text(json.dumps({
        "api": {"listen": f"127.0.0.1:{port}", "tokens": [TOKEN]}, "connectors": [],
        "sources": [{"name": "app", "kind": "postgres", "url": adv_db, "schemas": ["public"],
                     "slot": "weir_tryout_writes"},  # the module's others are dropped per test
                    {"name": "stripe", "kind": "http", "provider": "stripe"}]}))  # fmt: skip
    driver = tmp / "writes.py"
    driver.write_text(_WRITES)
    out: dict[str, Any] = {}
    with serving(load_config(config)):
        import httpx

        def listening() -> bool:
            try:
                return (
                    httpx.get(
                        f"http://127.0.0.1:{port}/v1/http-consumers",
                        headers={"Authorization": f"Bearer {TOKEN}"},
                    ).status_code
                    == 200
                )
            except httpx.TransportError:
                return False

        wait_for(listening, what="the API to listen")
        done = subprocess.run([sys.executable, str(driver), str(config)], capture_output=True,
                              text=True, timeout=300)  # fmt: skip
        for line in done.stdout.splitlines():
            if line.startswith("SAY "):
                name, said = json.loads(line[4:])
                out[name] = said
        from tests.helpers import stored

        out["stored"] = {r["record_id"]: r["record"] for r in stored.records(adv_db)
                         if r["collection_id"] in ("totals", "plain")}  # fmt: skip
    assert done.returncode == 0 and out, done.stderr[-3000:]
    return out


@pytest.mark.slow
def test_a_map_of_structs_as_data_is_written(writes: dict[str, Any]) -> None:
    """docs/spark.md "Writing": ``data`` is "a JSON text, a struct or a map". A MAP<STRING,
    STRUCT<…>> (an aggregate's totals by region) fails the task with ``TypeError: Type is not
    JSON serializable: Row``: sink.py ``_record`` turns a struct into a dict (asDict
    recursive) but leaves a map's values, Spark's Rows, as they are, which orjson cannot write.
    Nothing is stored."""
    assert writes["map-of-structs"] == {"ok": "saved"}, writes["map-of-structs"]
    assert writes["stored"].get("1") == {"eu": {"n": 1, "sum": 2.5}}, writes["stored"]


@pytest.mark.slow
def test_a_struct_holding_bytes_fails_naming_the_record_or_is_written(
    writes: dict[str, Any],
) -> None:
    """docs/spark.md "Writing": a row that cannot be written fails the task "naming its
    record" (a missing id, one beyond max_body_bytes), and a column of a type it does not take
    is refused before any task runs, naming it. A struct ``data`` with a BINARY field fails the
    task with ``TypeError: Type is not JSON serializable: bytes`` (orjson, in
    core/steps/payload.py ``dump``): neither the record, the field nor what to do (cast it to
    base64 text, as Weir writes a bytea) is said, and it is not refused before the tasks run."""
    said = writes["struct-with-bytes"]
    if said == {"ok": "saved"}:
        return  # written (as base64, say): fine
    assert "'2'" in said["error"] and "sig" in said["error"], said


# -- 7. the largest Postgres real does not fit FLOAT --------------------------------------------


def test_the_largest_real_fits_float(tmp_path: Path, db_url: str) -> None:
    """docs/spark.md "Typed columns": FLOAT takes "a number". A Postgres ``real`` holds at most
    3.4028235e38 (FLT_MAX, which Weir writes as ``3.4028235e+38``, its shortest text); read
    as FLOAT it fails the query: ``field x is a JSON number that does not fit FLOAT (beyond its
    range)``. typed.py ``_float`` compares the double 3.4028235e38 with FLT_MAX's exact value
    3.4028234663852886e38, though the text rounds to FLT_MAX exactly."""
    config, head = _captured(
        tmp_path, db_url, "CREATE TABLE r (id int PRIMARY KEY, x real)",
        ["INSERT INTO r VALUES (1, '3.4028235e38'), (2, '-3.4028235e38'), (3, 1.5)"],
    )  # fmt: skip
    from pyspark.sql.types import FloatType

    rows = _typed_read(config, head, StructType([StructField("x", FloatType())]))
    got = sorted((r["record_id"], r["x"]) for r in rows if r["collection_id"] == "public:r")
    assert [x for _, x in got] == [3.4028234663852886e38, -3.4028234663852886e38, 1.5], got


# -- 8. the store cannot be reached: the CLI's one line says nothing ----------------------------


@pytest.mark.slow
def test_the_cli_says_in_its_one_line_that_the_store_cannot_be_reached(tmp_path: Path) -> None:
    """docs/spark.md: a failed query's reason is "the last line of ``weir spark stream``" (and
    a wrong option is one ``weir spark: …`` line, tests/adversarial/test_spark.py). With the
    store's database down (nothing listening on its port), that last line is
    ``weir spark: [STREAM_FAILED] Query [id = …, runId = …] terminated with exception:
    [PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming data source
    perform prepareForTriggerAvailableNow: Traceback (most recent call last):``: it ends where
    the reason would begin (psycopg's "connection … failed: Connection refused" is 50 lines
    up, inside PySpark's traceback). stream.py ``_reason`` keeps Spark's first line when no
    ``SourceError:`` line is found, and position.py ``bounds`` lets psycopg's error through."""
    from devkit.server import free_port

    port = free_port()
    config = _config(tmp_path, f"postgresql://weir@127.0.0.1:{port}/app")
    weir = str(Path(sys.executable).parent / "weir")
    done = subprocess.run(
        [weir, "spark", "stream", "--config", str(config), "--out", str(tmp_path / "out"),
         "--checkpoint", str(tmp_path / "ckpt"), "--available-now", "--master", "local[1]"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    said = [line for line in done.stderr.splitlines() if line.startswith("weir spark: ")]
    assert done.returncode == 1 and said, done.stderr[-3000:]
    assert str(port) in said[-1] or "reach" in said[-1] or "refused" in said[-1], said[-1]


# -- 9. the writer drops a column it does not know, silently ------------------------------------


@pytest.mark.parametrize("column", ["Version", "versoin", "delete"])
def test_a_column_the_writer_does_not_take_is_refused_naming_it(
    tmp_path: Path, column: str
) -> None:
    """docs/spark.md "Writing": the columns are ``collection_id``, ``record_id``, ``data`` and
    optionally ``deleted`` and ``version``; "a column of another type is refused before any
    task runs, naming it". A column ``Version`` (Spark's column names are case-insensitive),
    ``versoin`` or ``delete`` is accepted by sink.py ``target_of`` and then dropped by
    ``_record``: the rows are posted without a version (each replay's version is the time of
    ingest, so the guard that "stores nothing twice" is gone) or without the delete flag,
    without a word."""
    from pyspark.sql.types import LongType, StringType

    from spark.sink import SinkError, target_of
    from tests.helpers.api import TOKEN

    config = tmp_path / "weir.yaml"
    config.write_text(json.dumps({
        "api": {"listen": "127.0.0.1:1", "tokens": [TOKEN]}, "connectors": [],
        "store": {"url": "postgresql://127.0.0.1:1/none"},
        "sources": [{"name": "stripe", "kind": "http", "provider": "stripe"}]}))  # fmt: skip
    schema = StructType([StructField("collection_id", StringType()),
                         StructField("record_id", StringType()),
                         StructField("data", StringType()),
                         StructField(column, LongType())])  # fmt: skip
    with pytest.raises(SinkError, match=column):
        target_of({"config": str(config)}, schema)


# -- 10. a start time before events retention deleted: a silent gap ----------------------------


def test_a_start_time_before_deleted_events_fails_as_a_start_seq_does(
    tmp_path: Path, table: str
) -> None:
    """docs/spark.md “What a query keeps”, **Never a silent gap**: "When events a query has to
    read were deleted anyway (…, or a query without a name), its micro-batch fails: events 1 to
    4312 of source … were
    deleted by retention …; it never skips them." Events 1-5 were written after time T and
    deleted by retention, then 6-10 written. A read with ``start`` ``seq:1`` (or ``beginning``)
    fails so; the same
    read with ``start`` T (an ISO time before all of them) returns seqs 6-10 without a word:
    reader.py ``start_seq`` picks the first batch still stored after T, so the range a task
    checks (spark/source.py ``_present``) begins after the gap."""
    from datetime import UTC, datetime
    from datetime import timedelta as td

    from core.store import Store, retention
    from tests.helpers.weir import insert_t

    config = _config(tmp_path, table)
    before = (datetime.now(UTC) - td(seconds=5)).isoformat()
    with serving(load_config(config)):
        insert_t(table, range(5))
        wait_for(lambda: _head(table) == 5, what="5 changes stored")
        assert retention.delete_older(Store(load_config(config).store_url), td(0), td(0)) == 5
        insert_t(table, range(5, 10))
        wait_for(lambda: _head(table) == 10, what="5 more stored")

    for start in ("seq:1", "beginning"):
        with pytest.raises(SourceError, match=r"events 1 to 5 of source .* deleted by retention"):
            _read_from(config, start)
    with pytest.raises(SourceError, match="deleted by retention"):
        print(_read_from(config, before))  # Found: [6, 7, 8, 9, 10]


# -- 11. the schema given as Spark's .schema(): a mismatch inside the task ----------------------


@pytest.mark.slow
def test_a_schema_given_with_dot_schema_is_refused_pointing_at_the_option(
    writes: dict[str, Any],
) -> None:
    """docs/spark.md "Typed columns": typed columns come from the ``schema`` option; a wrong
    schema is refused "before any task runs", naming what to fix. A new user writes it the way
    Spark's other sources take one, ``spark.read.format("weir").schema("id INT")``: nothing
    refuses it before the tasks (source.py ``WeirSource.reader`` ignores the schema Spark
    passes unless the option is set), and each task fails inside PySpark's worker with
    ``[DATA_SOURCE_RETURN_SCHEMA_MISMATCH] Return schema mismatch in the result from 'read'
    method. Expected: 1 columns, Found: 10 columns``, which says nothing of the ``schema``
    option."""
    said = writes["user-schema"]
    if "ok" in said:
        return  # read as typed columns: fine
    assert "DATA_SOURCE_RETURN_SCHEMA_MISMATCH" not in said["error"], said["error"][-600:]
    assert 'option "schema"' in said["error"], said["error"][-600:]
