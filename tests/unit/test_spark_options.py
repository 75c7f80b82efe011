"""The ``weir`` data source's options (docs/spark.md “Reading”): each mistake is one error
naming the option and what it takes, on the driver, before any task runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from core.config.connector import SeqStart
from spark.options import spec_of
from spark.typed import SourceError


@pytest.fixture
def config(tmp_path: Path) -> str:
    path = tmp_path / "weir.yaml"
    url = "postgresql://weir@127.0.0.1:1/app"
    path.write_text(json.dumps({"sources": [
        {"name": "app", "kind": "postgres", "url": url, "schemas": ["public"]},
        {"name": "billing", "kind": "postgres", "url": url, "schemas": ["billing"]}]}))  # fmt: skip
    return str(path)


def test_a_spec_is_what_the_options_say(config: str) -> None:
    spec = spec_of({"config": config, "source": "billing", "stream": "events",
                    "collections": "billing:a, billing:b", "actions": "insert,delete",
                    "start": "seq:42", "partitions": "4", "maxMessagesPerTrigger": "1000",
                    "name": "lake"})  # fmt: skip
    assert (spec.collections, spec.actions, spec.partitions, spec.max_per_trigger, spec.name) == (
        ("billing:a", "billing:b"), ("insert", "delete"), 4, 1000, "lake")  # fmt: skip
    assert spec.start == SeqStart(seq=42) and spec.stream == "events"


@pytest.mark.parametrize(("options", "said"), [
    ({}, 'option "config" is required'),
    ({"source": None}, 'option "source": name one of the config\'s sources (app, billing)'),
    ({"source": "nope"}, "no source 'nope' among the config's sources (app, billing)"),
    ({"stream": "changes"}, "events or records, not 'changes'"),
    ({"start": "seq:x"}, "beginning, end, seq:N or an ISO time, not 'seq:x'"),
    ({"start": "yesterday"}, "not 'yesterday'"),
    ({"partitions": "0"}, 'option "partitions": a whole number of at least 1'),
    ({"split": "range"}, "hash or seq, not 'range'"),
    ({"maxMessagesPerTrigger": "1e3"}, "not '1e3'"),
    ({"maxmessagespertriger": "5"}, "(did you mean 'maxMessagesPerTrigger'?)"),  # as documented
    ({"SchemaMod": "permissive"}, "(did you mean 'schemaMode'?)"),
    ({"actions": "inserts"}, "insert, update, delete or truncate, of the events stream (inserts"),
    ({"actions": "insert", "stream": "records"}, "of the events stream (records given)"),
])  # fmt: skip
def test_a_wrong_option_says_which_and_what_it_takes(
    config: str, options: dict[str, str | None], said: str
) -> None:
    given = {"config": config, "source": "app", **options} if options else {}
    with pytest.raises(SourceError) as e:
        spec_of({k: v for k, v in given.items() if v is not None})
    assert said in str(e.value)


def test_a_write_takes_its_own_options_and_those_spark_gives_a_stream_writer(
    tmp_path: Path,
) -> None:
    """docs/spark.md “Writing”: config, source and url; Spark's checkpointLocation and
    queryName pass (Spark hands them to a stream writer, in lower case); a path does not."""
    from pyspark.sql.types import StringType, StructField, StructType

    from spark.sink import SinkError, target_of

    path = tmp_path / "weir.yaml"
    path.write_text(json.dumps({
        "api": {"listen": "127.0.0.1:1", "tokens": ["t" * 32]},
        "store": {"url": "postgresql://127.0.0.1:1/none"},
        "sources": [{"name": "stripe", "kind": "http", "provider": "stripe"}]}))  # fmt: skip
    rows = StructType(
        [StructField(n, StringType()) for n in ("collection_id", "record_id", "data")]
    )
    given = {"config": str(path), "checkpointlocation": "/tmp/c", "queryname": "q"}
    assert target_of(given, rows).url == "http://127.0.0.1:1/v1/sources/stripe/records"
    with pytest.raises(SinkError, match=r"no option 'path' of a weir write: docs/spark.md"):
        target_of({**given, "path": "/tmp/out"}, rows)
    with pytest.raises(SinkError, match=r"no option 'soruce' .*\(did you mean 'source'\?\)"):
        target_of({**given, "soruce": "stripe"}, rows)
