"""Tryout of the Nov 29 fixes (start positions in deleted events, the commit listener, the Spark
options and typed reads, the closest-name hint) by an outside tester, Nov 29 (m): each test is a
problem it found (what was seen is in each docstring); real servers, no mocks."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from pyspark.sql.types import (
    DayTimeIntervalType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from core.config.model import WeirConfig
from core.sources.pg.selected import selection_problems
from core.store.shared import lock_key
from devkit.embedded import EmbeddedNats
from spark.options import spec_of
from spark.source import Bucket, _batches
from spark.typed import SourceError
from tests.adversarial.test_tryout_spark_nov29c import _captured, _read_from, _typed_read
from tests.connectors.nats.harness import NatsHarness
from tests.helpers.brokers import wait_delivered
from tests.helpers.capture import wait_for
from tests.helpers.weir import (
    RETAINED,
    captured_then_pruned,
    cursor_of,
    insert_t,
    serving,
    weir_config,
)

# -- 1. an interval of non-ASCII digits fits INTERVAL DAY TO SECOND -----------------------------


@pytest.mark.parametrize("text", ["P\u0661D", "PT\u0663H", "P1DT\uff12H"])
def test_an_interval_of_digits_that_are_not_ascii_does_not_fit(
    tmp_path: Path, db_url: str, text: str
) -> None:
    """docs/spark.md “Typed columns”: ``INTERVAL DAY TO SECOND`` takes "ISO 8601 duration text,
    each part signed (P-3DT4H5.5S: an interval)"; "a value that does not fit its type fails
    the query (schemaMode failfast) with one line naming it". Done: a text column holding
    ``P\\u0661D`` (ARABIC-INDIC DIGIT ONE), ``PT\\u0663H`` or ``P1DT\\uff12H`` (FULLWIDTH
    DIGIT TWO), captured by a live weir run, read with ``schema`` ``v INTERVAL DAY TO
    SECOND``. Seen: no error; the rows read 1 day, 3 hours and 1 day 2 hours: typed.py
    ``_DURATION`` (changed in 054a120 to need a part after P and T) matches its numbers with
    ``\\d``, which in a str pattern is any Unicode decimal digit, and ``int()`` takes them
    too. ISO 8601 digits are 0-9, as ``_INT``, ``_DECIMAL`` and ``_DATE`` say ([0-9])."""
    config, head = _captured(
        tmp_path, db_url, "CREATE TABLE s (id int PRIMARY KEY, v text)",
        [f"INSERT INTO s VALUES (1, '{text}')"],
    )  # fmt: skip
    typed = StructType([StructField("v", DayTimeIntervalType())])
    with pytest.raises(SourceError, match=r"record 1\): field v .* does not fit"):
        print(_typed_read(config, head, typed))  # Found: v = 1 day / 3:00:00 / 1 day, 2:00:00


# -- 2. the closest-name hint folds case, naming another table than the one meant ---------------


def test_the_closest_table_hint_keeps_the_case_that_tells_tables_apart(db_url: str) -> None:
    """docs/configuration.md “The config file”: a ``collections`` pattern that matches none of
    the sources' tables is a WARNING "with the closest name"; "Table names are schema.table
    as written (no folding)". Done: a database holding ``"Orders"`` and ``orders`` (two
    tables: Postgres tells them apart), connectors whose ``collections`` is
    ``public:Orderz`` (a typo of ``public:Orders``) and ``public:orderz`` (of
    ``public:orders``), their selections checked against the live catalog
    (core/sources/pg/selected.py ``selection_problems``, as ``weir run``'s start and ``weir
    config validate`` do). Seen: both say ``… (did you mean 'public:orders'?)``: 478cf8d's
    ``closest`` (core/tables.py) folds every name to lower case as a dict's keys, so the two
    tables collapse into one and the later in catalog order is named for both, though each
    typo differs from its own table in one letter and from the other in two (before 478cf8d
    each hint named its own table)."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute('CREATE TABLE "Orders" (id int PRIMARY KEY)')
        conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
    nats = {"url": "nats://127.0.0.1:1", "namespace": "x"}
    cfg = WeirConfig.model_validate({
        "store": {"url": db_url},
        "sources": [{"name": "app", "kind": "postgres", "url": db_url, "schemas": ["public"]}],
        "connectors": [{"name": name, "type": "nats", "stream": "events",
                        "collections": [f"public:{name}z"], "nats": nats}
                       for name in ("Order", "order")],
    })  # fmt: skip
    problems = [str(p) for p in selection_problems(cfg, cfg.connectors)]
    print(problems)  # Found: both [... (did you mean 'public:orders'?)]
    assert problems == [
        f"connector {name}: collections: 'public:{name}z' matches none of its sources' tables"
        f" (did you mean 'public:{name}s'?)"
        for name in ("Order", "order")
    ]


# -- 3. a sharded connector's start in deleted events is said only when shard 0 starts first ---


def test_a_sharded_start_in_deleted_events_is_told_whichever_shard_starts_first(
    table: str, nats_server: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/design.md “Guarantees” (**Start positions**): "A seq or time start in events
    retention deleted starts at the first kept event, and weir run logs a warning naming the
    connector, the deleted seqs and the source"; **Nothing lost silently**. ``shards`` spread
    a connector "over worker processes and instances" (docs/configuration.md “`connectors`”).
    Done: events 1-5 deleted by retention, 6-8 kept; a new NATS connector with ``shards: 2`` and
    ``start_position: {seq: 2}``; shard 0's lease (``connector:sh#0/2``) held by another
    session (as another instance, or worker process, that took it and is slower to start),
    so the weir run starts shard 1 first; once both cursors are made, the lease is let go
    and shard 0 runs too. Seen: all 3 kept events delivered, and no warning at all: the
    shard that loads first makes every shard's cursor (core/store/cursors.py ``_make``,
    ``new=True`` only for it), and core/store/starts.py ``tell_deleted`` speaks only for
    ``shard.index == 0``, which then finds its cursor saved (``new`` False)."""
    captured_then_pruned(table)
    store = RETAINED
    nats = NatsHarness(nats_server)
    connector = nats.connector("sh", "events", start_position={"seq": 2}, shards=2)
    nats.prepare(connector)
    lease = lock_key("weir", "lease", "connector:sh#0/2")
    with psycopg.connect(table, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (lease,))
        with (
            caplog.at_level(logging.WARNING),
            serving(weir_config(table, [connector], store=store)),
        ):
            wait_for(lambda: len(_cursors(table)) == 2, what="both shards' cursors made")
            other.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (lease,))
            delivered = wait_delivered(nats, connector, 3)
    assert sorted(d.payload["record"]["id"] for d in delivered) == [5, 6, 7]
    said = [r.getMessage() for r in caplog.records if "start_position begins" in r.getMessage()]
    print(said)  # Found: []
    assert said == [
        "connector sh: its start_position begins in events 2 to 5 of source app, which "
        "retention deleted (store.events_retention); it starts at the first kept, 6"
    ]


def _cursors(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT connector FROM weir.cursors").fetchall()]


# -- 4. a TIMESTAMP beyond Spark's years 1 to 9999 in UTC is read, where TIMESTAMP_NTZ refuses it --


@pytest.mark.parametrize("text", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_a_timestamp_beyond_year_1_to_9999_in_utc_does_not_fit(
    tmp_path: Path, db_url: str, text: str
) -> None:
    """docs/spark.md “Typed columns”: ``TIMESTAMP`` takes "ISO 8601 text; without an offset
    (a timestamp column), UTC", and "a value that does not fit its type fails the query
    (schemaMode failfast) with one line naming it". Spark's TIMESTAMP holds 0001-01-01 to
    9999-12-31 (UTC). Done: a text column holding ``0001-01-01T00:00:00+01:00`` (in UTC, the
    last hour of 1 BC) or ``9999-12-31T23:59:59-01:00`` (in UTC, year 10000), taken by
    054a120's ``_time`` check (they start with YYYY-MM-DD), captured by a live weir run, read
    with ``schema`` ``v TIMESTAMP``, failfast. Seen: no error; the read task's Arrow batch
    holds -62135600400000000 / 253402304399000000 microseconds (before 0001-01-01 / after
    9999-12-31 UTC), which Python cannot even turn back into a datetime (OverflowError);
    typed.py ``_timestamp`` returns the aware time as it is, while ``_timestamp_ntz``, which
    converts to UTC, says the same text "does not fit TIMESTAMP_NTZ"."""
    config, head = _captured(
        tmp_path, db_url, "CREATE TABLE s (id int PRIMARY KEY, v text)",
        [f"INSERT INTO s VALUES (1, '{text}')"],
    )  # fmt: skip
    ntz = StructType([StructField("v", TimestampNTZType())])
    with pytest.raises(SourceError, match=r"record 1\): field v .* does not fit"):
        _typed_batches(config, head, ntz)  # as it should: the one line
    typed = StructType([StructField("v", TimestampType())])
    with pytest.raises(SourceError, match=r"record 1\): field v .* does not fit"):
        batches = _typed_batches(config, head, typed)
        print([b.column("v").cast(pa.int64()).to_pylist() for b in batches])  # Found: above


def _typed_batches(config: Path, head: int, typed: StructType) -> list[pa.RecordBatch]:
    """_typed_read's batches, not turned into Python values."""
    ddl = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in typed.fields)
    spec = replace(spec_of({"config": str(config), "schema": ddl}), typed=typed)
    return list(_batches(spec, Bucket(0, head, 0, 1)))


# -- 5. Postgres's own text of a timestamptz is refused as a start time --------------------------


def test_a_start_time_as_postgres_prints_it_is_taken(tmp_path: Path, db_url: str) -> None:
    """docs/spark.md “Reading”: ``start`` is "beginning (the default), end, seq:N (from seq N),
    or an ISO time (UTC when it has no offset)"; docs/configuration.md “`connectors`”:
    ``start_position`` ``{time: ISO-8601}``. ISO 8601 writes an offset as ±hh:mm, ±hhmm or
    ±hh, and ``±hh`` is how Postgres prints a whole-hour offset. Done: ``SELECT now()::text``
    on the store's server (``2026-11-29 23:02:55.328939+00``: what psql shows, what a user
    copies), then 5 rows captured by a live weir run, then a read with that ``start``, and a
    connector's ``start_position: {time: <the same text>}``. Seen: the read is refused,
    ``option "start": beginning, end, seq:N or an ISO time, not '2026-…+00'``, and the config
    with ``time: Input should be a valid datetime or date, unexpected extra characters at the
    end of the input``: 054a120's ``TimeStart._iso`` passes the text on to pydantic's datetime,
    which takes ``+00:00`` and ``+0000`` but not ``+00`` (Python's ``fromisoformat``, which
    typed.py's TIMESTAMP reads use, takes all three)."""
    with psycopg.connect(db_url) as conn:
        now = conn.execute("SELECT now()::text").fetchone()[0]  # type: ignore[index]
    assert now.endswith("+00")
    config, _ = _captured(
        tmp_path, db_url, "CREATE TABLE t (id int PRIMARY KEY)",
        [f"INSERT INTO t VALUES ({i})" for i in range(5)],
    )  # fmt: skip
    cfg = WeirConfig.model_validate({
        "store": {"url": db_url},
        "sources": [{"name": "app", "kind": "postgres", "url": db_url, "schemas": ["public"]}],
        "connectors": [{"name": "n", "type": "nats", "stream": "events",
                        "start_position": {"time": now},
                        "nats": {"url": "nats://127.0.0.1:1", "namespace": "x"}}],
    })  # fmt: skip
    assert cfg.connectors[0].start_position.utc.isoformat() == now.replace(" ", "T") + ":00"
    assert _read_from(config, now) == [1, 2, 3, 4, 5]


# -- 6. a start time still to come delivers what is written before it ---------------------------


def test_a_start_time_still_to_come_delivers_nothing_written_before_it(
    table: str, nats_server: EmbeddedNats
) -> None:
    """docs/design.md “Guarantees” (**Start positions**): ``{time: …}``; docs/configuration.md
    “`connectors`”: ``start_position`` "… a seq or a time" (the schema: "deliver messages
    written at or after this time"). Done: two new NATS connectors on the events stream, one
    ``beginning``, one ``start_position: {time: <the store's now() + 1 hour>}`` (a release
    planned for later, a time zone mistaken); a live weir run; 3 rows inserted now, and once
    the ``beginning`` one delivered them, 3 seconds more. Seen: the timed connector delivered
    the 3 rows too, written an hour before its start time: core/store/starts.py
    ``start_seq`` (moved there by e864e73) finds no batch committed at or after the time,
    returns the stream's head at the first start, and from there on every message goes,
    whatever its time."""
    with psycopg.connect(table) as conn:
        row = conn.execute("SELECT now() + interval '1 hour'").fetchone()
    assert row is not None
    later = row[0]
    nats = NatsHarness(nats_server)
    control = nats.connector("all", "events")
    timed = nats.connector("timed", "events", start_position={"time": later.isoformat()})
    for c in (control, timed):
        nats.prepare(c)
    with serving(weir_config(table, [control, timed])):
        # the fix: a connector whose start is to come waits, its cursor made once it passed
        wait_for(lambda: cursor_of(table, "all")[0] >= 0, what="the control connector's start")
        insert_t(table, range(3))
        wait_delivered(nats, control, 3, settle=3.0)
        got = nats.read(timed)
    print([d.payload["record"]["id"] for d in got])  # Found: [0, 1, 2]
    assert got == []
