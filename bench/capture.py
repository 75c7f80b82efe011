"""Capture throughput: changes/s from the replication slot into the store, for 200k single-row
transactions already in the WAL (a backlog), next to the raw replication read rate (messages
received and counted, nothing decoded or stored) measured on the same server in the same run.

    .venv/bin/python bench/capture.py [--changes 200000] [--profile]

BENCH_SOURCE='{"max_batch": 20000}' overrides source settings (JSON). Prints one JSON line and
appends it to bench/results/capture.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import selectors
import threading
import time
from datetime import UTC, datetime

import psycopg
from common import record, single_row_backlog

from core.config.sources import PostgresSource
from core.sources.pg.capture import PostgresCapture
from core.sources.pg.pgoutput import XLOG_HEADER, start_replication
from core.sources.pg.values import SESSION_OPTIONS
from core.store import Store
from devkit.embedded import EmbeddedPostgres


def make_backlog(url: str, n: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE bench (id int PRIMARY KEY, v int NOT NULL, name text)")
        conn.execute("CREATE PUBLICATION weir_pub FOR TABLE bench")
        for slot in ("raw_slot", "weir_slot"):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        single_row_backlog(conn, n)


def raw_read(url: str, n: int) -> float:
    """Seconds to receive n transactions' messages from the slot without decoding them."""
    conn = psycopg.connect(url, autocommit=True, replication="database", options=SESSION_OPTIONS)
    pgconn = conn.pgconn
    pgconn.send_query(start_replication("raw_slot", "weir_pub", 0))  # the command capture sends
    pgconn.get_result()

    sel = selectors.DefaultSelector()
    sel.register(pgconn.socket, selectors.EVENT_READ)
    commits = 0
    start = time.perf_counter()
    while commits < n:
        nbytes, data = pgconn.get_copy_data(1)
        if nbytes > 0:
            if data[0] == 119 and data[XLOG_HEADER] == 67:  # XLogData carrying a Commit
                commits += 1
        elif nbytes == 0:
            sel.select(1.0)
            pgconn.consume_input()
        else:
            raise RuntimeError("stream ended")
    elapsed = time.perf_counter() - start
    conn.close()
    return elapsed


def weir_capture(url: str, n: int, profile: bool) -> tuple[float, float]:
    """Seconds until the n changes are in the store, and this process's CPU seconds (capture
    and its store thread) over that time."""
    src = PostgresSource.model_validate(
        {"name": "bench", "kind": "postgres", "url": url, "tables": ["public.bench"]}
        | json.loads(os.environ.get("BENCH_SOURCE", "{}"))
    )
    store = Store(url)
    store.prepare([src])
    store.slot_made(src.sync_id, src.slot)  # make_backlog made it for this store
    capture = PostgresCapture(src, store)
    stop = threading.Event()
    profiler = None
    if profile:
        from pyinstrument import Profiler

        profiler = Profiler(async_mode="disabled")
    done_at: list[float] = []

    def watch() -> None:  # the capture runs on the main thread, where the profiler looks
        while capture.stored_changes < n and not stop.is_set():
            time.sleep(0.005)
        done_at.append(time.perf_counter())
        stop.set()

    watcher = threading.Thread(target=watch)
    cpu = time.process_time()
    start = time.perf_counter()
    watcher.start()
    if profiler:
        profiler.start()
    try:
        capture.run(stop)
    finally:
        stop.set()  # the watcher too, when capture failed
    if profiler:
        profiler.stop()
        print(profiler.output_text(unicode=False, color=False, show_all=False))
    watcher.join()
    cpu = time.process_time() - cpu
    if capture.stored_changes < n:
        raise RuntimeError(f"capture stopped after {capture.stored_changes} changes")
    return done_at[0] - start, cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--profile", action="store_true", help="pyinstrument profile of capture")
    args = parser.parse_args()
    n = args.changes
    with EmbeddedPostgres() as pg:
        t0 = time.perf_counter()
        make_backlog(pg.url, n)
        load_s = time.perf_counter() - t0
        raw_s = raw_read(pg.url, n)
        weir_s, weir_cpu = weir_capture(pg.url, n, args.profile)
    result = {
        "bench": "capture",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "changes": n,
        "load_s": round(load_s, 2),
        "raw_read_per_s": round(n / raw_s),
        "capture_per_s": round(n / weir_s),
        "ratio_vs_raw": round(raw_s / weir_s, 3),
        "weir_cpu_us_per_change": round(weir_cpu / n * 1e6, 1),  # capture + store thread
        "target_ratio": 0.5,
        "profiled": args.profile,  # py-spy slows Weir: not a rate to quote
    }
    record(result)


if __name__ == "__main__":
    main()
