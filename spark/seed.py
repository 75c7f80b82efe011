"""The Spark seed job: source tables into the records stream, in parallel
(docs/operations.md “Backfill and seed”).

    weir seed --config FILE --source S --table T [--table T2] [--master URL] [--jdbc-jar JAR]
    spark-submit --py-files weir.zip spark/seed.py --config FILE --source S --table T

Each table is split into key ranges of about equal size (``sources.pg.snapshot.key_ranges``), one
Spark partition each, and all tables' partitions run in one job. Without a jar, a task reads
its range with ``COPY ... TO STDOUT`` and writes it in the same Python process (the rows never
cross the JVM): when every column's type allows it, the source server renders the records
itself and the task passes its JSON on untouched (``snapshot.read_records``). With a JDBC
driver jar, Spark reads each range through JDBC and ``mapInArrow`` writes it. Either way the
records are those of capture's converters and ids (``core``), and are written through
``SnapshotWriter``: a records batch per chunk, with the version guard. Every row carries the
version taken by ``snapshot_point`` before any read, so a live change committed after it
always wins, and a retried task writes nothing twice (same version: not newer).

The driver and the executors need the ``weir`` package (``core``, ``spark``) importable: local
mode has it; on a cluster, install it on the workers or ship it with ``--py-files``. The Spark
session (Java, a local master on loopback) is made by spark/session.py.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from psycopg import sql

from core.progress import Progress
from core.sources.pg import snapshot
from core.sources.pg.encoding import learning
from core.sources.pg.values import SESSION_OPTIONS
from core.store import Store
from core.store.backfills import Backfills
from core.store.snapshot_writer import SnapshotWriter
from spark.session import SeedError, spark_session

if TYPE_CHECKING:  # a seed task imports no config models (pydantic): ~0.2 s a worker
    from core.config.model import WeirConfig
    from core.config.sources import PostgresSource

log = logging.getLogger("weir.seed")

MERGE_ROWS = 20_000  # rows of a records batch (one hold of the source's lock)
ROWS_PER_PARTITION = 100_000  # default partition size


@dataclass
class SeedResult:
    table: str
    rows: int  # rows read
    written: int  # the others were older than a live change already in the stream
    partitions: int
    seconds: float


@dataclass(frozen=True)
class _Target:
    """What a task needs to write into the store; pickled into every task (never logged)."""

    store_url: str
    store_schema: str
    sync_id: uuid.UUID
    version: int
    at: datetime
    plans: list[snapshot.TablePlan]


def _write(
    target: _Target, parts: Iterable[tuple[int, Iterable[tuple[str, bytes]]]]
) -> Iterator[tuple[int, int, int]]:
    """Records of tables (``(table index, snapshot.records_of lines)``) into the records
    stream, a records batch every ``MERGE_ROWS``; yields (table index, rows, rows written)
    per part."""
    # PySpark's worker runs gc.collect() after every task, and each walked all the objects of
    # the worker's imports: ~40 ms a task. Frozen, they are not walked again.
    gc.freeze()
    store = Store(target.store_url, target.store_schema)
    with store.connect() as conn:
        w = SnapshotWriter(conn, store, target.sync_id, target.version, target.at)
        for t, rows in parts:
            collection_id = target.plans[t].rel.collection_id
            it = iter(rows)
            n = accepted = 0
            while True:
                staged, written = w.write(collection_id, islice(it, MERGE_ROWS))
                if not staged:
                    break
                conn.commit()
                n += staged
                accepted += written
            yield t, n, accepted


def _texts(url: str, target: _Target) -> Any:
    """While a task's connection streams a COPY, the text of a database not in UTF-8 learns
    its characters through another (core/sources/pg/encoding.py)."""
    return learning((p.rel.text for p in target.plans),
                    lambda: snapshot.connect(url, "weir-seed-text"))  # fmt: skip


def _read_and_write(
    url: str, target: _Target, ranges: Iterable[tuple[int, Any, Any]]
) -> Iterator[tuple[int, int, int]]:
    """A task of the jar-less path: its key ranges read by COPY and written, in one process."""
    with snapshot.connect(url) as conn, _texts(url, target):
        yield from _write(
            target,
            ((t, snapshot.read_records(conn, target.plans[t], lo, hi)) for t, lo, hi in ranges),
        )  # fmt: skip


def _write_arrow(url: str, target: _Target, batches: Iterator[Any]) -> Iterator[Any]:
    """A task of the JDBC path (``mapInArrow``): batches of ``t`` and text columns written."""
    import pyarrow as pa

    def parts() -> Iterator[tuple[int, Iterable[tuple[str, bytes]]]]:
        for b in batches:
            if b.num_rows:
                t = b.column(0)[0].as_py()  # a partition is one key range of one table
                rel = target.plans[t].rel
                cols = b.columns[1 : 1 + len(rel.names)]
                yield t, snapshot.records_of(rel, zip(*[c.to_pylist() for c in cols], strict=True))

    schema = pa.schema([("t", pa.int32()), ("rows", pa.int64()), ("written", pa.int64())])
    with _texts(url, target):
        for t, n, accepted in _write(target, parts()):
            yield pa.RecordBatch.from_pydict({"t": [t], "rows": [n], "written": [accepted]},
                                             schema)  # fmt: skip


def _jdbc_frame(
    spark: Any, url: str, plans: list[snapshot.TablePlan], ranges: list[Any], conn: Any
) -> Any:
    """``weir_pg``'s shape read through JDBC: per table, its columns' text as the database
    holds it (the bytes capture reads, core/sources/pg/encoding.py) with one partition per key
    range; the tables' frames in one union."""
    from pyspark.sql import functions as F

    parts = urlsplit(url)
    db = parts.path.lstrip("/") or "postgres"
    jdbc_url = f"jdbc:postgresql://{parts.hostname or 'localhost'}:{parts.port or 5432}/{db}"
    props = {
        "driver": "org.postgresql.Driver",
        "user": unquote(parts.username or ""),
        "password": unquote(parts.password or ""),
        "options": SESSION_OPTIONS,
    }
    width = max(len(p.rel.names) for p in plans)
    frames = []
    for t, plan in enumerate(plans):
        held = sql.Literal(plan.rel.text.encoding).as_string(conn)
        text = ", ".join(
            f"convert_to({sql.Identifier(n).as_string(conn)}::text, {held}) AS weir_c{i}"
            for i, n in enumerate(plan.rel.names)
        )
        name = sql.Identifier(plan.rel.schema, plan.rel.table).as_string(conn)
        table = f"(SELECT {text}, * FROM {name}) s"
        predicates = [plan.range_where(lo, hi).as_string(conn) for i, lo, hi in ranges if i == t]
        frame = spark.read.jdbc(jdbc_url, table, predicates=predicates, properties=props)
        cols = [F.lit(t).cast("int").alias("t")]
        for i in range(width):
            c = f"weir_c{i}"
            cols.append(F.col(c).alias(f"c{i}") if i < len(plan.rel.names)
                        else F.lit(None).cast("binary").alias(f"c{i}"))  # fmt: skip
        frames.append(frame.select(*cols))
    out = frames[0]
    for f in frames[1:]:
        out = out.union(f)
    return out


def run_seed(
    cfg: WeirConfig,
    src: PostgresSource,
    tables: list[str],
    *,
    master: str | None = None,
    jdbc_jar: str | None = None,
    partitions: int | None = None,
) -> list[SeedResult]:
    """Seed ``tables`` of ``source`` in one Spark job; returns a summary per table."""
    from core.store import open_store

    store = open_store(cfg)
    url = src.url.get_secret_value()
    with snapshot.connect(url) as conn:
        # Its tables first: one it cannot read is said once, as the seed's error, not warned of
        plans = [snapshot.table_plan(conn, src, t) for t in tables]
        snapshot.ensure_capture(conn, src, store, say=True)
        counts: list[int] = []
        ranges: list[tuple[int, Any, Any]] = []
        for t, plan in enumerate(plans):
            total = snapshot.count_rows(conn, plan)
            parts = partitions or max(2, -(-total // ROWS_PER_PARTITION))
            table_ranges = snapshot.key_ranges(conn, plan, total, parts)
            counts.append(total)
            ranges += [(t, lo, hi) for lo, hi in table_ranges]
        point = snapshot.snapshot_point(conn, lambda m: log.info("seed: %s", m))
        log.info("seed: snapshot version %d, %d partitions; starting Spark", point.version,
                 len(ranges))  # fmt: skip
        spark = spark_session(master, jdbc_jar)
        target = _Target(store.url, store.schema, src.sync_id, point.version, point.at, plans)
        done = threading.Event()
        watcher = threading.Thread(target=_report, args=(spark, sum(counts), done))
        try:
            started = time.monotonic()
            watcher.start()
            if jdbc_jar:
                frame = _jdbc_frame(spark, url, plans, ranges, conn)
                written = [
                    (r.t, r.rows, r.written)
                    for r in frame.mapInArrow(
                        partial(_write_arrow, url, target), "t int, rows long, written long"
                    ).collect()
                ]
            else:
                written = (
                    spark.sparkContext.parallelize(ranges, len(ranges))
                    .mapPartitions(partial(_read_and_write, url, target))
                    .collect()
                )
            seconds = time.monotonic() - started
        finally:
            done.set()
            if watcher.is_alive():
                watcher.join()
            spark.stop()
    # The columns the records were made with: an ALTER before the table's next change then
    # backfills it, as after a backfill (core/store/collections.py set_shape).
    with store.connect() as store_conn:
        backfills = Backfills(store, src.sync_id)
        for plan in plans:
            rel = plan.rel
            key = [rel.names[i] for i in rel.key]
            backfills.made_with(store_conn, rel.collection_id, key, rel.relid, rel.shape)
        store_conn.commit()
    return [
        SeedResult(
            plan.name,
            sum(n for i, n, _ in written if i == t),
            sum(a for i, _, a in written if i == t),
            sum(1 for r in ranges if r[0] == t),
            seconds,
        )
        for t, plan in enumerate(plans)
    ]


def _report(spark: Any, total_rows: int, done: threading.Event) -> None:
    """Progress from Spark's tracker: finished partitions, and the rows they stand for."""
    tracker = spark.sparkContext.statusTracker()
    with Progress("seed", total_rows, every=5.0) as progress:
        while not done.wait(0.5):
            tasks = finished = 0
            for job in tracker.getActiveJobsIds():
                info = tracker.getJobInfo(job)
                for stage in info.stageIds if info else []:
                    s = tracker.getStageInfo(stage)
                    if s:
                        tasks += s.numTasks
                        finished += s.numCompletedTasks
            if tasks:
                progress.update(total_rows * finished // tasks)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from core.commands import table_arg

    p.add_argument("--config", help="the config file (default: $WEIR_CONFIG)")
    p.add_argument("--source", required=True, help="a postgres source of the config")
    p.add_argument("--table", action="append", required=True, type=table_arg,
                   help='schema.table, "quoted" names allowed (repeatable)')  # fmt: skip
    p.add_argument("--master", help="Spark master URL (default: spark-submit's, else local[*])")
    p.add_argument("--jdbc-jar", help="read through JDBC with this PostgreSQL driver jar")
    p.add_argument(
        "--partitions", type=int, help=f"partitions per table (default: one per "
        f"{ROWS_PER_PARTITION:,} rows)"
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """``spark-submit spark/seed.py``: the arguments of ``weir seed``."""
    from core.commands import load_or_exit
    from core.config.settings import WeirSettings
    from core.failures import bound_postgres_connects
    from core.logs import setup_logging

    parser = argparse.ArgumentParser(prog="weir seed", description=__doc__.split("\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    config = args.config or WeirSettings().config
    if config is None:
        parser.error("give --config FILE (or set WEIR_CONFIG)")
    setup_logging("info")
    bound_postgres_connects()
    return seed_command(args, load_or_exit(str(config)))


def seed_command(args: argparse.Namespace, cfg: WeirConfig) -> int:
    """Run the job as asked on the command line; print one summary line per table."""
    from core.commands import postgres_source_or_exit, source_problems
    from core.failures import Unreachable, reach_postgres
    from core.redact import first_line

    src = postgres_source_or_exit(cfg, args.source)
    problems: tuple[type[Exception], ...] = (SeedError, Unreachable, *source_problems())
    try:
        reach_postgres(src.url.get_secret_value(), f"source {src.name}")
        reach_postgres(cfg.store_url, "the store")
        results = run_seed(
            cfg, src, args.table, master=args.master, jdbc_jar=args.jdbc_jar,
            partitions=args.partitions,
        )  # fmt: skip
    except problems as e:
        print(f"weir seed: {first_line(e)}", file=sys.stderr)
        return 1
    for r in results:
        print(
            f"{r.table}: {r.rows:,} rows read in {r.partitions} partitions, {r.written:,} "
            f"written ({r.rows - r.written:,} were older than a live change), {r.seconds:.1f}s, "
            f"{r.rows / max(r.seconds, 1e-9):,.0f} rows/s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
