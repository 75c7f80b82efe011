"""Spark seed throughput: records/s into the records stream for a table of 2M rows on
``local[2]``, next to a single-process psycopg COPY loader (the same reading, conversion and
store writes as the job, in one process, no Spark) on the same server in the same run.

    .venv/bin/python bench/seed.py [--rows 2000000] [--partitions N] [--profile]

Each loads its own copy of the table into its own store. The job's time is from the start of
the Spark job to its end (the JVM's start is reported apart, as ``spark_start_s``). Prints one
JSON line and appends it to bench/results/seed.jsonl; ``--profile`` samples the Spark Python
workers with py-spy into bench/results/seed-profile.txt.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).parent))

from common import RESULTS, new_db, py_spy, record, summarize

from core.config.model import WeirConfig
from core.sources.pg import snapshot
from core.store import open_store
from devkit.embedded import EmbeddedPostgres

TABLE = "public.items"


def make_table(server: EmbeddedPostgres, name: str, rows: int) -> WeirConfig:
    url = new_db(server, name, "CREATE TABLE items (id bigint PRIMARY KEY, v int NOT NULL,"
                 " name text, at timestamptz, doc jsonb)")  # fmt: skip
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO items SELECT i, i %% 1000, 'name-' || i, timestamptz '2026-11-22'"
            " + i * interval '1 second', jsonb_build_object('n', i, 'tag', 'x')"
            " FROM generate_series(1, %s) i",
            (rows,),
        )
        conn.execute("VACUUM ANALYZE items")
    spec = {
        "name": "app",
        "kind": "postgres",
        "url": url,
        "tables": [TABLE],
        "slot": f"{name}_slot",
    }
    return WeirConfig.model_validate({"sources": [spec], "connectors": []})


def copy_loader(cfg: WeirConfig, n: int) -> float:
    """The baseline: the seed job's own read-and-write of one task, run for the whole table in
    one process (one COPY, the same conversion and store writes), without Spark. Seconds."""
    from spark.seed import _read_and_write, _Target

    src = cfg.postgres_source("app")
    store = open_store(cfg)
    url = src.url.get_secret_value()
    with snapshot.connect(url) as conn:
        snapshot.ensure_capture(conn, src)
        plan = snapshot.table_plan(conn, src, TABLE)
        point = snapshot.snapshot_point(conn, print)
    target = _Target(store.url, store.schema, src.sync_id, point.version, point.at, [plan])
    start = time.perf_counter()
    [(_, rows, _)] = _read_and_write(url, target, [(0, None, None)])
    assert rows == n, f"{rows} of {n} rows read"
    return time.perf_counter() - start


def checkpoint(server: EmbeddedPostgres) -> None:
    """Write out what the steps so far left dirty, so that neither run pays for another's
    writes (the tables' load before the loader, the loader's 2M records before the job)."""
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")


def drop(server: EmbeddedPostgres, name: str) -> None:
    """Remove a measured run's database and slot: the next run pays neither for the autovacuum
    of its 2M new records nor for the WAL its slot holds (64.6k against 81-83k records/s)."""
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute("SELECT pg_drop_replication_slot(%s)", (f"{name}_slot",))
        conn.execute(f"DROP DATABASE {name} WITH (FORCE)")


def main() -> None:
    from spark.seed import run_seed
    from spark.session import spark_session

    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--partitions", type=int)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    n = args.rows
    with EmbeddedPostgres() as pg:
        base_cfg = make_table(pg, "base", n)
        seed_cfg = make_table(pg, "seed", n)
        checkpoint(pg)
        loader_s = copy_loader(base_cfg, n)
        drop(pg, "base")
        checkpoint(pg)
        t0 = time.perf_counter()
        spark_session("local[2]", None)  # the JVM starts here; run_seed reuses the session
        start_s = time.perf_counter() - t0
        spy = None
        if args.profile:
            profile = RESULTS / "seed-profile.raw"
            spy = py_spy(os.getpid(), 30, profile, subprocesses=True)
        [result] = run_seed(seed_cfg, seed_cfg.postgres_source("app"), [TABLE], master="local[2]",
                            partitions=args.partitions)  # fmt: skip
        if spy is not None:
            spy.wait()
            text = summarize(profile, "the driver and Spark's Python workers", 30)
            (RESULTS / "seed-profile.txt").write_text(text)
            profile.unlink()
            print(text)
        assert result.written == n, f"{result.written} of {n} records written"
    out = {
        "bench": "seed",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "rows": n,
        "partitions": result.partitions,
        "spark_start_s": round(start_s, 1),
        "seed_s": round(result.seconds, 1),
        "seed_per_s": round(n / result.seconds),
        "copy_loader_per_s": round(n / loader_s),
        "ratio_vs_loader": round(loader_s / result.seconds, 3),
        "target_per_s": 100_000,
        "profiled": args.profile,  # py-spy slows the workers: not a rate to quote
    }
    record(out)


if __name__ == "__main__":
    main()
