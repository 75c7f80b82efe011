"""Two Weirs with stores of their own in one database (``store.schema`` weir_a and weir_b), each
with a source named app and a connector named events. The keys of a store's advisory locks and
its NOTIFY channel carry its schema (core/store/shared.py): neither waits for the other's
leases, writer lock or consumer locks, and neither hears the other's commits (their sources,
named alike, have one sync id: a commit of the other's, heard, would move a connector on past
changes of its own not yet stored).
"""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from core.store import Store
from devkit.embedded import EmbeddedNats
from tests.connectors.nats.harness import NatsHarness
from tests.helpers.brokers import wait_delivered
from tests.helpers.load import WeirProcess
from tests.helpers.sql import execute

ROWS = {"a": 40, "b": 200}  # b commits five times as often as a: its seqs run ahead


def test_two_stores_in_one_database_capture_and_send_their_own_changes_at_once(
    tmp_path: Path, db_url: str, nats_server: EmbeddedNats
) -> None:
    broker = NatsHarness(nats_server)
    connectors, configs = {}, {}
    for s in ROWS:
        execute(db_url, f"CREATE TABLE {s} (id int PRIMARY KEY, v int)")
        events = connectors[s] = broker.connector("events", "events")
        broker.prepare(events)
        source = {"name": "app", "kind": "postgres", "url": db_url, "tables": [f"public.{s}"],
                  "slot": f"weir_slot_{s}", "publication": f"weir_pub_{s}"}  # fmt: skip
        configs[s] = tmp_path / f"{s}.yaml"
        configs[s].write_text(json.dumps({"store": {"schema": f"weir_{s}"}, "sources": [source],
                                          "connectors": [events]}))  # fmt: skip
    # each waits until it streams from its slot: the second would wait for the first's lease
    with (
        WeirProcess(configs["a"], tmp_path / "a.log"),
        WeirProcess(configs["b"], tmp_path / "b.log"),
    ):
        with psycopg.connect(db_url, autocommit=True) as conn:
            for i in range(ROWS["a"]):
                conn.execute("INSERT INTO a VALUES (%s, 0)", (i + 1,))
                for j in range(5 * i, 5 * i + 5):
                    conn.execute("INSERT INTO b VALUES (%s, 0)", (j + 1,))
        got = {s: wait_delivered(broker, connectors[s], n, settle=1.0) for s, n in ROWS.items()}
    for s, n in ROWS.items():
        assert sorted(d.seq for d in got[s]) == list(range(1, n + 1))
        assert sorted(int(d.payload["record"]["id"]) for d in got[s]) == list(range(1, n + 1))
        assert {d.payload["metadata"]["collection_id"] for d in got[s]} == {f"public:{s}"}


def test_a_consumers_receives_wait_only_for_those_of_its_own_store(db_url: str) -> None:
    """A receive of the Consume API holds its consumer's lock until its transaction ends: one of
    consumer orders in weir_a keeps another of it in weir_a waiting, not one in weir_b."""
    for s in ROWS:
        Store(db_url, f"weir_{s}").prepare([])
    receive = "SELECT * FROM {}.consumer_receive('orders', 10, 10, 1000, 0)"
    with psycopg.connect(db_url) as holder, psycopg.connect(db_url, autocommit=True) as other:
        assert holder.execute(receive.format("weir_a")).fetchall() == []  # its transaction open
        other.execute("SET lock_timeout = '200ms'")
        assert other.execute(receive.format("weir_b")).fetchall() == []
        with pytest.raises(psycopg.errors.LockNotAvailable):
            other.execute(receive.format("weir_a"))
