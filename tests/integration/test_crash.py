"""A `weir run` process killed with SIGKILL under a steady write load loses and doubles nothing."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.helpers.capture import count_events, events, records, wait_for


def _start_weir(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "core.cli", "run", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _load(url: str, n_txns: int, expected: list[tuple[str, str, Any]], done: threading.Event):
    """One writer, so commit order is the order below; bounded to ``n_txns`` transactions."""
    rng = random.Random(7)
    live: set[int] = set()
    next_id = 1
    with psycopg.connect(url, autocommit=True) as conn:
        for i in range(n_txns):
            ops: list[tuple[str, str, Any]] = []
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
    done.set()


@pytest.mark.slow
def test_sigkill_under_load_then_restart_stores_every_change_once(
    tmp_path: Path, db_url: str
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE load (id int PRIMARY KEY, v int)")
    config = tmp_path / "weir.yaml"
    config.write_text(
        f"sources:\n  - {{name: app, kind: postgres, url: '{db_url}', tables: [public.load]}}\n"
    )
    log = tmp_path / "weir.log"
    weir = _start_weir(config, log)
    try:
        wait_for(lambda: b"streaming from slot" in log.read_bytes(), what="weir to stream")
        expected: list[tuple[str, str, Any]] = []
        done = threading.Event()
        writer = threading.Thread(target=_load, args=(db_url, 5000, expected, done))
        writer.start()
        for point in (1500, 3500):  # kill it twice in the middle of the load
            wait_for(lambda: len(expected) > point, what="the load to progress")  # noqa: B023
            time.sleep(random.uniform(0.0, 0.3))
            os.kill(weir.pid, signal.SIGKILL)
            weir.wait()
            assert not done.is_set(), "the load ended before the kill: make it longer"
            time.sleep(0.5)
            weir = _start_weir(config, log)
        writer.join()
        wait_for(
            lambda: count_events(db_url) >= len(expected), timeout=120, what="all changes stored"
        )
        time.sleep(0.5)  # anything more would be a duplicate
        weir.send_signal(signal.SIGTERM)
        assert weir.wait(30) == 0, log.read_text()
    finally:
        if weir.poll() is None:
            weir.kill()
    evs = events(db_url)
    got = [(e["action"], e["record_id"], e["record"].get("v")) for e in evs]
    assert len(got) == len(expected)
    assert got == expected
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1))
    with psycopg.connect(db_url) as conn:
        table = {r[0]: r[1] for r in conn.execute("SELECT id, v FROM load")}
    assert {int(r["record_id"]): r["record"]["v"] for r in records(db_url)} == table
    assert log.read_text().count("streaming from slot") == 3
