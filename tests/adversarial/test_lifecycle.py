"""One connector's lifecycle over the management API (docs/operations.md “Management API and CLI”),
at random under load, with two `weir run` instances sharing the store and the API called on
either: connectors are made (from the beginning, the end or a seq), deleted, deleted and made
again at once under their name with another destination, given a new destination, paused and
resumed. Each destination must see each change once and in each record's order; a making
sees every change from the start position it asked for on (across the destinations a change
gave it); a deleted one's destinations get nothing once the delete returned. A delete waits
for a session still holding the connector's cursor (an instance slow to stop, or frozen),
within a bound.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from core.store import Store
from core.store import connectors as api_connectors
from core.store.cursors import fence_key
from devkit.embedded import EmbeddedNats
from devkit.server import free_port
from tests.connectors.nats.harness import NatsHarness
from tests.helpers.api import TOKEN, api_serving
from tests.helpers.brokers import Delivered
from tests.helpers.capture import wait_for
from tests.helpers.load import WeirProcess

RECORDS = 20  # the writer's records: each gets many changes, so that order shows
OPS_FOR = 22.0  # seconds of random lifecycle operations
MARGIN = 0.1  # seconds: a batch its client handed to NATS before the session ended is stored


@dataclass
class Making:
    """One making of a connector: where it was asked to start, its destinations in order."""

    name: str
    start: Any
    floor: int  # the events head just before it was made
    dests: list[dict[str, Any]] = field(default_factory=list)
    deleted_at: float | None = None


def _head(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT coalesce(max(events_seq), 0) FROM weir.sources").fetchone()
    return int(row[0]) if row else 0


def _write(url: str, stop: threading.Event, written: list[int]) -> None:
    """A change every few milliseconds, round the records, until told to stop (bounded); each
    is one event, so ``written`` holds the seq of the last."""
    with psycopg.connect(url, autocommit=True) as conn:
        for i in range(20_000):
            if stop.is_set():
                return
            conn.execute("INSERT INTO lc VALUES (%s, %s) ON CONFLICT (id) DO UPDATE"
                         " SET v = excluded.v", (i % RECORDS, i))  # fmt: skip
            written[0] = i + 1
            time.sleep(0.004)


def _check(m: Making, got: dict[str, list[Delivered]], final: int, seed: int) -> None:
    said = f"connector {m.name} made from {m.start} (seed {seed})"
    union: set[int] = set()
    for dest in m.dests:
        msgs = got[dest["nats"]["namespace"]]
        keys = [d.key for d in msgs]
        assert len(keys) == len(set(keys)), f"{said}: a change sent twice to a destination"
        last: dict[Any, int] = {}
        for d in msgs:
            assert d.seq > last.get(d.group, 0), f"{said}: record {d.group} out of order"
            last[d.group] = d.seq
        if m.deleted_at is not None:
            late = [d.seq for d in msgs if d.at > m.deleted_at + MARGIN]
            assert not late, f"{said}: seqs {late[:5]} stored after its delete returned"
        union |= {d.seq for d in msgs}
    if not union:
        assert m.deleted_at is not None, f"{said}: nothing delivered"
        return
    first = min(union)
    if m.start == "beginning":
        assert first == 1, f"{said}: first seq {first}"
    elif m.start == "end":
        assert first > m.floor, f"{said}: first seq {first}, the head was {m.floor}"
    else:
        assert first == m.start["seq"], f"{said}: first seq {first}"
    if m.deleted_at is None:
        missing = sorted(set(range(first, final + 1)) - union)
        assert not missing, f"{said}: seqs {missing[:10]} of {len(missing)} missing"


@pytest.mark.slow
def test_random_connector_lifecycles_under_load_on_two_instances(
    tmp_path: Path, db_url: str, nats_server: EmbeddedNats
) -> None:
    seed = int(os.environ.get("WEIR_LIFECYCLE_SEED", time.time_ns() % 10**6))
    rnd = random.Random(seed)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE lc (id int PRIMARY KEY, v int NOT NULL)")
    broker = NatsHarness(nats_server)
    clients, configs = [], []
    for i in range(2):
        port = free_port()
        cfg = {"sources": [{"name": "app", "kind": "postgres", "url": db_url,
                            "tables": ["public.lc"]}],
               "api": {"listen": f"127.0.0.1:{port}", "tokens": [TOKEN]}}  # fmt: skip
        (config := tmp_path / f"weir{i}.yaml").write_text(json.dumps(cfg))
        configs.append(config)
        clients.append(httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60,
                                    headers={"Authorization": f"Bearer {TOKEN}"}))  # fmt: skip
    makings: dict[str, list[Making]] = {"a": [], "b": []}
    paused: set[str] = set()
    stop = threading.Event()

    def make(client: httpx.Client, name: str) -> None:
        floor = _head(db_url)
        start = rnd.choice(["beginning", "end", {"seq": max(1, floor - 40)}])
        m = Making(name, start, floor)
        change(client, m, new=True)
        makings[name].append(m)

    def change(client: httpx.Client, m: Making, new: bool = False) -> None:
        dest = broker.connector(m.name, "events", start_position=m.start)
        broker.prepare(dest)
        m.dests.append(dest)
        r = client.post("/v1/connectors", json=dest) if new else client.put(
            f"/v1/connectors/{m.name}", json=dest)  # fmt: skip
        assert r.status_code == (201 if new else 200), r.text

    def delete(client: httpx.Client, m: Making) -> None:
        r = client.delete(f"/v1/connectors/{m.name}")
        assert r.status_code == 200, r.text
        m.deleted_at = time.time()
        paused.discard(m.name)

    def up(client: httpx.Client) -> bool:
        try:
            return client.get("/v1/connectors").status_code == 200
        except httpx.TransportError:
            return False

    with (
        WeirProcess(configs[0], tmp_path / "weir0.log"),
        WeirProcess(configs[1], tmp_path / "weir1.log", standby=True),
    ):
        for client in clients:
            wait_for(lambda: up(client), timeout=60, what="both APIs")  # noqa: B023
        written = [0]
        writer = threading.Thread(target=_write, args=(db_url, stop, written))
        writer.start()
        try:
            for name in makings:
                make(clients[0], name)
            deadline = time.monotonic() + OPS_FOR
            while time.monotonic() < deadline:
                time.sleep(rnd.uniform(0.2, 1.5))
                name, client = rnd.choice(sorted(makings)), rnd.choice(clients)
                m = makings[name][-1]
                if m.deleted_at is not None:
                    make(client, name)
                    continue
                op = rnd.choice(["again", "again", "delete", "change", "pause"])
                if op in ("again", "delete"):
                    delete(client, m)
                    if op == "again":  # made again at once: another connector
                        make(rnd.choice(clients), name)
                elif op == "change":
                    change(client, m)
                else:
                    verb = "resume" if name in paused else "pause"
                    assert client.post(f"/v1/connectors/{name}/{verb}").status_code == 200
                    paused ^= {name}
            for name in paused:
                assert clients[0].post(f"/v1/connectors/{name}/resume").status_code == 200
            live = [ms[-1] for ms in makings.values() if ms[-1].deleted_at is None]
            for m in live:  # started, so that one made from the end has changes after it
                wait_for(lambda: any(broker.read(d) for d in m.dests),  # noqa: B023
                         timeout=30, what=f"{m.name} delivering")  # fmt: skip
        finally:
            stop.set()
            writer.join()
        final = written[0]
        wait_for(lambda: _head(db_url) == final, what="every change captured")

        def caught_up(m: Making) -> bool:
            shards = clients[1].get(f"/v1/connectors/{m.name}").json()["shards"]
            return all(s["seq"] == final for s in shards)

        for m in live:
            wait_for(lambda: caught_up(m), timeout=30, what=f"{m.name} caught up")  # noqa: B023
    got = {d["nats"]["namespace"]: broker.read(d) for ms in makings.values()
           for m in ms for d in m.dests}  # fmt: skip
    for ms in makings.values():
        for m in ms:
            _check(m, got, final, seed)
    assert sum(len(ms) for ms in makings.values()) > 4, f"too few makings (seed {seed})"


def test_a_delete_answers_once_a_session_holding_a_cursor_has_ended(
    table: str, nats_server: EmbeddedNats, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(api_connectors, "DELETE_WAIT", 2.0)
    broker = NatsHarness(nats_server)
    with api_serving(table) as client, psycopg.connect(table, autocommit=True) as other:
        row = other.execute("SELECT sync_id::text FROM weir.sources WHERE name = 'app'").fetchone()
        assert row is not None

        def held_elsewhere(name: str) -> None:
            """Made while another instance's session holds its fence and cursor."""
            other.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))",
                          (fence_key(Store(table), name, row[0]),))  # fmt: skip
            c = broker.connector(name, "events", sources=["app"])
            assert client.post("/v1/connectors", json=c).status_code == 201
            other.execute("INSERT INTO weir.cursors (connector, sync_id, stream, seq)"
                          " VALUES (%s, %s, 'events', 0)", (name, row[0]))  # fmt: skip

        held_elsewhere("slow")
        threading.Timer(1.0, lambda: other.execute("SELECT pg_advisory_unlock_all()")).start()
        began = time.monotonic()
        assert client.delete("/v1/connectors/slow").status_code == 200
        assert time.monotonic() - began >= 1.0  # not before that session ended
        held_elsewhere("frozen")
        r = client.delete("/v1/connectors/frozen")
        assert r.status_code == 409 and "its session of frozen on source" in r.text, r.text
        assert client.get("/v1/connectors/frozen").status_code == 404  # deleted all the same
