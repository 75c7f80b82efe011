"""How long the records stream's index takes to rebuild after Postgres emptied it (a crash).

The index (``weir.record_index``) is an unlogged table, so Postgres empties it after a crash and
Weir rebuilds it from the batches before the records stream is read or written again
(core/store/index.py); capture and the records connectors wait for it meanwhile. This bench
captures ``--records`` distinct records (inserts of 10,000 rows a transaction) into a store on
an embedded Postgres, empties the index as a crash does, and times the rebuild, ``--rounds``
times.

    .venv/bin/python bench/rebuild.py [--records 1000000] [--rounds 3]

Prints one JSON line and appends it to bench/results/rebuild.jsonl.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime

import psycopg
from common import insert_rows, new_db, record, run_for

from core.config.model import WeirConfig
from core.runtime.service import prepare
from core.store import Store, index
from devkit.embedded import EmbeddedPostgres


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    n = args.records
    with EmbeddedPostgres() as pg:
        url = new_db(pg, "rebuild")
        source = {"name": "app", "kind": "postgres", "url": url, "tables": ["public.bench"]}
        cfg = WeirConfig.model_validate({"sources": [source]})
        prepare(cfg)
        with psycopg.connect(url, autocommit=True) as conn:
            insert_rows(conn, n)
            head = "SELECT records_seq FROM weir.sources"
            rate = run_for(cfg, lambda: conn.execute(head).fetchone()[0], n)  # type: ignore[index]
        store = Store(url)
        seconds = []
        with store.connect() as conn:
            for _ in range(args.rounds):
                conn.execute("TRUNCATE weir.record_index, weir.record_index_state")
                conn.commit()
                t0 = time.perf_counter()
                index.ensure(conn, store)
                seconds.append(time.perf_counter() - t0)
            indexed = conn.execute("SELECT count(*) FROM weir.record_index").fetchone()
        assert indexed is not None and indexed[0] == n, indexed
    record({
        "bench": "rebuild",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
        "records": n,
        "capture_per_s": round(rate),
        "rebuild_s": [round(s, 2) for s in seconds],
        "rebuild_median_s": round(statistics.median(seconds), 2),
        "records_per_s": round(n / statistics.median(seconds)),
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
