"""Tryout of the Spark integration (docs/spark.md) by an outside tester, Nov 29 (l): each test is
a problem it found (what was seen is in each docstring); real servers, no mocks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql.types import (
    DataType,
    DateType,
    DayTimeIntervalType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from spark.options import spec_of
from spark.sink import SinkError, target_of, write_rows
from spark.typed import SourceError
from tests.adversarial.test_tryout_spark_nov29c import _captured, _read_from, _typed_read

_ROWS = StructType([StructField(n, StringType()) for n in ("collection_id", "record_id", "data")])


def _http_config(tmp_path: Path, listen: str) -> Path:
    from tests.helpers.api import TOKEN

    config = tmp_path / "weir.yaml"
    config.write_text(json.dumps({
        "api": {"listen": listen, "tokens": [TOKEN]}, "connectors": [],
        "store": {"url": "postgresql://127.0.0.1:1/none"},
        "sources": [{"name": "stripe", "kind": "http", "provider": "stripe"}]}))  # fmt: skip
    return config


# -- 1. a start of digits alone is read as a Unix time: the whole stream, silently -------------


@pytest.mark.parametrize("start", ["100", "1700000000"])
def test_a_start_of_digits_alone_is_refused_not_read_as_a_unix_time(
    tmp_path: Path, db_url: str, start: str
) -> None:
    """docs/spark.md “Reading”: ``start`` is "beginning (the default), end, seq:N (from seq N),
    or an ISO time (UTC when it has no offset)"; another value is refused: ``option "start":
    beginning, end, seq:N or an ISO time, not …``. Done: 5 changes captured by a live weir run,
    then a read (and an AvailableNow streaming read, on local[2]) with ``start`` ``"100"`` (a
    user meaning seq 100, or a typo for ``seq:100``). Seen: no error; pydantic's lax datetime
    (options.py ``spec_of`` → ``{"time": "100"}`` → TimeStart) takes the digits as seconds
    since 1970 (1970-01-01T00:01:40Z), so the query reads every seq, 1 to 5, from the start.
    Not an ISO time: it should be refused, naming the option."""
    config, _ = _captured(
        tmp_path, db_url, "CREATE TABLE t (id int PRIMARY KEY)",
        [f"INSERT INTO t VALUES ({i})" for i in range(5)],
    )  # fmt: skip
    with pytest.raises(SourceError, match='option "start"'):
        print(_read_from(config, start))  # Found: [1, 2, 3, 4, 5]


# -- 2. a misspelled writer option is dropped silently ------------------------------------------


@pytest.mark.parametrize("option", ["ulr", "sorce", "confg"])
def test_a_misspelled_writer_option_is_refused_naming_it(tmp_path: Path, option: str) -> None:
    """docs/spark.md “Reading”: "any other option is refused, naming the closest (a misspelled
    collections would read every collection)"; “Writing” lists the writer's options: config,
    source, url. Done (also as a real ``df.write.format("weir")`` on local[2] into a live weir
    run, with ``.option("ulr", "http://127.0.0.1:1")``): the write was saved through the
    config's api.listen, without a word; ``sorce`` would post into the only http source and
    ``url`` misspelled posts where the executors may not reach. sink.py ``target_of`` never
    looks at option names it does not know."""
    config = _http_config(tmp_path, "127.0.0.1:1")
    with pytest.raises(SinkError, match=option):
        target_of({"config": str(config), option: "http://127.0.0.1:1"}, _ROWS)


# -- 3. partitions beyond what Spark can run: the Python worker crashes minutes later ----------


def test_partitions_beyond_what_spark_can_run_are_refused_naming_the_option(
    tmp_path: Path, db_url: str
) -> None:
    """docs/spark.md “Reading”: ``partitions`` is "read tasks a micro-batch"; a wrong value
    fails at once naming it (``option "partitions": a whole number of at least 1, not …``).
    Done: ``spark.read.format("weir").option("partitions", "99999999999999999999").load()
    .count()`` on local[2] over 5 captured changes. Seen: after 4-5 minutes ``SparkException:
    Python worker exited unexpectedly (crashed)`` (source.py ``_buckets`` builds a list of that
    many Buckets on the driver's Python planner), no word of the option. A Spark stage's
    partitions are a Java int: a value beyond 2^31-1 can never run and should be refused."""
    config, _ = _captured(
        tmp_path, db_url, "CREATE TABLE t (id int PRIMARY KEY)",
        [f"INSERT INTO t VALUES ({i})" for i in range(5)],
    )  # fmt: skip
    with pytest.raises(SourceError, match='option "partitions"'):
        spec_of({"config": str(config), "partitions": "99999999999999999999"})


# -- 4. the writer's url option: its password printed in the task's error ---------------------


@pytest.mark.slow
def test_an_unreachable_url_with_a_password_is_not_printed_with_it(tmp_path: Path) -> None:
    """docs/design.md “Guarantees”: "Secrets never appear in logs, errors, …"; docs/
    configuration.md “Secrets”: masked "by shape, in all output: a URL's password
    (nats://u:***@host …)". Done: the writer (sink.py ``target_of`` then ``write_rows``, as a
    task runs it) with option ``url`` ``http://lake:hunter2-Pw-9f@127.0.0.1:1`` (basic auth
    through a proxy: httpx sends a URL's user info as such) and the API not answering. Seen,
    after the ~1 minute of retries: ``SinkError: source stripe: http://lake:hunter2-Pw-9f@
    127.0.0.1:1/v1/sources/stripe/records cannot be reached: [Errno 111] Connection refused
    (tried 8 times in 60 s)``: the password as it is (sink.py ``_post``, ``why``)."""
    from pyspark.sql import Row

    config = _http_config(tmp_path, "127.0.0.1:1")
    target = target_of({"config": str(config), "url": "http://lake:hunter2-Pw-9f@127.0.0.1:1"},
                       _ROWS)  # fmt: skip
    with pytest.raises(SinkError) as said:
        write_rows(target, iter([Row(collection_id="c", record_id="1", data='{"a": 1}')]))
    assert "cannot be reached" in str(said.value), said.value
    assert "hunter2-Pw-9f" not in str(said.value), said.value


# -- 5. DATE takes text that is not YYYY-MM-DD: an ISO week date, digits with spaces ------------


@pytest.mark.parametrize("text", ["2026-W01-1", "20260101  "])
def test_a_date_that_is_not_yyyy_mm_dd_does_not_fit_date(
    tmp_path: Path, db_url: str, text: str
) -> None:
    """docs/spark.md “Typed columns”: ``DATE`` takes "YYYY-MM-DD (a BC date or infinity does
    not fit)"; "a value that does not fit its type fails the query (schemaMode failfast) with
    one line naming it". Done: a text column holding ``2026-W01-1`` (an ISO week label) or
    ``20260101`` and two spaces, captured by a live weir run, read with ``schema`` ``d DATE``.
    Seen: no error; the rows read ``2025-12-29`` and ``2026-01-01``: typed.py ``_date``
    checks only the length (10) and hands the text to ``date.fromisoformat``, which since
    Python 3.11 takes ISO week dates and the basic format (trailing spaces too)."""
    config, head = _captured(
        tmp_path, db_url, "CREATE TABLE w (id int PRIMARY KEY, d text)",
        [f"INSERT INTO w VALUES (1, '{text}')"],
    )  # fmt: skip
    typed = StructType([StructField("d", DateType())])
    with pytest.raises(SourceError, match=r"record 1\): field d .* does not fit DATE"):
        print(_typed_read(config, head, typed))  # Found: d = 2025-12-29 / 2026-01-01


# -- 6. text that is no JSON number or no ISO duration fits BIGINT / INTERVAL --------------------


@pytest.mark.parametrize(
    ("text", "kind"),
    [("007", LongType()), ("PT", DayTimeIntervalType()), ("P1DT", DayTimeIntervalType())],
)
def test_text_that_is_no_number_or_duration_does_not_fit(
    tmp_path: Path, db_url: str, text: str, kind: DataType
) -> None:
    """docs/spark.md “Typed columns”: ``BIGINT`` takes "a whole JSON number, or a string of one
    (a numeric column)", INTERVAL DAY TO SECOND "ISO 8601 duration text"; "a string fits only
    the types that take one above", and what does not fit fails the query (failfast). Done: a
    text column holding ``007`` (a code with leading zeros: no JSON number, which DECIMAL
    refuses), ``PT`` or ``P1DT`` (no ISO 8601 duration: no part after P or T), captured by a
    live weir run, read with ``schema`` ``v BIGINT`` / ``v INTERVAL DAY TO SECOND``. Seen: no
    error; 7, 0 and 1 day: typed.py ``_INT`` allows leading zeros (``_DECIMAL`` does not), and
    ``_DURATION`` matches an empty P…T."""
    config, head = _captured(
        tmp_path, db_url, "CREATE TABLE s (id int PRIMARY KEY, v text)",
        [f"INSERT INTO s VALUES (1, '{text}')"],
    )  # fmt: skip
    typed = StructType([StructField("v", kind)])
    with pytest.raises(SourceError, match=r"record 1\): field v .* does not fit"):
        print(_typed_read(config, head, typed))  # Found: v = 7 / 0:00:00 / 1 day
