"""A steady write load on ``load(id, v)``, interrupted at fixed points, and `weir run` as a real
process that the interruptions kill and restart.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg

from devkit import procs
from tests.helpers.brokers import Delivered, Harness, wait_delivered
from tests.helpers.capture import wait_for

Op = tuple[str, str, Any]  # (action, record_id, v)
_MAX_FACTOR = 20


def create_load_table(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE load (id int PRIMARY KEY, v int)")


def _load(url: str, n_txns: int, expected: list[Op], interrupted: threading.Event) -> None:
    """One writer, so commit order is the order below. It writes at least ``n_txns``
    transactions and goes on until the interruptions are over, so a slow restart on a slow
    machine still happens under load; bounded to ``_MAX_FACTOR * n_txns`` transactions."""
    rng = random.Random(7)
    live: set[int] = set()
    next_id = 1
    with psycopg.connect(url, autocommit=True) as conn:
        for i in range(_MAX_FACTOR * n_txns):
            if i >= n_txns and interrupted.is_set():
                break
            ops: list[Op] = []
            with conn.transaction():
                for _ in range(3 if i % 10 == 0 else 1):
                    roll = rng.random()
                    if roll < 0.5 or len(live) < 10:
                        conn.execute("INSERT INTO load VALUES (%s, %s)", (next_id, i))
                        ops.append(("insert", str(next_id), i))
                        live.add(next_id)
                        next_id += 1
                    elif roll < 0.85:
                        rid = rng.choice(sorted(live))
                        conn.execute("UPDATE load SET v = %s WHERE id = %s", (i, rid))
                        ops.append(("update", str(rid), i))
                    else:
                        rid = rng.choice(sorted(live))
                        conn.execute("DELETE FROM load WHERE id = %s", (rid,))
                        ops.append(("delete", str(rid), None))
                        live.discard(rid)
            expected.extend(ops)
            time.sleep(0.001)  # a steady load, not a burst


def load_with_interruptions(
    url: str, n_txns: int, points: list[int], interrupt: Callable[[], None]
) -> list[Op]:
    """Run the load; when ``points[i]`` changes are committed, call ``interrupt()``. The load
    lasts until the last interruption has ended. Returns every committed change, in commit order.
    """
    expected: list[Op] = []
    interrupted = threading.Event()
    writer = threading.Thread(target=_load, args=(url, n_txns, expected, interrupted))
    writer.start()
    try:
        for point in points:
            wait_for(lambda: len(expected) > point, what="the load to progress")  # noqa: B023
            interrupt()
            assert writer.is_alive(), "the load hit its bound before the interruption ended"
    finally:
        interrupted.set()
        writer.join()
    return expected


class WeirProcess:
    """`weir run --config FILE` in a process of its own, logging to ``log``; killed on exit.
    ``code``: a checkout of another version of Weir to run (its ``core``), else this one."""

    def __init__(
        self, config: Path, log: Path, *, standby: bool = False, code: Path | None = None
    ) -> None:
        self.config = config
        self.log = log
        self.standby = standby
        self.code = code
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        env = None if self.code is None else {**os.environ, "PYTHONPATH": str(self.code)}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(  # a process group of its own, as under systemd
                [sys.executable, "-m", "core.cli", "run", "--config", str(self.config)],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.code,
                env=env,
            )

    def log_text(self) -> str:
        return self.log.read_text()

    def kill_and_restart(self) -> None:
        """SIGKILL at a random moment once it streams, then a new process once it is gone."""
        assert self.proc is not None
        wait_for(lambda: self.log_text().count("streaming from slot") >= self.starts,
                 what="weir to stream")  # fmt: skip
        time.sleep(random.uniform(0.0, 0.3))
        self.kill()
        time.sleep(0.5)  # also past a 100 ms broker duplicate window
        self.start()

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def workers(self) -> dict[str, int]:
        """The pid of each worker process of the supervisor, by worker name (``sources-0``)."""
        assert self.proc is not None
        return {procs.name(pid): pid for pid in procs.children(self.proc.pid)}

    def stop(self, group: bool = False) -> None:
        """SIGTERM (to its whole process group, as systemd and a terminal's ^C send it, when
        ``group``): it must drain and exit 0."""
        assert self.proc is not None
        if group:
            os.killpg(self.proc.pid, signal.SIGTERM)
        else:
            self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(30) == 0, self.log_text()

    def __enter__(self) -> WeirProcess:
        """Started; waits until it streams unless ``standby`` (another instance owns the work)."""
        self.start()
        if not self.standby:
            wait_for(lambda: "streaming from slot" in self.log_text(), what="weir to stream")
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def check_delivered(
    db_url: str, events: list[Delivered], records: list[Delivered], expected: list[Any]
) -> None:
    """What a connector pair delivered of the load (``expected``, in commit order): every change
    once in the events, each record's messages in order in both streams, and the last record
    message of each record is the table's row.
    """
    assert len({d.key for d in events}) == len(events), "a message reached the broker twice"
    assert sorted(d.seq for d in events) == list(range(1, len(expected) + 1))
    by_seq = sorted(events, key=lambda d: d.seq)
    got = [(d.payload["action"], d.payload["metadata"]["record_id"],
            d.payload["record"].get("v")) for d in by_seq]  # fmt: skip
    assert got == expected
    for stream in (events, records):
        groups: dict[Any, list[int]] = defaultdict(list)
        for d in stream:
            groups[d.group].append(d.seq)
        assert all(s == sorted(s) for s in groups.values()), "a record's messages out of order"
    with psycopg.connect(db_url) as conn:
        table = {r[0]: r[1] for r in conn.execute("SELECT id, v FROM load")}
    latest = {}
    for d in records:
        latest[int(d.payload["record"]["id"])] = (d.payload["metadata"]["deleted"], d.payload)
    live = {k: p["record"]["v"] for k, (deleted, p) in latest.items() if not deleted}
    assert live == table


def first_seen(got: list[Delivered]) -> list[Delivered]:
    """Each message as a receiver that drops repeated idempotency keys keeps it."""
    seen: set[str] = set()
    out = []
    for d in got:
        if d.key not in seen:
            seen.add(d.key)
            out.append(d)
    return out


def crash_connectors(broker: Harness) -> tuple[dict[str, Any], dict[str, Any]]:
    """An events and a records connector whose broker cannot hide a resend."""
    events = broker.connector("events", "events", batch={"max_messages": 100})
    records = broker.connector("records", "records", batch={"max_messages": 100})
    broker.prepare(events, dedupe=False)  # NATS: a 100 ms window; only the read-back can save us
    broker.prepare(records, dedupe=False)
    return events, records


def wait_all_delivered(broker: Harness, events: dict[str, Any], records: dict[str, Any],
                       n: int) -> None:  # fmt: skip
    """Until ``events``' destination holds ``n`` distinct messages (and a second more, so that
    a duplicate would show) and ``records``' holds some."""
    wait_for(lambda: len(first_seen(broker.read(events))) >= n, timeout=120,
             what="every change delivered")  # fmt: skip
    time.sleep(1.0)
    wait_delivered(broker, records, 1)


def consumed(broker: Harness, *connectors: dict[str, Any]) -> list[list[Delivered]]:
    """What a subscriber of each connector keeps (a webhook receiver drops repeats)."""
    got = [broker.consume(c) for c in connectors]
    return [first_seen(g) for g in got] if broker.replays else got
