"""What the benchmarks share (imported as a sibling module: run them as scripts)."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import nats
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # devkit/ is not installed
from core.config.model import WeirConfig
from core.runtime.service import serve
from devkit.embedded import EmbeddedPostgres

RESULTS = Path(__file__).parent / "results"


def new_db(
    server: EmbeddedPostgres,
    name: str,
    ddl: str = "CREATE TABLE bench (id bigint PRIMARY KEY, v int NOT NULL, name text)",
) -> str:
    """A new database on the server holding one empty table (by default ``bench``)."""
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    url = server.url.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(ddl)
    return url


def insert_rows(conn: psycopg.Connection[Any], n: int) -> None:
    """Rows 1..n into ``bench``, in transactions of 10,000 (an autocommit ``conn``)."""
    for lo in range(0, n, 10_000):
        rows = (lo + 1, min(n, lo + 10_000))
        conn.execute("INSERT INTO bench SELECT g, g, 'name-' || g FROM "
                     "generate_series(%s::bigint, %s::bigint) g", rows)  # fmt: skip


def single_row_backlog(conn: psycopg.Connection[Any], n: int) -> None:
    """n single-row transactions into ``bench`` (rows 1..n), by a procedure that commits each."""
    conn.execute(
        "CREATE PROCEDURE load(n int) LANGUAGE plpgsql AS $$ BEGIN "
        "FOR i IN 1..n LOOP INSERT INTO bench VALUES (i, i, 'name-' || i); COMMIT; END LOOP; "
        "END $$"
    )
    conn.execute("CALL load(%s)", (n,))


def py_spy(
    pid: int,
    seconds: float,
    out: Path,
    *,
    subprocesses: bool = False,
    rate: int = 50,
    nonblocking: bool = True,
    gil: bool = False,
) -> subprocess.Popen[bytes]:
    """py-spy sampling ``pid`` (and its child processes) for ``seconds`` into ``out`` (raw,
    collapsed stacks)."""
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("py-spy")), "record", "-p", str(pid),
         "-d", str(int(seconds)), "-f", "raw", "-o", str(out), "-r", str(rate),
         *(["--nonblocking"] if nonblocking else []), *(["--gil"] if gil else []),
         *(["--subprocesses"] if subprocesses else [])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


def summarize(path: Path, what: str = "the weir process", top: int = 25) -> str:
    """Self time by function from py-spy's raw (collapsed) output."""
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        total += n
        own[stack.split(";")[-1]] += n
    lines = [f"py-spy self time of {what}, {total} samples"]
    lines += [f"{100 * n / total:5.1f}%  {frame}" for frame, n in own.most_common(top)]
    return "\n".join(lines) + "\n"


def record(result: dict[str, Any]) -> None:
    """Print a bench's result as one JSON line and append it to results/<bench>.jsonl."""
    line = json.dumps(result)
    print(line)
    RESULTS.mkdir(exist_ok=True)
    with (RESULTS / f"{result['bench']}.jsonl").open("a") as f:
        f.write(line + "\n")


async def stream_count(url: str, stream: str) -> int:
    nc = await nats.connect(url)
    try:
        return int((await nc.jetstream().stream_info(stream)).state.messages)
    finally:
        await nc.close()


async def make_stream(url: str, stream: str, subject: str) -> None:
    """A stream as `weir nats setup` makes it: taking fast batches (connectors/nats/fast.py),
    unless ``BENCH_BATCHED=0`` (a PubAck a message, for an A/B of the two)."""
    nc = await nats.connect(url)
    batched = os.environ.get("BENCH_BATCHED", "1") != "0"
    await nc.jetstream().add_stream(name=stream, subjects=[subject], allow_batched=batched)
    await nc.close()


def run_for(cfg: WeirConfig, progress: Any, n: int, timeout: float = 900) -> float:
    """Serve ``cfg`` until ``progress()`` reaches ``n``; the rate from the first progress on
    (starting up, which takes leases and connects, is not counted)."""
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=(cfg, stop), daemon=True)
    start = time.perf_counter()
    thread.start()
    try:
        while (first := progress()) == 0:
            if time.perf_counter() - start > timeout:
                raise TimeoutError("the bench did not start")
            time.sleep(0.002)
        t0 = time.perf_counter()
        while (last := progress()) < n:
            if time.perf_counter() - start > timeout:
                raise TimeoutError("the bench did not finish")
            time.sleep(0.05)
        return (last - first) / (time.perf_counter() - t0)
    finally:
        stop.set()
        thread.join(120)
