"""`weir run` as a supervisor of worker processes (core/runtime/supervisor.py), under load: a
worker SIGKILLed alone is restarted and its leases taken back; the supervisor SIGKILLed takes
its workers with it; SIGTERM drains every worker and exits 0. NATS subscribers see every
change once and in per-record order each time.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from devkit.embedded import EmbeddedNats
from devkit.procs import alive
from tests.helpers.brokers import NatsHarness, wait_delivered
from tests.helpers.capture import count_events, wait_for
from tests.helpers.load import WeirProcess, create_load_table, load_with_interruptions
from tests.integration.test_forwarding_crash import _check, _connectors


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
    events, records = _connectors(broker)
    victims = iter(["connectors-0", "sources-0"])
    with WeirProcess(_config(tmp_path, db_url, [events, records]), tmp_path / "weir.log") as weir:
        wait_for(lambda: len(weir.workers()) == 3, what="three workers")
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
    _check(db_url, broker.read(events), broker.read(records), expected)
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
    nothing lost or doubled, and SIGTERM drains every worker and exits 0."""
    create_load_table(db_url)
    broker = NatsHarness(nats_server)
    events, records = _connectors(broker)
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
        weir.stop()
        assert not any(alive(p) for p in workers.values())
    assert count_events(db_url) == len(expected)
    _check(db_url, broker.read(events), broker.read(records), expected)
    log = weir.log_text()
    for name, pid in workers.items():
        assert f"weir: worker {name} (pid {pid}) drained" in log
    assert log.count("weir: instance ") == 2
