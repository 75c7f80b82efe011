"""What a backfill of unchanged rows costs when their history is spread (docs/operations.md
“Backfill and seed”): a row equal to its record is no new version, so the backfill reads the
store batches holding each page's records to compare.

A table of ``--rows`` rows is inserted (10,000 a transaction), then each row is updated once in
a transaction of its own, in a scattered order, while ``weir run`` captures: as an OLTP table's
history, each store batch then holds ~100 changes of records far apart. ``ALTER COLUMN v TYPE
bigint`` (the same values) makes capture ask for a backfill of the table. Measured: the
backfill's time and rows/s (from the store's ``backfills`` row), the records it wrote again
(a new seq), and the CPU of the whole process over the backfill.

    .venv/bin/python bench/backfill_compare.py [--rows 50000]

Prints one JSON line and appends it to bench/results/backfill_compare.jsonl.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
import time
from datetime import UTC, datetime

import psycopg
from common import insert_rows, new_db, record, run_for

from core.config.model import WeirConfig
from core.runtime.service import prepare, serve
from devkit.embedded import EmbeddedPostgres

SEQS = "SELECT record_id, seq FROM weir.record_index WHERE collection_id = 'public:bench'"
DONE = (
    "SELECT EXTRACT(EPOCH FROM finished_at - started_at), rows_read, rows_written"
    " FROM weir.backfills WHERE collection_id = 'public:bench' AND finished_at IS NOT NULL"
)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=50_000)
    args = ap.parse_args()
    n = args.rows
    with EmbeddedPostgres() as pg:
        url = new_db(pg, "spread")
        source = {"name": "app", "kind": "postgres", "url": url, "tables": ["public.bench"]}
        cfg = WeirConfig.model_validate({"sources": [source]})
        prepare(cfg)
        with psycopg.connect(url, autocommit=True) as conn:
            insert_rows(conn, n)
            conn.execute(
                "CREATE PROCEDURE touch(n int) LANGUAGE plpgsql AS $$ BEGIN FOR i IN 1..n LOOP "
                "UPDATE bench SET name = name || 'x' WHERE id = (i::bigint * 7919) % n + 1; "
                "COMMIT; END LOOP; END $$"
            )
            conn.execute("CALL touch(%s)", (n,))
            head = "SELECT events_seq FROM weir.sources"
            run_for(cfg, lambda: conn.execute(head).fetchone()[0], 2 * n)  # type: ignore[index]
            batches = conn.execute("SELECT count(DISTINCT batch) FROM weir.record_index").fetchone()
            before: dict[str, int] = dict(conn.execute(SEQS).fetchall())  # type: ignore[arg-type]
            stop = threading.Event()
            thread = threading.Thread(target=serve, args=(cfg, stop), daemon=True)
            cpu0 = time.process_time()
            thread.start()
            conn.execute("ALTER TABLE bench ALTER COLUMN v TYPE bigint")
            deadline = time.monotonic() + 900
            while (done := conn.execute(DONE).fetchone()) is None:
                if time.monotonic() > deadline:
                    raise TimeoutError("the backfill did not finish")
                time.sleep(0.1)
            stop.set()
            thread.join(120)
            cpu = time.process_time() - cpu0
            after: dict[str, int] = dict(conn.execute(SEQS).fetchall())  # type: ignore[arg-type]
    seconds, read, written = float(done[0]), int(done[1]), int(done[2])
    record({
        "bench": "backfill_compare",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "rows": n,
        "record_batches_holding_them": batches[0] if batches else None,
        "backfill_s": round(seconds, 2),
        "rows_per_s": round(read / seconds) if seconds else None,
        "rows_written": written,
        "records_sent_again": sum(before.get(k) != s for k, s in after.items()),
        "weir_cpu_s": round(cpu, 2),
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
