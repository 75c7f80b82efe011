"""Two `weir run` on two hosts of their own (network namespaces, tests/helpers/hosts.py), with
one store and one NATS server on a third: the second to start gets its share of the work (the
first gives it up: a source's capture or backfill, and two shards of the four of two sharded
connectors); the one that captures is SIGKILLed under load and the other takes all its work
over within the lease time; NATS subscribers see every change once, in per-record order, and
the table's rows.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg
import pytest

from core.runtime.service import LEASE_POLL
from devkit.embedded import EmbeddedNats, EmbeddedPostgres
from tests.connectors.nats.harness import NatsHarness
from tests.helpers.brokers import wait_delivered
from tests.helpers.capture import count_events, wait_for
from tests.helpers.hosts import Host, Hosts
from tests.helpers.load import (
    check_delivered,
    crash_connectors,
    create_load_table,
    load_with_interruptions,
)

WORKS = {"source:app", "backfill:app"} | {f"connector:{c}#{i}/2" for c in ("events", "records")
                                          for i in range(2)}  # fmt: skip
TAKEOVER_BOUND = LEASE_POLL + 2.0  # seconds: a poll, plus a start on a loaded 2-core machine


def _config(db_url: str, broker: NatsHarness) -> tuple[dict[str, Any], dict[str, Any]]:
    """The one config both instances run, and its events and records connectors (2 shards
    each)."""
    events, records = crash_connectors(broker)
    source = {"name": "app", "kind": "postgres", "url": db_url, "tables": ["public.load"]}
    connectors = [dict(events, shards=2), dict(records, shards=2)]
    return {"sources": [source], "connectors": connectors}, {"events": events, "records": records}


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
    return {(str(app).split(":")[2], str(addr)) for app, addr in rows}  # weir-leases:GROUP:HOST


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
    cfg, connectors = _config(db_url, broker)
    config = tmp_path / "weir.yaml"
    config.write_text(json.dumps(cfg))  # JSON is YAML
    w1, w2 = (Instance(hosts[h], config, tmp_path / f"{h}.log") for h in ("w1", "w2"))
    w1.start()
    wait_for(lambda: _owners(db_url) == dict.fromkeys(WORKS, "w1"), timeout=60,
             what="w1, alone, to own every work")  # fmt: skip
    w2.start()  # w1 gives w2 its share: one of source and backfill, two of the four shards
    wait_for(lambda: sorted(Counter(_owners(db_url).values()).values()) == [3, 3], timeout=60,
             what="the work to split between w1 and w2")  # fmt: skip
    owners = _owners(db_url)
    assert {owners["source:app"], owners["backfill:app"]} == {"w1", "w2"}
    assert "given up for another instance to take" in w1.text()
    # Each instance reaches the store from its own host's address.
    assert _lease_clients(db_url) == {(h, hosts[h].addr) for h in ("w1", "w2")}
    capturing, other = (w1, w2) if owners["source:app"] == "w1" else (w2, w1)
    wait_for(lambda: "streaming from slot" in capturing.text(), what="capture to stream")

    took: list[float] = []

    def kill_the_capturing_one() -> None:
        killed = time.monotonic()
        streamed = other.text().count("streaming from slot")
        capturing.signal(signal.SIGKILL)
        wait_for(lambda: _owners(db_url) == dict.fromkeys(WORKS, other.host.name), timeout=30,
                 what="the other to take all the work over")  # fmt: skip
        took.append(time.monotonic() - killed)
        wait_for(lambda: other.text().count("streaming from slot") > streamed,
                 what="the other to stream")  # fmt: skip
        took.append(time.monotonic() - killed)

    expected = load_with_interruptions(db_url, 3000, [1000], kill_the_capturing_one)
    got = wait_delivered(broker, connectors["events"], len(expected), settle=1.0)
    wait_delivered(broker, connectors["records"], 1)
    other.signal(signal.SIGTERM)
    assert other.proc.wait(30) == 0, other.text()
    assert count_events(db_url) == len(expected)
    check_delivered(db_url, got, broker.read(connectors["records"]), expected)
    print(f"takeover: leases {took[0]:.2f}s, streaming {took[1]:.2f}s")
    assert took[0] < TAKEOVER_BOUND, f"the other took {took[0]:.1f}s to own the killed one's work"
