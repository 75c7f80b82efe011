"""Two `weir run` on two hosts of their own (network namespaces, tests/helpers/hosts.py), with
one store and one NATS server on a third: the work splits between them; the one that captures
is SIGKILLed under load and the other takes all its work over within the lease time; NATS
subscribers see every change once, in per-record order, and the table's rows.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg
import pytest

from core.runtime.service import LEASE_POLL
from devkit.embedded import EmbeddedNats, EmbeddedPostgres
from tests.helpers.brokers import NatsHarness, wait_delivered
from tests.helpers.capture import count_events, wait_for
from tests.helpers.hosts import Host, Hosts
from tests.helpers.load import check_delivered, create_load_table, load_with_interruptions

# Which instance is to own which work before the kill; w2 is killed. A sharded connector goes
# into _config and its shards' works (connector:NAME#i/N) here.
SPLIT = {
    "w1": ["backfill:app", "connector:events-a", "connector:records-a"],
    "w2": ["source:app", "connector:events-b", "connector:records-b"],
}
TAKEOVER_BOUND = LEASE_POLL + 2.0  # seconds: a poll, plus a start on a loaded 2-core machine


def _config(db_url: str, broker: NatsHarness) -> tuple[dict[str, Any], list[tuple[Any, Any]]]:
    """The one config both instances run, and its (events, records) connector pairs."""
    pairs = []
    for x in ("a", "b"):
        events = broker.connector(f"events-{x}", "events", batch={"max_messages": 100})
        records = broker.connector(f"records-{x}", "records", batch={"max_messages": 100})
        broker.prepare(events, dedupe=False)  # a 100 ms window: only the read-back can save us
        broker.prepare(records, dedupe=False)
        pairs.append((events, records))
    source = {"name": "app", "kind": "postgres", "url": db_url, "tables": ["public.load"]}
    return {"sources": [source], "connectors": [c for p in pairs for c in p]}, pairs


def _owners(db_url: str) -> dict[str, str]:
    """Work -> the host of the instance that holds it (instances are named HOSTNAME:PID:...)."""
    with psycopg.connect(db_url) as conn:
        try:
            rows = conn.execute("SELECT work, instance FROM weir.owners").fetchall()
        except psycopg.errors.UndefinedTable:  # no instance has made the store yet
            return {}
    return {str(work): str(instance).split(":")[0] for work, instance in rows}


def _lease_clients(db_url: str) -> set[tuple[str, str]]:
    """(host, address) of the lease connections the store sees."""
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT application_name, host(client_addr) FROM pg_stat_activity"
            " WHERE application_name LIKE 'weir-leases:%'"
        ).fetchall()
    return {(str(app).split(":")[1], str(addr)) for app, addr in rows}


def _hold(db_url: str, works: list[str]) -> psycopg.Connection[Any]:
    """A connection holding the leases of ``works``, as an instance would: no one else takes
    them until it closes."""
    conn = psycopg.connect(db_url, autocommit=True)
    for work in works:
        conn.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (f"weir:lease:{work}",))
    return conn


class Instance:
    """`weir run` on a host, logging to a file."""

    def __init__(self, host: Host, config: Path, log: Path) -> None:
        self.host, self.config, self.log = host, config, log

    def start(self) -> Instance:
        with open(self.log, "ab") as out:
            argv = [sys.executable, "-m", "core.cli", "run", "--config", str(self.config)]
            self.proc = self.host.popen(argv, stdout=out, stderr=out)
        return self

    def text(self) -> str:
        return self.log.read_text()

    def signal(self, sig: int) -> None:
        self.host.kill(self.proc, sig)


@pytest.fixture
def hosts() -> Iterator[Hosts]:
    with Hosts(["db", "w1", "w2"]) as hosts:
        yield hosts


@pytest.mark.slow
def test_two_hosts_split_the_work_and_one_takes_over_when_the_other_is_killed(
    tmp_path: Path, hosts: Hosts
) -> None:
    db = hosts["db"]
    with ExitStack() as servers:
        pg = servers.enter_context(EmbeddedPostgres(host=db.addr, enter=db.enter))
        nats = servers.enter_context(EmbeddedNats(host=db.addr, enter=db.enter))
        _run(tmp_path, hosts, pg, NatsHarness(nats))


def _reaches(host: Host, addr: str, port: int) -> bool:
    """Whether a process on ``host`` can connect to ``addr:port``."""
    code = f"import socket; socket.create_connection(({addr!r}, {port}), timeout=5)"
    proc = host.popen([sys.executable, "-c", code], stderr=subprocess.DEVNULL)
    return proc.wait(30) == 0


def _run(tmp_path: Path, hosts: Hosts, pg: EmbeddedPostgres, broker: NatsHarness) -> None:
    # The instances' hosts reach the store over the veths, and not on their own loopback.
    assert _reaches(hosts["w1"], pg.host, pg.port)
    assert not _reaches(hosts["w1"], "127.0.0.1", pg.port)
    db_url = pg.url
    create_load_table(db_url)
    cfg, pairs = _config(db_url, broker)
    config = tmp_path / "weir.yaml"
    config.write_text(json.dumps(cfg))  # JSON is YAML
    w1, w2 = (Instance(hosts[h], config, tmp_path / f"{h}.log") for h in ("w1", "w2"))

    # Weir does not balance: an instance takes every work nobody holds. So the test holds w2's
    # share while w1 starts, and pauses w1 while w2 takes it.
    blocker = _hold(db_url, SPLIT["w2"])
    w1.start()
    wait_for(lambda: all(_owners(db_url).get(w) == "w1" for w in SPLIT["w1"]), timeout=60,
             what=f"w1 to own {SPLIT['w1']}")  # fmt: skip
    w2.start()
    wait_for(lambda: "weir: instance" in w2.text(), timeout=60, what="w2 to start")
    w1.signal(signal.SIGSTOP)
    try:
        blocker.close()
        wait_for(lambda: all(_owners(db_url).get(w) == "w2" for w in SPLIT["w2"]),
                 what=f"w2 to own {SPLIT['w2']}")  # fmt: skip
    finally:
        w1.signal(signal.SIGCONT)
    assert _owners(db_url) == {w: h for h, works in SPLIT.items() for w in works}
    # Each instance reaches the store from its own host's address.
    assert _lease_clients(db_url) == {(h, hosts[h].addr) for h in ("w1", "w2")}
    wait_for(lambda: "streaming from slot" in w2.text(), what="w2 to stream")

    took: list[float] = []

    def kill_w2() -> None:
        killed = time.monotonic()
        w2.signal(signal.SIGKILL)
        wait_for(lambda: set(_owners(db_url).values()) == {"w1"}, timeout=30,
                 what="w1 to take w2's work over")  # fmt: skip
        took.append(time.monotonic() - killed)
        wait_for(lambda: "streaming from slot" in w1.text(), what="w1 to stream")
        took.append(time.monotonic() - killed)

    expected = load_with_interruptions(db_url, 3000, [1000], kill_w2)
    got = {}
    for events, records in pairs:
        got[events["name"]] = wait_delivered(broker, events, len(expected), settle=1.0)
        got[records["name"]] = wait_delivered(broker, records, 1)
    w1.signal(signal.SIGTERM)
    assert w1.proc.wait(30) == 0, w1.text()
    assert count_events(db_url) == len(expected)
    for events, records in pairs:
        check_delivered(db_url, got[events["name"]], broker.read(records), expected)
    print(f"takeover: leases {took[0]:.2f}s, streaming {took[1]:.2f}s")
    assert took[0] < TAKEOVER_BOUND, f"w1 took {took[0]:.1f}s to own w2's work"
    for work in SPLIT["w2"]:
        assert f"leases: {work} is w1:" in w1.text()
