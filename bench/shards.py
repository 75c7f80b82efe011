"""A sharded connector against one shard: 2 shards on 2 connectors workers against 1 on 1,
draining the same backlog of the events stream to JetStream (docs/design.md “Performance”: at least
1.7 times, where the broker is not the limit).

The backlog (``--rows`` inserts) is captured into the store first, so that capture is idle
while the connectors drain it. Each round runs both variants on a new connector (from the
beginning of the stream) into a new JetStream stream, in alternating order; the rate is from
the first message to the last in the stream, and the CPU time of every process over that
window (each weir worker, Postgres, nats-server) is reported in µs per message: on a 2-core
machine that holds Postgres and the broker too, the sum says how far two shards can go, and
``busiest_process_ratio`` what they give where each worker has a core of its own (the busiest
connectors worker's CPU per message, one shard against two).

    .venv/bin/python bench/shards.py [--rows 200000] [--rounds 2]

Prints one JSON line and appends it to bench/results/shards.jsonl.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from common import make_stream, new_db, record, stream_count

from devkit import procs
from devkit.embedded import EmbeddedNats, EmbeddedPostgres


def weir(config: dict[str, Any], workdir: Path, name: str) -> subprocess.Popen[bytes]:
    path = workdir / f"{name}.yaml"
    path.write_text(json.dumps(config))
    log = open(workdir / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen([sys.executable, "-m", "core.cli", "run", "--config", str(path)],
                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip


def cpu(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds used so far by each named process tree (weir's by worker)."""
    out: dict[str, float] = {}
    for who, pid in pids.items():
        for p in procs.tree(pid):
            name = procs.name(p) if who == "weir" else who
            out[name] = out.get(name, 0.0) + procs.cpu_seconds(p)
    return out


def drain(source: dict[str, Any], ns: EmbeddedNats, shards: int, rows: int, workdir: Path,
          servers: dict[str, int], tag: str) -> dict[str, Any]:  # fmt: skip
    """Forward the backlog with ``shards`` shards on as many workers; rate and CPU."""
    name = f"s{shards}{tag}"
    asyncio.run(make_stream(ns.url, name.upper(), f"sequin-events.{name}.>"))
    config = {"sources": [source], "workers": {"connectors": shards},
              "connectors": [{"name": name, "type": "nats", "stream": "events", "shards": shards,
                              "nats": {"url": ns.url, "namespace": name}}]}  # fmt: skip
    proc = weir(config, workdir, name)
    try:
        deadline = time.monotonic() + 600
        while (first := asyncio.run(stream_count(ns.url, name.upper()))) == 0:
            assert time.monotonic() < deadline and proc.poll() is None, "weir did not start"
            time.sleep(0.05)
        t0, before = time.perf_counter(), cpu({"weir": proc.pid, **servers})
        while (last := asyncio.run(stream_count(ns.url, name.upper()))) < rows:
            assert time.monotonic() < deadline and proc.poll() is None, f"{last} of {rows}"
            time.sleep(0.1)
        seconds = time.perf_counter() - t0
        used = cpu({"weir": proc.pid, **servers})
    finally:
        proc.terminate()
        proc.wait(60)
    n = last - first
    us = {k: round(1e6 * (v - before.get(k, 0.0)) / n, 1) for k, v in used.items()}
    return {"per_s": round(n / seconds), "cpu_us_per_message": us}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="weir-bench-"))
    with EmbeddedPostgres(settings={"max_wal_size": "4GB"}) as pg, EmbeddedNats() as ns:
        assert pg.proc is not None and ns.proc is not None
        url = new_db(pg, "shards")
        source = {"name": "shards", "kind": "postgres", "url": url, "tables": ["public.bench"],
                  "max_batch": 20000}  # fmt: skip
        capture = weir({"sources": [source]}, workdir, "capture")
        with psycopg.connect(url, autocommit=True) as conn:
            time.sleep(3)  # the slot exists
            for first in range(1, args.rows + 1, 5000):
                conn.execute("INSERT INTO bench SELECT g, g, 'name-' || g FROM "
                             "generate_series(%s::bigint, %s::bigint) g",
                             (first, min(first + 4999, args.rows)))  # fmt: skip
            deadline = time.monotonic() + 600
            while conn.execute("SELECT events_seq FROM weir.sources").fetchone() != (args.rows,):
                assert time.monotonic() < deadline, "capture did not finish"
                time.sleep(0.2)
        capture.terminate()
        capture.wait(60)
        servers = {"postgres": pg.proc.pid, "nats-server": ns.proc.pid}
        runs: dict[int, list[dict[str, Any]]] = {1: [], 2: []}
        for r in range(args.rounds):
            for shards in (1, 2) if r % 2 == 0 else (2, 1):
                runs[shards].append(drain(source, ns, shards, args.rows, workdir, servers,
                                          f"r{r}"))  # fmt: skip
    ratios = [b["per_s"] / a["per_s"] for a, b in zip(runs[1], runs[2], strict=True)]
    # What the busiest weir process allows, each on a core of its own: the ratio the design
    # gives where neither the broker nor the machine's cores are the limit.
    busiest = [max(us for who, us in run["cpu_us_per_message"].items() if who.startswith("conn"))
               for run in runs[1] + runs[2]]  # fmt: skip
    bound = [one / two for one, two in zip(busiest[: len(runs[1])], busiest[len(runs[1]) :],
                                            strict=True)]  # fmt: skip
    result = {
        "bench": "shards",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "messages": args.rows,
        "one_shard": runs[1],
        "two_shards": runs[2],
        "ratio_two_to_one": [round(x, 2) for x in ratios],
        "ratio_median": round(statistics.median(ratios), 2),
        "busiest_process_ratio": [round(x, 2) for x in bound],
        "target_ratio": 1.7,
    }
    record(result)


if __name__ == "__main__":
    main()
