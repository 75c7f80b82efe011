"""Weir's memory with a backlog of 1M changes: the peak memory of `weir run`, its supervisor and
worker processes together (docs/design.md “Performance”: under 300 MB), while it captures the
backlog and forwards it, with the settings a user gets by default.

Together means each page once: the processes' PSS summed (a page shared by N of them counts 1/N
in each), which is what the kernel holds for them and what systemd's ``Memory:`` of the unit
shows. Their VmRSS summed is printed beside it: it counts the ~20 MB of shared libraries that
each process maps once per process.

The backlog is in the WAL before Weir starts (the slot is made first): half of it one
transaction of 500k rows, half 500 transactions of 1,000. `weir run` then captures it into the
store and forwards both streams to NATS JetStream (an events and a records connector, 1M
messages each), while an HTTP pull consumer of the events stream that no worker reads fills its
queue. The run ends when both JetStream streams hold 1M messages; the RSS of the process tree
(VmRSS of each process, summed) is sampled every 0.2 s, and its peak is the largest sample.

    .venv/bin/python bench/memory.py [--changes 1000000]

Prints one JSON line and appends it to bench/results/memory.jsonl.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import nats
import psycopg
from common import new_db, record

from core.config.model import WeirConfig
from core.runtime.service import prepare
from devkit import procs
from devkit.embedded import EmbeddedNats, EmbeddedPostgres
from devkit.server import free_port

TARGET_MB = 300
STREAMS = {"MEM_EVENTS": "sequin-events.mem.>", "MEM_RECORDS": "sequin-records.mem.>"}


async def make_streams(url: str) -> None:
    nc = await nats.connect(url)
    for name, subject in STREAMS.items():
        await nc.jetstream().add_stream(name=name, subjects=[subject])
    await nc.close()


async def counts(url: str) -> list[int]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        return [int((await js.stream_info(name)).state.messages) for name in STREAMS]
    finally:
        await nc.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--changes", type=int, default=1_000_000)
    args = parser.parse_args()
    n = args.changes
    half = n // 2
    workdir = Path(tempfile.mkdtemp(prefix="weir-bench-"))
    with EmbeddedPostgres(settings={"max_wal_size": "4GB"}) as pg, EmbeddedNats() as ns:
        url = new_db(pg, "mem")
        nats_cfg = {"url": ns.url, "namespace": "mem"}
        spec = {
            "api": {"listen": f"127.0.0.1:{free_port()}", "tokens": ["bench-memory-token-0123"]},
            "sources": [{"name": "mem", "kind": "postgres", "url": url,
                         "tables": ["public.bench"]}],
            "connectors": [
                {"name": "mem-events", "type": "nats", "stream": "events", "nats": nats_cfg},
                {"name": "mem-records", "type": "nats", "stream": "records", "nats": nats_cfg},
            ],
            "consumers": [{"name": "idle", "stream": "events"}],
        }  # fmt: skip
        prepare(WeirConfig.model_validate(spec))  # the slot exists before the rows go in
        asyncio.run(make_streams(ns.url))
        insert = (
            "INSERT INTO bench SELECT g, g, 'name-' || g"
            " FROM generate_series(%s::bigint, %s::bigint) g"
        )
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(insert, (1, half))
            for first in range(half + 1, n + 1, 1000):
                conn.execute(insert, (first, min(first + 999, n)))
        config = workdir / "weir.yaml"
        config.write_text(json.dumps(spec))
        log = open(workdir / "weir.log", "ab")  # noqa: SIM115 - lives as long as the process
        start = time.perf_counter()
        weir = subprocess.Popen(
            [sys.executable, "-m", "core.cli", "run", "--config", str(config)],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        samples: list[float] = []
        pss: list[float] = []
        peaks: dict[str, float] = {}  # the largest RSS each process had, by its name
        try:
            deadline = time.monotonic() + 900
            next_count = time.monotonic()
            done = [0, 0]
            while time.monotonic() < deadline and weir.poll() is None:
                rss = {procs.name(p): procs.rss_mb(p) for p in procs.tree(weir.pid)}
                samples.append(sum(rss.values()))
                pss.append(sum(map(procs.pss_mb, procs.tree(weir.pid))))
                for who, mb in rss.items():
                    peaks[who] = max(mb, peaks.get(who, 0.0))
                if time.monotonic() >= next_count:
                    done = asyncio.run(counts(ns.url))
                    if min(done) >= n:
                        break
                    next_count = time.monotonic() + 1
                time.sleep(0.2)
            elapsed = time.perf_counter() - start
            peak = max(samples)
            end = sum(map(procs.rss_mb, procs.tree(weir.pid)))
        finally:
            weir.terminate()
            weir.wait(60)
    if min(done) < n:
        sys.exit(f"weir forwarded {done} of {n} messages per stream; nothing recorded "
                 f"(its log: {workdir / 'weir.log'})")  # fmt: skip
    result = {
        "bench": "memory",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "changes": n,
        "messages_forwarded": sum(done),
        "seconds": round(elapsed, 1),
        "peak_rss_mb": round(peak),
        "rss_at_end_mb": round(end),
        "rss_p50_mb": round(sorted(samples)[len(samples) // 2]),
        "rss_of": "the process tree (supervisor and workers), VmRSS summed",
        "peak_rss_mb_by_process": {who: round(mb) for who, mb in sorted(peaks.items())},
        "peak_pss_mb": round(max(pss)),
        "target_peak_pss_mb": TARGET_MB,
    }
    record(result)


if __name__ == "__main__":
    main()
