"""End to end under load: `weir run` killed with SIGKILL and restarted, for every broker (after
the NATS stream's duplicate window has passed; Kafka has none; SQS FIFO keeps 5 minutes;
webhook receivers drop repeats by idempotency key), and the NATS server taken away for 10 s.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from devkit.embedded import EmbeddedNats
from tests.connectors.nats.harness import NatsHarness
from tests.helpers.brokers import Harness, wait_delivered
from tests.helpers.capture import count_events, wait_for
from tests.helpers.load import (
    WeirProcess,
    check_delivered,
    consumed,
    crash_connectors,
    create_load_table,
    load_with_interruptions,
    wait_all_delivered,
)
from tests.helpers.weir import serving, weir_config


@pytest.mark.slow
def test_sigkill_under_load_consumers_see_every_change_once_in_order(
    tmp_path: Path, db_url: str, broker: Harness
) -> None:
    create_load_table(db_url)
    events, records = crash_connectors(broker)
    cfg = {"sources": [{"name": "app", "kind": "postgres", "url": db_url,
                        "tables": ["public.load"]}], "connectors": [events, records]}  # fmt: skip
    config = tmp_path / "weir.yaml"
    config.write_text(json.dumps(cfg))  # JSON is YAML
    with WeirProcess(config, tmp_path / "weir.log") as weir:
        expected = load_with_interruptions(db_url, 3000, [800, 2000], weir.kill_and_restart)
        wait_all_delivered(broker, events, records, len(expected))
        weir.stop()
    assert count_events(db_url) == len(expected)
    check_delivered(db_url, *consumed(broker, events, records), expected)
    assert weir.log_text().count("weir: instance ") == 3  # killed twice while streaming


@pytest.mark.slow
def test_a_second_instance_takes_over_when_the_owner_is_killed(
    tmp_path: Path, db_url: str, nats_server: EmbeddedNats
) -> None:
    """Two `weir run` on one store: the first owns the source and the connectors, the second
    waits; the first is killed under load, and the second takes over within the lease poll,
    with nothing lost, nothing twice and every record in order.
    """
    create_load_table(db_url)
    broker = NatsHarness(nats_server)
    events, records = crash_connectors(broker)
    cfg = {"sources": [{"name": "app", "kind": "postgres", "url": db_url,
                        "tables": ["public.load"]}], "connectors": [events, records]}  # fmt: skip
    config = tmp_path / "weir.yaml"
    config.write_text(json.dumps(cfg))
    taken_over: list[float] = []
    with (
        WeirProcess(config, tmp_path / "first.log") as first,
        WeirProcess(config, tmp_path / "second.log", standby=True) as second,
    ):
        wait_for(lambda: "weir: instance " in second.log_text(), what="the second instance")
        time.sleep(2)  # it has polled the leases, and found them taken

        def kill_the_owner() -> None:
            killed = time.monotonic()
            first.kill()
            wait_for(lambda: "streaming from slot" in second.log_text(), timeout=30,
                     what="the second instance to take the source over")  # fmt: skip
            taken_over.append(time.monotonic() - killed)

        assert "streaming from slot" not in second.log_text()  # a standby while the first lives
        expected = load_with_interruptions(db_url, 3000, [1000], kill_the_owner)
        wait_delivered(broker, events, len(expected), settle=1.0)
        wait_delivered(broker, records, 1)
        second.stop()
    assert count_events(db_url) == len(expected)
    check_delivered(db_url, broker.read(events), broker.read(records), expected)
    log = second.log_text()
    assert "connector:events is" in log and "connector:records is" in log
    assert taken_over[0] < 10, f"took {taken_over[0]:.1f}s"


@pytest.mark.slow
def test_nats_down_for_10s_under_load_loses_nothing(db_url: str) -> None:
    create_load_table(db_url)
    with EmbeddedNats() as server:
        broker = NatsHarness(server)
        events, records = crash_connectors(broker)

        def outage() -> None:
            server.stop()
            time.sleep(10)
            server.start()

        with serving(weir_config(db_url, [events, records], tables=["public.load"], schemas=[])):
            expected = load_with_interruptions(db_url, 12000, [500], outage)
            got = wait_delivered(broker, events, len(expected), settle=1.0)
            recs = broker.read(records)
    check_delivered(db_url, got, recs, expected)
