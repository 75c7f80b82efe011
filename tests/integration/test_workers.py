"""`weir run` as a supervisor of worker processes (core/runtime/supervisor.py), under load: a
worker SIGKILLed alone is restarted and its leases taken back; the supervisor SIGKILLed takes
its workers with it; SIGTERM drains every worker and exits 0. NATS subscribers see every
change once and in per-record order each time. `/metrics` on the `api` worker serves what
every worker counted, a worker SIGKILLed and restarted included.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from devkit.embedded import EmbeddedNats
from devkit.procs import alive
from devkit.server import free_port
from tests.connectors.nats.harness import NatsHarness
from tests.helpers.api import TOKEN
from tests.helpers.brokers import wait_delivered
from tests.helpers.capture import count_events, wait_for
from tests.helpers.load import (
    WeirProcess,
    check_delivered,
    crash_connectors,
    create_load_table,
    load_with_interruptions,
)
from tests.integration.test_operating import samples


def _config(tmp_path: Path, db_url: str, connectors: list[dict[str, Any]]) -> Path:
    cfg = {"sources": [{"name": "app", "kind": "postgres", "url": db_url,
                        "tables": ["public.load"]}],
           "connectors": connectors, "workers": {"connectors": 2}}  # fmt: skip
    config = tmp_path / "weir.yaml"
    config.write_text(json.dumps(cfg))
    return config


@pytest.mark.slow
def test_a_worker_killed_alone_is_restarted_and_nothing_is_lost_or_doubled(
    tmp_path: Path, db_url: str, nats_server: EmbeddedNats
) -> None:
    """A connectors worker, then the sources worker, SIGKILLed under load: the supervisor
    logs it and starts it again, the new process takes the leases back, and the other
    workers go on undisturbed."""
    create_load_table(db_url)
    broker = NatsHarness(nats_server)
    events, records = crash_connectors(broker)
    victims = iter(["connectors-0", "sources-0"])
    with WeirProcess(_config(tmp_path, db_url, [events, records]), tmp_path / "weir.log") as weir:
        wait_for(lambda: len(weir.workers()) == 3, what="three workers")
        wait_for(lambda: "leases: connector:events is" in weir.log_text(), timeout=30,
                 what="connectors-0 to take its lease before it is killed")  # fmt: skip
        first = weir.workers()

        def kill_a_worker() -> None:
            name = next(victims)
            pid = weir.workers()[name]
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: weir.workers().get(name, pid) != pid, timeout=30,
                     what=f"{name} restarted")  # fmt: skip
            assert (
                f"worker {name} (pid {pid}) killed by SIGKILL; restarting it in" in weir.log_text()
            )

        expected = load_with_interruptions(db_url, 3000, [800, 2000], kill_a_worker)
        wait_delivered(broker, events, len(expected), settle=1.0)
        wait_delivered(broker, records, 1)
        assert weir.workers()["connectors-1"] == first["connectors-1"]  # never disturbed
        weir.stop()
    assert count_events(db_url) == len(expected)
    check_delivered(db_url, broker.read(events), broker.read(records), expected)
    log = weir.log_text()
    assert log.count("streaming from slot") == 2  # the sources worker's first and second
    assert log.count("leases: connector:events is") == 2  # connectors-0, first and restarted
    assert log.count("leases: connector:records is") == 1  # connectors-1
    assert log.count("weir: instance ") == 1


@pytest.mark.slow
def test_the_supervisor_killed_takes_its_workers_and_sigterm_drains_them_all(
    tmp_path: Path, db_url: str, nats_server: EmbeddedNats
) -> None:
    """The supervisor SIGKILLed under load: its workers are gone within two seconds (no
    orphan holds a lease against the next instance), the restarted `weir run` goes on with
    nothing lost or doubled, and SIGTERM to the process group drains every worker and exits 0."""
    create_load_table(db_url)
    broker = NatsHarness(nats_server)
    events, records = crash_connectors(broker)
    with WeirProcess(_config(tmp_path, db_url, [events, records]), tmp_path / "weir.log") as weir:
        wait_for(lambda: len(weir.workers()) == 3, what="three workers")

        def kill_the_supervisor() -> None:
            workers = weir.workers()
            weir.kill()
            wait_for(lambda: not any(alive(p) for p in workers.values()), timeout=2,
                     what="the workers to die with the supervisor")  # fmt: skip
            weir.start()
            wait_for(lambda: weir.log_text().count("streaming from slot") == 2, timeout=30,
                     what="the restarted weir run to stream")  # fmt: skip

        expected = load_with_interruptions(db_url, 3000, [1000], kill_the_supervisor)
        wait_delivered(broker, events, len(expected), settle=1.0)
        wait_delivered(broker, records, 1)
        workers = weir.workers()
        weir.stop(group=True)  # each worker gets SIGTERM twice: from the group and the supervisor
        assert not any(alive(p) for p in workers.values())
    assert count_events(db_url) == len(expected)
    check_delivered(db_url, broker.read(events), broker.read(records), expected)
    log = weir.log_text()
    for name, pid in workers.items():
        assert f"weir: worker {name} (pid {pid}) drained" in log
    assert "second signal" not in log
    assert log.count("weir: instance ") == 2


def test_metrics_served_by_the_api_worker_count_every_worker_and_survive_a_restart(
    tmp_path: Path, db_url: str, nats_server: EmbeddedNats
) -> None:
    """Capture counts in `sources-0`, delivery in `connectors-0`, `api` serves the sum, with the
    types of `--single-process`; the counts of a connectors worker SIGKILLed stay in the totals
    after its restart, its in-flight gauge leaves them, and the run's metric files go with it."""
    create_load_table(db_url)
    broker = NatsHarness(nats_server)
    events = broker.connector("events", "events")
    broker.prepare(events)
    port = free_port()
    cfg = {"sources": [{"name": "app", "kind": "postgres", "url": db_url,
                        "tables": ["public.load"]}], "connectors": [events],
           "api": {"listen": f"127.0.0.1:{port}", "tokens": [TOKEN]}}  # fmt: skip
    (config := tmp_path / "weir.yaml").write_text(json.dumps(cfg))
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                          headers={"Authorization": f"Bearer {TOKEN}"})  # fmt: skip

    def write(first: int, n: int) -> None:
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("INSERT INTO load SELECT i, 0 FROM generate_series(%s::int, %s::int) i",
                         (first, first + n - 1))  # fmt: skip

    def totals_at(n: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        got: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

        def counted() -> bool:
            try:
                got.update(samples(client))
            except httpx.TransportError:
                return False
            # The in-flight gauge is set by the session's loop, at its next turn after the acks.
            return got.get(("weir_connector_delivered_total", conn)) == n and got.get(
                ("weir_connector_in_flight", conn)) == 0  # fmt: skip

        wait_for(counted, timeout=60, what=f"/metrics to count {n} deliveries, none in flight")
        return got

    conn, src = (("connector", "events"),), (("source", "app"),)
    with client, WeirProcess(config, tmp_path / "weir.log") as weir:
        wait_for(lambda: len(weir.workers()) == 3, what="three workers")
        shared = Path(_environ(weir.workers()["api"])["PROMETHEUS_MULTIPROC_DIR"])
        write(1, 200)
        got = totals_at(200)
        assert got[("weir_source_changes_total", src)] == 200
        assert got[("weir_connector_delivery_latency_seconds_count", conn)] == 200
        assert 0 < got[("weir_connector_delivery_latency_seconds_sum", conn)] < 200 * 30
        assert got[("weir_connector_failed_total", conn)] == 0
        assert got[("weir_connector_retried_total", conn)] == 0
        assert got[("weir_connector_in_flight", conn)] == 0
        assert got[("weir_store_up", ())] == 1
        types = {f.name: f.type for f in text_string_to_metric_families(
            client.get("/metrics").text)}  # fmt: skip
        assert types["weir_source_changes"] == types["weir_connector_delivered"] == "counter"
        assert types["weir_connector_in_flight"] == "gauge"
        assert types["weir_connector_delivery_latency_seconds"] == "histogram"

        pid = weir.workers()["connectors-0"]
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: weir.workers().get("connectors-0", pid) != pid, timeout=30,
                 what="connectors-0 restarted")  # fmt: skip
        assert not list(shared.glob(f"gauge_livesum_{pid}.db"))  # its in-flight no longer counts
        write(201, 150)
        got = totals_at(350)
        assert got[("weir_source_changes_total", src)] == 350
        assert got[("weir_connector_delivery_latency_seconds_count", conn)] == 350
        assert got[("weir_connector_in_flight", conn)] == 0
        assert len(wait_delivered(broker, events, 350, settle=0.5)) == 350
        weir.stop()
    assert not shared.exists()


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(e.decode().split("=", 1) for e in raw if b"=" in e)


def test_workers_run_weirs_code_not_a_core_folder_where_weir_is_started(
    tmp_path: Path, db_url: str
) -> None:
    """`weir run` started in a directory that holds a `core/` of its own: its workers run Weir
    (they ran that folder's code: any writable directory could run code inside Weir)."""
    create_load_table(db_url)
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "__init__.py").write_text("raise SystemExit(7)\n")
    config = _config(tmp_path, db_url, [])
    log = tmp_path / "weir.log"
    weir = Path(sys.executable).with_name("weir")  # the installed command, as users run it
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(weir), "run", "--config", str(config)], cwd=tmp_path,
                                stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        wait_for(lambda: "streaming from slot" in log.read_text(), what="capture to stream")
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("INSERT INTO load (id, v) VALUES (1, 1)")
        wait_for(lambda: count_events(db_url) == 1, what="the insert to be captured")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
    assert "exited with status" not in log.read_text()
