"""What Weir costs the database it captures, and how soon a change reaches a subscriber.

One embedded Postgres (full_page_writes on) and one nats-server; each phase on a fresh
database of that server, after a CHECKPOINT:
- ``alone``: the load with nothing capturing it;
- ``floor``: ``pg_recvlogical`` reading the load's changes (pgoutput) and writing them nowhere:
  what any logical-decoding consumer costs Postgres (its walsender), Weir's floor;
- ``weir``: `weir run` (its default process layout) capturing the load with one NATS events
  connector, the store in the source's database (the quickstart's layout);
- ``own_db``: the same with the store in a database of its own on the same server;
- ``single``: as ``weir``, with ``--single-process``.
The load: single-row INSERT transactions paced by pgbench at ``--rate`` for ``--seconds``, or
with ``--bulk``, 30 transactions of 10,000 rows. A phase with Weir ends once the subscriber has
every change, so each process's CPU covers all of them.

Per phase: WAL bytes a change (``pg_current_wal_lsn()``), CPU µs a change of every process
(Postgres by role: the load's backends and the others that ended, the walsender, Weir's store
connections, the rest; Weir's by worker; nats-server), commit → subscriber latency p50/p99 (a
core NATS subscriber takes ``now - commit_timestamp``), changes per store write (how
much capture batches), and against ``alone``: the Postgres CPU
and WAL that Weir adds a change (``added``), and against ``floor`` the Postgres CPU that Weir
adds beyond any logical-decoding reader (``beyond_floor``). Target (issue 30): Postgres ≤ 25 µs
and WAL ≤ 1x on single-row transactions (bulk: ≤ 15 µs, ≤ 1x), Weir ≤ 30 µs (bulk 25), p99 ≤ 100 ms.

    .venv/bin/python bench/cost.py [--rate 5000] [--seconds 20] [--bulk] [--phases alone,weir]
                                   [--profile]

Prints one JSON line and appends it to bench/results/cost.jsonl. ``--profile`` samples Weir's
processes with py-spy during the load into bench/results/cost-profile.txt (self time by
function, per process); a profiled run is marked and is not a measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import orjson
import psycopg
from common import RESULTS, make_stream, new_db, py_spy, record

from devkit import procs
from devkit.embedded import EmbeddedNats, EmbeddedPostgres

TABLE = (
    "CREATE TABLE bench (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v int NOT NULL,"
    " name text)"
)
PHASES = ("alone", "floor", "weir", "own_db", "single")


def scalar(url: str, query: str) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.execute(query)
        row = cur.fetchone() if cur.description else None
        return row[0] if row else None


class PostgresCpu:
    """CPU seconds of a Postgres server's processes, by role: each live process's own, and
    the postmaster's count of the children it reaped (the load's backends, autovacuum
    workers)."""

    def __init__(self, pg: EmbeddedPostgres) -> None:
        assert pg.proc is not None
        self.pid = pg.proc.pid
        self.url = pg.url

    def _reaped(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rpartition(")")[2].split()
        return (int(fields[13]) + int(fields[14])) / procs.TICK  # cutime, cstime

    def roles(self) -> dict[int, str]:
        with psycopg.connect(self.url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pid, backend_type, coalesce(application_name, '') FROM pg_stat_activity"
            ).fetchall()
        out = {}
        for pid, kind, app in rows:
            if kind == "walsender":
                out[pid] = "walsender"
            elif app.startswith("weir"):
                out[pid] = f"weir_backend:{app}"
            elif kind == "client backend":
                out[pid] = "other_backends"
            else:
                out[pid] = "background"
        return out

    def read(self) -> dict[str, float]:
        roles = self.roles()
        used: dict[str, float] = {"ended_and_load": self._reaped()}
        for pid in procs.tree(self.pid):
            role = "postmaster" if pid == self.pid else roles.get(pid, "background")
            used[role] = used.get(role, 0.0) + procs.cpu_seconds(pid)
        return used


def pgbench(url: str, rate: int, seconds: float) -> None:
    script = Path(tempfile.mkdtemp(prefix="weir-bench-")) / "insert.sql"
    script.write_text("INSERT INTO bench (v, name) VALUES (1, 'name-' || random());\n")
    cmd = [shutil.which("pgbench") or "pgbench", "-n", "-M", "prepared", "-c", "4", "-j", "2",
           "-R", str(rate), "-T", str(int(seconds)), "-f", str(script), url]  # fmt: skip
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def bulk(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(30):
            conn.execute("INSERT INTO bench (v, name) SELECT g, 'name-' || g"
                         " FROM generate_series(1, 10000) g")  # fmt: skip


class Subscriber:
    """A core NATS subscriber of a connector's subjects, on a thread of its own: counts the
    messages and takes each one's latency (now - commit_timestamp)."""

    def __init__(self, url: str, subject: str) -> None:
        self.url, self.subject = url, subject
        self.count = 0
        self.latencies: list[float] = []
        self.measure = False
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        self._ready.wait(30)

    async def _run(self) -> None:
        nc = await nats.connect(self.url)

        async def on_msg(msg: Any) -> None:
            now = time.time()
            self.count += 1
            if self.measure:
                ts = orjson.loads(msg.data)["metadata"]["commit_timestamp"]
                at = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
                self.latencies.append((now - at) * 1000)

        await nc.subscribe(self.subject, cb=on_msg)
        await nc.flush()
        self._ready.set()
        while not self._stop.is_set():
            await asyncio.sleep(0.05)
        await nc.close()

    def wait_for(self, n: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.count < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the subscriber has {self.count} of {n} messages")
            time.sleep(0.05)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


@contextmanager
def weir_run(cfg: dict[str, Any], workdir: Path, single: bool) -> Iterator[subprocess.Popen[bytes]]:
    config = workdir / f"{cfg['sources'][0]['name']}.yaml"
    config.write_text(json.dumps(cfg))
    log = open(workdir / "weir.log", "ab")  # noqa: SIM115 - closed below
    cmd = [sys.executable, "-m", "core.cli", "run", "--config", str(config)]
    proc = subprocess.Popen(cmd + (["--single-process"] if single else []), stdout=log,
                            stderr=subprocess.STDOUT)  # fmt: skip
    try:
        yield proc
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()


def phase(pg: EmbeddedPostgres, ns: EmbeddedNats, name: str, args: argparse.Namespace,
          workdir: Path) -> dict[str, Any]:  # fmt: skip
    url = new_db(pg, f"cost_{name}", TABLE)
    cpu = PostgresCpu(pg)
    out: dict[str, Any] = {}
    sub = None
    weir = None
    ctx = None
    recv = None
    store_url = url
    try:
        if name == "floor":
            recv = floor_reader(pg, url)
        elif name != "alone":
            if name == "own_db":
                with psycopg.connect(pg.url, autocommit=True) as conn:
                    conn.execute("CREATE DATABASE cost_store")
                store_url = url.rsplit("/", 1)[0] + "/cost_store"
            ns_name = f"cost{name.replace('_', '')}"
            cfg = {
                "store": {"url": store_url},
                "sources": [{"name": ns_name, "kind": "postgres", "url": url,
                             "tables": ["public.bench"], "slot": f"weir_{name}"}],
                "connectors": [{"name": "events", "type": "nats", "stream": "events",
                                "nats": {"url": ns.url, "namespace": ns_name}}],
            }  # fmt: skip
            asyncio.run(make_stream(ns.url, ns_name.upper(), f"sequin-events.{ns_name}.>"))
            sub = Subscriber(ns.url, f"sequin-events.{ns_name}.>")
            ctx = weir_run(cfg, workdir, single=name == "single")
            weir = ctx.__enter__()
            deadline = time.monotonic() + 60
            while sub.count == 0:  # a probe row, until the whole path is up
                if time.monotonic() > deadline or weir.poll() is not None:
                    log = (workdir / "weir.log").read_text()[-2000:]
                    raise RuntimeError(f"weir did not deliver: {log}")
                scalar(url, "INSERT INTO bench (v, name) VALUES (0, 'probe') RETURNING 1")
                time.sleep(0.5)
            time.sleep(2)
        before = scalar(url, "SELECT count(*) FROM bench")
        writes = "SELECT count(*) FROM weir.event_batches"  # store writes: changes a write
        writes0 = int(scalar(store_url, writes)) if weir else 0
        scalar(pg.url, "CHECKPOINT")
        servers = {"nats-server": ns.proc.pid} if ns.proc else {}
        wal0 = scalar(pg.url, "SELECT pg_current_wal_lsn() - '0/0'")
        cpu0 = cpu.read()
        other0 = {k: sum(map(procs.cpu_seconds, procs.tree(p))) for k, p in servers.items()}
        weir0 = {procs.name(p): procs.cpu_seconds(p) for p in procs.tree(weir.pid)} if weir else {}
        base = sub.count if sub else 0
        if sub:
            sub.measure = True
        spies = {}  # one py-spy a process: --subprocesses merged the workers into one
        if weir and args.profile:
            spies = {procs.name(p): (py_spy(p, args.seconds, workdir / f"{name}.{p}.spy", rate=200,
                                     nonblocking=False, gil=True),
                                     workdir / f"{name}.{p}.spy")
                     for p in procs.tree(weir.pid)}  # fmt: skip
        t0 = time.perf_counter()
        if args.bulk:
            bulk(url)
        else:
            pgbench(url, args.rate, args.seconds)
        load_s = time.perf_counter() - t0
        n = int(scalar(url, "SELECT count(*) FROM bench")) - int(before)
        if recv:  # until the reader confirmed the whole load
            end = scalar(url, "SELECT pg_current_wal_lsn()::text")
            confirmed = ("SELECT confirmed_flush_lsn >= '" + end + "'::pg_lsn FROM "
                         "pg_replication_slots WHERE slot_name = 'floor'")  # fmt: skip
            deadline = time.monotonic() + 120
            while not scalar(url, confirmed):
                if time.monotonic() > deadline:
                    raise TimeoutError("pg_recvlogical did not confirm the load")
                time.sleep(0.2)
        for proc, (spy, path) in spies.items():
            spy.wait(60)
            if path.exists():
                by_process(path, RESULTS / "cost-profile.txt", f"{name} {proc}")
        if sub:
            sub.wait_for(base + n, timeout=300)
        drain_s = time.perf_counter() - t0
        wal = int(scalar(pg.url, "SELECT pg_current_wal_lsn() - '0/0'")) - int(wal0)
        cpu1 = cpu.read()
        used = {k: v - cpu0.get(k, 0.0) for k, v in cpu1.items()}
        if recv:
            used["pg_recvlogical"] = procs.cpu_seconds(recv.pid)
        used |= {k: sum(map(procs.cpu_seconds, procs.tree(p))) - other0[k]
                 for k, p in servers.items()} if weir else {}  # fmt: skip
        if weir:
            used |= {f"weir:{procs.name(p)}": procs.cpu_seconds(p) - weir0.get(procs.name(p), 0.0)
                     for p in procs.tree(weir.pid)}  # fmt: skip
        us = {k: round(1e6 * v / n, 1) for k, v in sorted(used.items()) if v > 0}
        pg_roles = ("ended_and_load", "postmaster", "walsender", "other_backends", "background")
        out = {
            "changes": n,
            "load_s": round(load_s, 1),
            "drain_s": round(drain_s, 1),
            "wal_bytes_per_change": round(wal / n, 1),
            "postgres_us_per_change": round(
                sum(v for k, v in us.items() if k in pg_roles or k.startswith("weir_backend")), 1
            ),
            "weir_us_per_change": round(sum(v for k, v in us.items() if k.startswith("weir:")), 1),
            "cpu_us_per_change": us,
        }
        if weir:
            out["changes_per_store_write"] = round(n / max(1, int(scalar(store_url, writes))
                                                             - writes0), 1)  # fmt: skip
        if sub and sub.latencies:
            lat = sorted(sub.latencies)
            quantiles = (("p50", 0.5), ("p99", 0.99), ("max", 1.0))
            out["latency_ms"] = {q: round(lat[int(f * (len(lat) - 1))], 1) for q, f in quantiles}
    finally:
        if ctx is not None:
            ctx.__exit__(None, None, None)
        if recv:
            recv.terminate()
            recv.wait(30)
        if sub:
            sub.close()
    return out


def floor_reader(pg: EmbeddedPostgres, url: str) -> subprocess.Popen[bytes]:
    """pg_recvlogical on a pgoutput slot of the load's table, confirming every second."""
    scalar(url, "CREATE PUBLICATION floor FOR TABLE bench")
    scalar(url, "SELECT pg_create_logical_replication_slot('floor', 'pgoutput')")
    cmd = [str(pg.bindir / "pg_recvlogical"), "-d", url, "--slot", "floor", "--start", "-o",
           "proto_version=1", "-o", "publication_names=floor", "-s", "1", "-F", "1", "-f",
           os.devnull]  # fmt: skip
    recv = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1)
    return recv


def by_process(spy: Path, out: Path, title: str, top: int = 30) -> None:
    """One process's py-spy raw stacks as self time by function: samples of the thread that
    holds the GIL (the process's Python CPU; py-spy's idle detection counted ``time.sleep`` and
    ``select`` as busy here)."""
    counts: collections.Counter[str] = collections.Counter()
    within: collections.Counter[str] = collections.Counter()  # inclusive: on the stack
    for line in spy.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if count.isdigit():
            frames = stack.split(";")
            counts[frames[-1]] += int(count)
            for fn in {frame.split(" (")[0] for frame in frames[1:]}:
                within[fn] += int(count)
    total = sum(counts.values()) or 1
    with out.open("a") as f:
        f.write(f"phase {title}: {total} samples, self time by line\n")
        f.writelines(f"{100 * n / total:5.1f}%  {fn}\n" for fn, n in counts.most_common(top))
        f.write(f"phase {title}: inclusive by function\n")
        f.writelines(f"{100 * n / total:5.1f}%  {fn}\n" for fn, n in within.most_common(top))
        f.write("\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--bulk", action="store_true")
    parser.add_argument("--phases", default=",".join(PHASES))
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    if args.profile:
        (RESULTS / "cost-profile.txt").unlink(missing_ok=True)
    phases = args.phases.split(",")
    workdir = Path(tempfile.mkdtemp(prefix="weir-bench-"))
    settings = {"full_page_writes": "on", "max_wal_size": "8GB", "checkpoint_timeout": "30min"}
    results: dict[str, Any] = {}
    with EmbeddedPostgres(settings=settings) as pg, EmbeddedNats() as ns:
        for name in phases:
            results[name] = phase(pg, ns, name, args, workdir)
    alone = results.get("alone")
    if alone:
        for name, r in results.items():
            if name != "alone":
                pg_us = r["postgres_us_per_change"] - alone["postgres_us_per_change"]
                wal_x = r["wal_bytes_per_change"] / alone["wal_bytes_per_change"] - 1
                r["added"] = {"postgres_us_per_change": round(pg_us, 1), "wal_x": round(wal_x, 2)}
    floor = results.get("floor")
    if floor:  # what Weir adds beyond any logical-decoding reader of the same load
        for name, r in results.items():
            if name not in ("alone", "floor"):
                pg_us = r["postgres_us_per_change"] - floor["postgres_us_per_change"]
                r["beyond_floor"] = {"postgres_us_per_change": round(pg_us, 1)}
    result = {
        "bench": "cost",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load": "bulk 30 x 10k" if args.bulk else f"{args.rate}/s single-row for {args.seconds:g}s",
        "nats_fast_batches": os.environ.get("BENCH_BATCHED", "1") != "0",
        **results,
    }
    if args.profile:
        result["profiled"] = True
    record(result)


if __name__ == "__main__":
    main()
