"""End to end through NATS under load: `weir run` killed with SIGKILL and restarted after the
stream's duplicate window has passed, and the NATS server taken away for 10 s.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import psycopg
import pytest

from core.embedded import EmbeddedNats
from tests.helpers.brokers import Delivered, NatsHarness
from tests.helpers.capture import count_events, wait_for
from tests.helpers.weir import serving, weir_config
from tests.integration.test_crash import _load, _start_weir


def _check(
    db_url: str, events: list[Delivered], records: list[Delivered], expected: list[Any]
) -> None:
    """Every change once, in per-record order; the last record message of each record is the
    table's row.
    """
    assert len({d.key for d in events}) == len(events), "a message reached NATS twice"
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


def _connectors(broker: NatsHarness) -> tuple[dict[str, Any], dict[str, Any]]:
    events = broker.connector("events", "events", batch={"max_messages": 100})
    records = broker.connector("records", "records", batch={"max_messages": 100})
    broker.prepare(events, dedupe=False)  # a 100 ms window: only the read-back can save us
    broker.prepare(records, dedupe=False)
    return events, records


def _wait_all(broker: NatsHarness, events: dict[str, Any], n: int) -> list[Delivered]:
    got: list[Delivered] = []

    def done() -> bool:
        got[:] = broker.read(events)
        return len(got) >= n

    wait_for(done, timeout=120, what=f"{n} events at NATS")
    time.sleep(1.0)  # anything more would be a duplicate
    return broker.read(events)


@pytest.mark.slow
def test_sigkill_under_load_nats_sees_every_change_once_in_order(
    tmp_path: Path, db_url: str, nats_server: EmbeddedNats
) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE load (id int PRIMARY KEY, v int)")
    broker = NatsHarness(nats_server)
    events, records = _connectors(broker)
    cfg = {"sources": [{"name": "app", "kind": "postgres", "url": db_url,
                        "tables": ["public.load"]}], "connectors": [events, records]}  # fmt: skip
    config = tmp_path / "weir.yaml"
    config.write_text(json.dumps(cfg))  # JSON is YAML
    log = tmp_path / "weir.log"
    weir = _start_weir(config, log)
    try:
        wait_for(lambda: b"streaming from slot" in log.read_bytes(), what="weir to stream")
        expected: list[tuple[str, str, Any]] = []
        done = threading.Event()
        writer = threading.Thread(target=_load, args=(db_url, 3000, expected, done))
        writer.start()
        for point in (800, 2000):
            wait_for(lambda: len(expected) > point, what="the load to progress")  # noqa: B023
            time.sleep(random.uniform(0.0, 0.3))
            os.kill(weir.pid, signal.SIGKILL)
            weir.wait()
            assert not done.is_set(), "the load ended before the kill: make it longer"
            time.sleep(0.5)  # past the stream's 100 ms duplicate window
            weir = _start_weir(config, log)
        writer.join()
        got = _wait_all(broker, events, len(expected))
        weir.send_signal(signal.SIGTERM)
        assert weir.wait(30) == 0, log.read_text()
    finally:
        if weir.poll() is None:
            weir.kill()
    assert count_events(db_url) == len(expected)
    _check(db_url, got, broker.read(records), expected)
    assert log.read_text().count("connector events: streaming") >= 3


@pytest.mark.slow
def test_nats_down_for_10s_under_load_loses_nothing(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE load (id int PRIMARY KEY, v int)")
    with EmbeddedNats() as server:
        broker = NatsHarness(server)
        events, records = _connectors(broker)
        with serving(weir_config(db_url, [events, records], tables=["public.load"], schemas=[])):
            expected: list[tuple[str, str, Any]] = []
            done = threading.Event()
            writer = threading.Thread(target=_load, args=(db_url, 12000, expected, done))
            writer.start()
            wait_for(lambda: len(expected) > 500, what="the load to progress")
            server.stop()
            time.sleep(10)
            assert not done.is_set(), "the load ended while NATS was down: make it longer"
            server.start()
            writer.join()
            got = _wait_all(broker, events, len(expected))
            recs = broker.read(records)
    _check(db_url, got, recs, expected)
