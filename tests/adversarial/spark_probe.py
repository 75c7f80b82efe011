"""The Spark driver of tests/adversarial/test_spark.py: one job (one JVM) that runs many checks
of the ``weir`` data source and writer, each a JSON result on a ``CHECK`` line; with a fourth
argument ``serve``, the reads test_spark.py asks on stdin instead (:func:`serve`)."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from pyspark.sql import functions as F

from spark.session import spark_session
from spark.source import WeirSource

config, work, dead_port = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
spark = spark_session("local[2]", None, app="weir-adversarial")
spark.dataSource.register(WeirSource)


def check(name: str, f: Callable[[], Any]) -> None:
    try:
        result: Any = {"ok": f()}
    except Exception as e:  # the whole text: the data source's message is at its end
        result = {"error": str(e)}
    print("CHECK", json.dumps([name, result], default=str), flush=True)


def read(**options: str) -> Any:
    r = spark.read.format("weir")
    for k, v in {"config": config, **options}.items():
        r = r.option(k, v)
    return r.load()


def serve() -> None:
    """Reads for tests/adversarial/test_spark.py's generated values: each stdin line is JSON,
    ``{"options": {...}, "out": PATH}``; the read goes to the Parquet file PATH and the answer
    is a ``DONE`` line, ``{"ok": rows}`` or ``{"error": the data source's line}``."""
    for line in sys.stdin:
        ask = json.loads(line)
        try:
            table = read(**ask["options"]).toArrow()
            pq.write_table(table, ask["out"])
            result: Any = {"ok": table.num_rows}
        except Exception as e:
            said = [x for x in str(e).splitlines() if "SourceError: " in x]
            result = {"error": said[-1] if said else str(e)}
        print("DONE", json.dumps(result), flush=True)


if sys.argv[4:] == ["serve"]:
    serve()
    spark.stop()
    sys.exit(0)


def write(df: Any, **options: str) -> str:
    w = df.write.format("weir").option("config", config).option("source", "stripe")
    for k, v in options.items():
        w = w.option(k, v)
    w.mode("append").save()
    return "saved"


def rows(sql: str) -> Any:
    return spark.sql(sql)


# -- wrong options: each fails naming the option ------------------------------------------------
for name, opts in {
    "no_config": {"config": ""},
    "unknown_source": {"source": "nope"},
    "several_sources": {},
    "stream": {"source": "app", "stream": "changes"},
    "partitions": {"source": "app", "partitions": "0"},
    "start": {"source": "app", "start": "yesterday"},
    "split": {"source": "app", "split": "range"},
    "actions": {"source": "app", "actions": "upsert"},
    "maxMessagesPerTrigger": {"source": "app", "maxMessagesPerTrigger": "-1"},
    "schema-type": {"source": "app", "schema": "id INT, gap INTERVAL YEAR TO MONTH"},
    "schema-clash": {"source": "app", "schema": "seq BIGINT"},
    "schema-ddl": {"source": "app", "schema": "id INT,"},
    "schemaMode": {"source": "app", "schema": "id INT", "schemaMode": "lenient"},
}.items():
    check("option:" + name, lambda opts=opts: read(**opts).count())

# -- nothing to read: no rows, no error (stripe: nothing pushed yet) ------------------------
check("empty:end", lambda: read(source="app", start="end").count())
check("empty:beyond", lambda: read(source="app", start="seq:1000000").count())
check("empty:future", lambda: read(source="app", start="2999-01-01T00:00:00Z").count())
check("empty:http-source", lambda: read(source="stripe").count())
check("empty:records-end", lambda: read(source="app", stream="records", start="end").count())
check("empty:no-match", lambda: read(source="app", collections="nomatch:*").count())

# -- every event once, in both splits and 7 partitions ------------------------------------------
for split in ("hash", "seq"):
    check(
        f"seqs:{split}",
        lambda split=split: [
            r.seq for r in read(source="app", partitions="7", split=split).select("seq").collect()
        ],
    )
check("seqs:from-5", lambda: sorted(r.seq for r in read(source="app", start="seq:5").collect()))
check("events", lambda: [r.asDict() for r in read(source="app").drop("committed_at").collect()])
check(
    "records",
    lambda: [r.asDict() for r in read(source="app", stream="records", partitions="3").collect()],
)

# -- the writer --------------------------------------------------------------------------------
S = "collection_id string, record_id string, data string, version long"
check("write:json", lambda: write(spark.createDataFrame([("c:w", "1", '{"a": 1}', 5)], S)))
check("write:older", lambda: write(spark.createDataFrame([("c:w", "1", '{"a": 0}', 3)], S)))
check(
    "write:delete",
    lambda: [
        write(spark.createDataFrame([("c:w", "2", '{"b": 1}', 1)], S)),
        write(
            rows(
                "SELECT 'c:w' collection_id, '2' record_id, CAST(NULL AS string) data, "
                "true deleted, 3L version"
            )
        ),
    ],
)
check(
    "write:struct",
    lambda: write(
        rows("SELECT 'c:w' collection_id, '3' record_id, named_struct('n', 1, 's', 'ü') data")
    ),
)
check(
    "write:struct-decimal",
    lambda: write(
        rows(
            "SELECT 'c:w' collection_id, '4' record_id, "
            "named_struct('amount', CAST(12.50 AS decimal(10,2))) data"
        )
    ),
)
check(
    "write:version-timestamp",
    lambda: write(
        rows(
            "SELECT 'c:w' collection_id, '5' record_id, '{\"a\": 1}' data, "
            "TIMESTAMP'2026-01-01 00:00:00' version"
        )
    ),
)
check(
    "write:version-text",
    lambda: write(rows("SELECT 'c:w' collection_id, '6' record_id, '{}' data, 'x' version")),
)
check("write:missing", lambda: write(rows("SELECT 'c:w' collection_id, '{}' data")))
check(
    "write:not-http",
    lambda: write(rows("SELECT 'c:w' collection_id, '6' record_id, '{}' data"), source="app"),
)
check(
    "write:api-down",
    lambda: write(
        rows("SELECT 'c:w' collection_id, '7' record_id, '{}' data"),
        url=f"http://127.0.0.1:{dead_port}",
    ),
)

# A streaming write (appends, no version) whose last micro-batch Spark runs again.
ckpt = work / "write.ckpt"
shutil.rmtree(ckpt, ignore_errors=True)


def stream_write() -> None:
    q = (read_stream := spark.readStream.format("weir").option("config", config)
         .option("source", "app").option("collections", "public:t")
         .option("maxMessagesPerTrigger", "7").load())  # fmt: skip
    q = (read_stream.where("record IS NOT NULL")
         .select(F.lit("c:copy").alias("collection_id"), "record_id",
                 F.col("record").alias("data"))
         .writeStream.format("weir").option("config", config).option("source", "stripe")
         .option("checkpointLocation", str(ckpt)).trigger(availableNow=True).start())  # fmt: skip
    q.awaitTermination()


def replay() -> list[int]:
    stream_write()
    before = read(source="stripe").count()
    commits = sorted((ckpt / "commits").glob("[0-9]*"), key=lambda p: int(p.name))
    commits[-1].unlink()
    (ckpt / "commits" / f".{commits[-1].name}.crc").unlink(missing_ok=True)
    stream_write()
    return [before, read(source="stripe").count(), int(commits[-1].exists())]


check("write:replay", replay)
check(
    "write:stored",
    lambda: sorted(
        (r.collection_id, r.record_id, r.action, r.record)
        for r in read(source="stripe", stream="records").collect()
    ),
)
spark.stop()
