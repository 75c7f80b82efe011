"""The Consume API: messages/s received and acked by 4 concurrent workers, batch 100.

`weir run` runs as its own process with a postgres source and one HTTP pull consumer on the
events stream; ``--messages`` rows are committed and captured first, so what is timed is the
consumer's queue (filled as it drains, BUFFER rows at most) and the HTTP round trips: each of
4 worker processes loops ``GET /v1/http-consumers/bench/next?batch_size=100`` and
``POST …/ack`` until every message was acknowledged. Target (docs/design.md “Performance”): ≥
10,000/s.

The workers share the machine's cores with Weir and Postgres, so they are kept lean: one
keep-alive ``http.client`` connection each and orjson. (httpx used twice their CPU time, which
on 2 cores came out of Weir's share: 57 against 23 µs a message.)

    .venv/bin/python bench/consume_api.py [--messages 200000] [--profile]

Prints one JSON line and appends it to bench/results/consume_api.jsonl; ``--profile`` also
writes bench/results/consume_api-profile.txt (py-spy self time of its api worker).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import psycopg
from common import RESULTS, new_db, py_spy, record, summarize

from core.config.model import WeirConfig
from core.runtime.service import prepare
from devkit import procs
from devkit.embedded import EmbeddedPostgres
from devkit.server import free_port

TOKEN = "bench-token-0123456789"
WORKERS = 4
BATCH = 100


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of processes, from /proc."""
    return sum(procs.cpu_seconds(p) for p in pids)


def weir_cpu(pid: int) -> dict[str, float]:
    """CPU seconds of each process of ``weir run`` (supervisor and workers), by name."""
    return {procs.name(p): procs.cpu_seconds(p) for p in procs.tree(pid)}


def postgres_pids() -> list[int]:
    return [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit()
        and (p / "comm").exists()
        and (p / "comm").read_text().strip() == "postgres"
    ]


def worker(base: str, total: int, acked: Any, counts: Any, cpu: Any, index: int) -> None:
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    receive = f"/v1/http-consumers/bench/next?batch_size={BATCH}&wait_for=500"

    def call(method: str, path: str, body: bytes | None = None) -> Any:
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise RuntimeError(f"{method} {path}: {r.status} {data[:200]!r}")
        return orjson.loads(data)

    while acked.value < total:
        tokens = [m["ack_token"] for m in call("GET", receive)["data"]]
        if not tokens:
            continue
        n = call("POST", "/v1/http-consumers/bench/ack", orjson.dumps({"ack_tokens": tokens}))
        with acked.get_lock():
            acked.value += n["count"]
        counts[index] += n["count"]
    cpu[index] = sum(os.times()[:2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    n = args.messages
    workdir = Path(tempfile.mkdtemp(prefix="weir-bench-"))
    port = free_port()
    with EmbeddedPostgres(settings={"max_wal_size": "4GB"}) as pg:
        url = new_db(pg, "consume")
        spec = {
            "api": {"listen": f"127.0.0.1:{port}", "tokens": [TOKEN]},
            "sources": [{"name": "app", "kind": "postgres", "url": url,
                         "tables": ["public.bench"], "max_batch": 20000}],
            "consumers": [{"name": "bench", "stream": "events", "max_waiting": 50}],
        }  # fmt: skip
        prepare(WeirConfig.model_validate(spec))  # the slot exists before the rows go in
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("INSERT INTO bench SELECT g, g, 'name-' || g "
                         "FROM generate_series(1, %s) g", (n,))  # fmt: skip
        config = workdir / "weir.yaml"
        config.write_text(json.dumps(spec))
        log = open(workdir / "weir.log", "ab")  # noqa: SIM115 - lives as long as the process
        weir = subprocess.Popen(
            [sys.executable, "-m", "core.cli", "run", "--config", str(config)],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            with psycopg.connect(url, autocommit=True) as conn:
                deadline = time.monotonic() + 600
                while time.monotonic() < deadline:
                    row = conn.execute("SELECT coalesce(max(events_seq), 0) FROM weir.sources")
                    if (got := row.fetchone()) and got[0] >= n:
                        break
                    time.sleep(0.5)
            ctx = mp.get_context("spawn")
            acked = ctx.Value("q", 0)
            counts = ctx.Array("q", WORKERS)
            cpu = ctx.Array("d", WORKERS)
            base = f"http://127.0.0.1:{port}"
            clients = [ctx.Process(target=worker, args=(base, n, acked, counts, cpu, i))
                     for i in range(WORKERS)]  # fmt: skip
            pg_pids = postgres_pids()
            cpu0 = (weir_cpu(weir.pid), cpu_seconds(pg_pids))
            start = time.perf_counter()
            for p in clients:
                p.start()
            api = next((p for p in procs.tree(weir.pid) if procs.name(p) == "api"), weir.pid)
            spy = py_spy(api, 15, workdir / "profile.txt") if args.profile else None
            for p in clients:
                p.join(900)
            elapsed = time.perf_counter() - start
            after = weir_cpu(weir.pid)
            used = {
                **{f"weir {k}": round(after[k] - cpu0[0].get(k, 0.0), 1) for k in after},
                "postgres": round(cpu_seconds(pg_pids) - cpu0[1], 1),
                "workers": round(sum(cpu), 1),
            }
            if spy is not None:
                spy.wait(60)
        finally:
            weir.terminate()
            weir.wait(60)
    if acked.value < n:
        sys.exit(f"only {acked.value} of {n} messages were acknowledged; nothing recorded")
    rate = acked.value / elapsed
    result = {
        "bench": "consume_api",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "messages": n,
        "workers": WORKERS,
        "batch_size": BATCH,
        "client": "http.client",
        "acked": acked.value,
        "per_worker": list(counts),
        "seconds": round(elapsed, 2),
        "received_and_acked_per_s": round(rate),
        "cpu_seconds": used,
        "targets": {"received_and_acked_per_s": 10000},
        "profiled": args.profile,  # py-spy slows Weir: not a rate to quote
    }
    record(result)
    if args.profile:
        (RESULTS / "consume_api-profile.txt").write_text(
            summarize(workdir / "profile.txt", "the api worker of weir run")
        )


if __name__ == "__main__":
    main()
