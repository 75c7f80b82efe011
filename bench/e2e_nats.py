"""End to end, Postgres commit → JetStream PubAck, with `weir run` as its own process.

Three measurements in one run, on one embedded Postgres and one nats-server:
1. ceiling: nats-py ``publish_async`` of same-sized messages with ``Nats-Msg-Id``, awaited acks;
2. sustained: a writer commits 500-row transactions as fast as Postgres takes them for the whole
   run, so a backlog forms; the rate is the growth of the JetStream stream over ``--seconds``
   (after a warm-up), i.e. what Weir sustains from commit to PubAck;
3. latency: a writer commits 50 rows every 10 ms (5,000 changes/s) and a NATS subscriber takes
   ``now - commit_timestamp`` of each message; p50/p99 in ms.

    .venv/bin/python bench/e2e_nats.py [--seconds 30] [--profile]

BENCH_STEPS=1: the connector filters and transforms each message (a small transform in place).

Prints one JSON line and appends it to bench/results/e2e_nats.jsonl; ``--profile`` also writes
bench/results/e2e_nats-profile.txt (py-spy, self time by function, of the weir process).
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
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import nats
import orjson
import psycopg
from common import RESULTS, make_stream, new_db, py_spy, record, stream_count, summarize

from devkit import procs
from devkit.embedded import EmbeddedNats, EmbeddedPostgres

PAYLOAD = 520  # bytes: about what one of the bench table's events weighs


async def ceiling(url: str, n: int) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream(publish_async_max_pending=4000)
    await js.add_stream(name="CEILING", subjects=["ceiling.>"])
    body = b"x" * PAYLOAD
    start = time.perf_counter()
    for i in range(n):
        await js.publish_async(f"ceiling.s.{i % 1000}", body, headers={"Nats-Msg-Id": str(i)})
    await js.publish_async_completed()
    rate = n / (time.perf_counter() - start)
    await nc.close()
    return rate


# BENCH_STEPS=1: the connector runs a small transform (docs/transforms.md) on each message.
STEPS = [{"filter": 'action != "delete"'}, {"transform": {"drop": ["name"]}}] \
    if os.environ.get("BENCH_STEPS") == "1" else []  # fmt: skip


def start_weir(pg_url: str, nats_url: str, workdir: Path, name: str) -> subprocess.Popen[bytes]:
    cfg = {
        "sources": [{"name": name, "kind": "postgres", "url": pg_url, "tables": ["public.bench"],
                     "slot": f"weir_{name}", "max_batch": 20000}],
        "connectors": [{"name": f"{name}-events", "type": "nats", "stream": "events",
                        "nats": {"url": nats_url, "namespace": name}, "steps": STEPS}],
    }  # fmt: skip
    config = workdir / f"{name}.yaml"
    config.write_text(json.dumps(cfg))
    log = open(workdir / f"{name}.log", "ab")  # noqa: SIM115 - lives as long as the process
    return subprocess.Popen(
        [sys.executable, "-m", "core.cli", "run", "--config", str(config)],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip


def writer(url: str, stop: threading.Event, rows_per_txn: int, every: float | None) -> None:
    """Bounded by ``stop`` (and a cap of 10M rows)."""
    with psycopg.connect(url, autocommit=True) as conn:
        next_id = 0
        tick = time.perf_counter()
        while not stop.is_set() and next_id < 10_000_000:
            conn.execute(
                "INSERT INTO bench SELECT g, g, 'name-' || g "
                "FROM generate_series(%s::bigint, %s::bigint) g",
                (next_id + 1, next_id + rows_per_txn),
            )
            next_id += rows_per_txn
            if every is not None:
                tick += every
                time.sleep(max(0.0, tick - time.perf_counter()))


def cpu_by_process(pid: int, servers: dict[str, int]) -> dict[str, float]:
    """CPU seconds used so far by `weir run` at ``pid`` and by each of its workers, by name,
    and by each server (all of its processes) of ``servers``."""
    used = {procs.name(p): procs.cpu_seconds(p) for p in procs.tree(pid)}
    for name, server in servers.items():
        used[name] = sum(map(procs.cpu_seconds, procs.tree(server)))
    return used


def sustained(pg: EmbeddedPostgres, ns: EmbeddedNats, seconds: float, workdir: Path,
              profile: bool) -> tuple[float, str | None, dict[str, float]]:  # fmt: skip
    """The rate, the profile's summary and the CPU each weir process, Postgres and
    nats-server used over the window, in µs per change."""
    assert pg.proc is not None and ns.proc is not None
    servers = {"postgres": pg.proc.pid, "nats-server": ns.proc.pid}
    url = new_db(pg, "thru")
    asyncio.run(make_stream(ns.url, "THRU", "sequin-events.thru.>"))
    weir = start_weir(url, ns.url, workdir, "thru")
    stop = threading.Event()
    time.sleep(3)  # slot and connector up
    load = threading.Thread(target=writer, args=(url, stop, 500, None))
    load.start()
    try:
        time.sleep(5)  # warm-up: a backlog forms
        first = asyncio.run(stream_count(ns.url, "THRU"))
        cpu = cpu_by_process(weir.pid, servers)
        t0 = time.perf_counter()
        spy = py_spy(weir.pid, seconds, workdir / "profile.txt") if profile else None
        time.sleep(seconds)
        last = asyncio.run(stream_count(ns.url, "THRU"))
        rate = (last - first) / (time.perf_counter() - t0)
        used = {k: v - cpu.get(k, 0.0) for k, v in cpu_by_process(weir.pid, servers).items()}
        us = {k: round(1e6 * v / max(1, last - first), 1) for k, v in used.items()}
        if spy is not None:
            spy.wait(60)
    finally:
        stop.set()
        load.join()
        weir.terminate()
        weir.wait(60)
    summary = summarize(workdir / "profile.txt") if profile else None
    return rate, summary, us


def latency(pg: EmbeddedPostgres, ns: EmbeddedNats, seconds: float, workdir: Path) -> list[float]:
    url = new_db(pg, "lat")
    asyncio.run(make_stream(ns.url, "LAT", "sequin-events.lat.>"))
    weir = start_weir(url, ns.url, workdir, "lat")
    samples: list[float] = []

    async def subscribe() -> None:
        nc = await nats.connect(ns.url)

        async def on_msg(msg: nats.aio.msg.Msg) -> None:
            ts = orjson.loads(msg.data)["metadata"]["commit_timestamp"]
            committed = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
            samples.append((time.time() - committed) * 1000)

        await nc.subscribe("sequin-events.lat.>", cb=on_msg)
        await nc.flush()
        time.sleep(3)  # slot and connector up (blocking on purpose: nothing arrives yet)
        stop = threading.Event()
        load = threading.Thread(target=writer, args=(url, stop, 50, 0.01))
        load.start()
        await asyncio.sleep(seconds)
        stop.set()
        load.join()
        await asyncio.sleep(2)
        await nc.close()

    try:
        asyncio.run(subscribe())
    finally:
        weir.terminate()
        weir.wait(60)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="weir-bench-"))
    with EmbeddedPostgres(settings={"max_wal_size": "4GB"}) as pg, EmbeddedNats() as ns:
        raw = asyncio.run(ceiling(ns.url, 200_000))
        rate, summary, cpu_us = sustained(pg, ns, args.seconds, workdir, args.profile)
        lat = sorted(latency(pg, ns, min(args.seconds, 20), workdir))
    p = (lambda q: round(lat[int(q * (len(lat) - 1))], 1)) if lat else (lambda q: None)
    result = {
        "bench": "e2e_nats",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "seconds": args.seconds,
        "nats_fast_batches": os.environ.get("BENCH_BATCHED", "1") != "0",
        "steps": STEPS,
        "ceiling_publish_async_per_s": round(raw),
        "e2e_changes_per_s": round(rate),
        "ratio_to_ceiling": round(rate / raw, 3),
        "cpu_us_per_change": cpu_us,  # the supervisor, each worker, postgres, nats-server
        "latency_at_5000_per_s_ms": {"p50": p(0.5), "p99": p(0.99), "samples": len(lat)},
        "targets": {"e2e_changes_per_s": 30000, "ratio_to_ceiling": 0.8, "p99_ms": 100},
        "profiled": args.profile,  # py-spy slows Weir: not a rate to quote
    }
    record(result)
    if summary is not None:
        (RESULTS / "e2e_nats-profile.txt").write_text(summary)


if __name__ == "__main__":
    main()
