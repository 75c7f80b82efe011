"""The ``weir`` Spark data source's read rate: messages/s a batch read of the events stream
takes on ``local[2]`` (every row through Spark, into its ``noop`` sink), next to a plain
psycopg read of the same stored batches into the same row tuples in one process, on the same
server in the same run (docs/spark.md); and, for what Spark itself costs, the same read into
the Arrow batches a task makes, in one process (``plain_arrow_per_s``); and Spark's own floor,
a Python data source yielding those Arrow batches ready made (``spark_floor_per_s``).

    .venv/bin/python bench/spark_source.py [--rows 300000] [--partitions 2]

The events are captured first (bulk inserts of 10,000 rows a transaction, by ``weir run``
without connectors). The source's time is from the start of the Spark job to its end (the JVM's
start and a first read, which starts its Python workers, are reported apart, as
``spark_start_s``); the baseline's, its loop. Prints one JSON line
and appends it to bench/results/spark_source.jsonl. The CPU of each process is in ``cpu_s``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).parent))

from common import insert_rows, new_db, record, run_for

from core.config.model import WeirConfig
from devkit.embedded import EmbeddedPostgres


def capture(pg: EmbeddedPostgres, rows: int, tmp: Path) -> tuple[WeirConfig, Path]:
    """``rows`` inserts captured into the store; the config and its file."""
    url = new_db(pg, "spark_src")
    spec = {"sources": [{"name": "app", "kind": "postgres", "url": url,
                         "tables": ["public.bench"]}], "connectors": []}  # fmt: skip
    cfg = WeirConfig.model_validate(spec)
    path = tmp / "weir.yaml"
    path.write_text(json.dumps(spec))

    def stored() -> int:
        with psycopg.connect(url) as conn:
            row = conn.execute("SELECT events_seq FROM weir.sources").fetchone()
        return int(row[0]) if row else 0

    from core.runtime.service import prepare

    prepare(cfg)
    with psycopg.connect(url, autocommit=True) as conn:
        insert_rows(conn, rows)
    run_for(cfg, stored, rows)
    return cfg, path


def plain_read(path: Path, arrow: bool = False) -> tuple[int, float]:
    """The baseline: the stored batches read with psycopg and made into the source's rows
    (row tuples, as the connectors' reader makes them), in one process (no Spark); with
    ``arrow``, into the Arrow batches a Spark task makes (spark/arrow.py), in one process.
    (messages, seconds)."""
    from spark.options import spec_of
    from spark.position import bounds, run
    from spark.source import Bucket, _batches, _pages

    spec = spec_of({"config": str(path), "partitions": "1"})
    after, head = run(bounds(spec))
    bucket = Bucket(after, head, 0, 1)
    start = time.perf_counter()
    if arrow:
        n = sum(b.num_rows for b in _batches(spec, bucket))
    else:
        n = sum(len(page) for page in _pages(spec, bucket))
    return n, time.perf_counter() - start


def spark_read(path: Path, partitions: int, split: str) -> tuple[int, float, float]:
    """(messages, seconds of the job, seconds the JVM took to start)."""
    from spark.session import spark_session
    from spark.source import WeirSource

    t0 = time.perf_counter()
    spark = spark_session("local[2]", None, app="weir-bench")
    spark.dataSource.register(WeirSource)
    df = (spark.read.format("weir").option("config", str(path))
          .option("partitions", str(partitions)).option("split", split).load())  # fmt: skip
    df.count()  # once to start the Python workers (timed with the JVM's start)
    started = time.perf_counter() - t0
    start = time.perf_counter()
    n = df.count()  # every row through the source: Spark cannot count without reading
    return n, time.perf_counter() - start, started


def spark_floor(path: Path, tmp: Path, partitions: int) -> float:
    """Spark's own floor for the read: a Python data source yielding the same rows as Arrow
    batches already made (memory-mapped files of them, one a partition), on the same session.
    Messages/s."""
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from spark.options import spec_of
    from spark.position import bounds, run
    from spark.source import SCHEMA, Bucket, _batches

    spec = spec_of({"config": str(path)})
    after, head = run(bounds(spec))
    table = pa.Table.from_batches(list(_batches(spec, Bucket(after, head, 0, 1))))
    size = -(-table.num_rows // partitions)
    for i in range(partitions):
        with pa.ipc.new_file(str(tmp / f"floor{i}.arrow"), table.schema) as w:
            for batch in table.slice(i * size, size).to_batches(5000):
                w.write_batch(batch)

    class Made(InputPartition):
        def __init__(self, i: int) -> None:
            self.i = i

    class Reader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [Made(i) for i in range(partitions)]

        def read(self, partition: Made) -> Any:  # type: ignore[override]
            made = pa.ipc.open_file(pa.memory_map(str(tmp / f"floor{partition.i}.arrow")))
            for k in range(made.num_record_batches):
                yield made.get_batch(k)

    class Floor(DataSource):
        @classmethod
        def name(cls) -> str:
            return "weir_floor"

        def schema(self) -> str:
            return SCHEMA

        def reader(self, schema: Any) -> DataSourceReader:
            return Reader()

    spark = SparkSession.getActiveSession()
    assert spark is not None
    spark.dataSource.register(Floor)
    df = spark.read.format("weir_floor").load()
    df.count()
    start = time.perf_counter()
    n = df.count()
    return n / (time.perf_counter() - start)


def cpu() -> dict[str, float]:
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return {"self": me.ru_utime + me.ru_stime, "children": kids.ru_utime + kids.ru_stime}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--split", choices=("hash", "seq"), default="hash")
    args = parser.parse_args()
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"weir-bench-spark-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=True)
    with EmbeddedPostgres() as pg:
        _, path = capture(pg, args.rows, tmp)
        before = cpu()
        plain_n, plain_s = plain_read(path)
        plain_cpu = cpu()["self"] - before["self"]
        arrow_n, arrow_s = plain_read(path, arrow=True)
        spark_n, spark_s, start_s = spark_read(path, args.partitions, args.split)
        floor = spark_floor(path, tmp, args.partitions)
    assert plain_n == arrow_n == spark_n == args.rows, (plain_n, arrow_n, spark_n, args.rows)
    out: dict[str, Any] = {
        "bench": "spark_source",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "messages": args.rows,
        "partitions": args.partitions,
        "split": args.split,
        "spark_start_s": round(start_s, 1),
        "spark_per_s": round(spark_n / spark_s),
        "plain_per_s": round(plain_n / plain_s),
        "ratio_vs_plain": round(plain_s / spark_s, 3),
        "plain_cpu_us_per_message": round(plain_cpu / plain_n * 1e6, 1),
        "plain_arrow_per_s": round(arrow_n / arrow_s),
        "ratio_vs_plain_arrow": round(arrow_s / spark_s, 3),
        "spark_floor_per_s": round(floor),
        "floor_vs_plain": round(floor * plain_s / plain_n, 3),
        "goal_ratio": 0.7,
    }
    record(out)
    asyncio.set_event_loop_policy(None)


if __name__ == "__main__":
    main()
