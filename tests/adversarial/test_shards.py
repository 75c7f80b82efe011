"""Sharded connectors (core/shards.py, core/store/cursors.py) against real servers: shards on
worker processes keep every change once and each record's messages in order, also when a
worker or all of weir is SIGKILLed, and when the number of shards changes between two runs
(SIGKILLed each time, so the old shards' cursors and broker marks lag behind what they sent).
A re-split waits while a shard of the old split still runs in another instance. The store
computes a record's shard as the Python mirror does.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.shards import Shard, shard_of
from core.store.migrations import migrate
from core.store.shared import lock_key
from devkit.embedded import EmbeddedNats, EmbeddedPostgres
from tests.conftest import fresh_database
from tests.connectors.nats.harness import NatsHarness
from tests.helpers.brokers import Harness, wait_delivered
from tests.helpers.capture import count_events, wait_for
from tests.helpers.load import (
    WeirProcess,
    check_delivered,
    consumed,
    crash_connectors,
    create_load_table,
    first_seen,
    load_with_interruptions,
    wait_all_delivered,
)
from tests.helpers.sql import execute


def _write(config: Path, db_url: str, connectors: list[dict[str, Any]], shards: int) -> Path:
    cfg = {"sources": [{"name": "app", "kind": "postgres", "url": db_url,
                        "tables": ["public.load"]}],
           "connectors": [dict(c, shards=shards) for c in connectors],
           "workers": {"connectors": 2}}  # fmt: skip
    config.write_text(json.dumps(cfg))  # JSON is YAML
    return config


@pytest.mark.slow
def test_changing_the_number_of_shards_under_load_loses_and_doubles_nothing(
    tmp_path: Path, db_url: str, broker: Harness
) -> None:
    """2 shards, SIGKILL, 3 shards, SIGKILL, unsharded: each restart re-splits from cursors
    that lag behind what the old shards had sent, and the broker's duplicate window is too
    short to hide a resend."""
    create_load_table(db_url)
    events, records = crash_connectors(broker)
    config = _write(tmp_path / "weir.yaml", db_url, [events, records], 2)
    counts = iter([2, 3, 1])
    shards = next(counts)
    with WeirProcess(config, tmp_path / "weir.log") as weir:

        def resplit() -> None:
            nonlocal shards
            keys = [Shard(i, shards).key(c["name"]) for c in (events, records)
                    for i in range(shards)]  # fmt: skip
            wait_for(lambda: all(f"connector {k}: streaming" in weir.log_text() for k in keys),
                     what="every shard to stream")  # fmt: skip
            time.sleep(random.uniform(0.0, 0.3))
            weir.kill()
            shards = next(counts)
            _write(config, db_url, [events, records], shards)
            weir.start()

        expected = load_with_interruptions(db_url, 1500, [500, 1000], resplit)  # moto is slow
        wait_all_delivered(broker, events, records, len(expected))
        weir.stop()
    assert count_events(db_url) == len(expected)
    check_delivered(db_url, *consumed(broker, events, records), expected)
    log = weir.log_text()
    for stream in ("events", "records"):
        assert f"connector {stream}: split into 3 shards (it had 2)" in log
        assert f"connector {stream}: unsplit (it had 3)" in log
        assert f"leases: connector:{stream}#2/3 is" in log


@pytest.mark.slow
def test_a_resplit_skips_what_each_old_shard_sent_however_far_apart(
    tmp_path: Path, db_url: str, broker: Harness, pg_server: EmbeddedPostgres
) -> None:
    """Shard 1 of 2 is held back (the test holds its lease) while shard 0 sends all of its
    records; weir is SIGKILLed and re-split into 3: the new shards start from shard 1's cursor
    and must not send shard 0's messages again, whose broker mark lags behind them."""
    create_load_table(db_url)
    events = broker.connector("events", "events", batch={"max_messages": 20})
    broker.prepare(events, dedupe=False)
    config = _write(tmp_path / "weir.yaml", db_url, [events], 2)
    insert = "INSERT INTO load (id, v) SELECT g, 0 FROM generate_series(1, %s) g"
    mine = [i for i in range(1, 401) if shard_of("public:load", str(i), 2) == 0]
    with psycopg.connect(db_url, autocommit=True) as hold:
        lease = lock_key("weir", "lease", "connector:" + Shard(1, 2).key("events"))
        hold.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (lease,))
        with WeirProcess(config, tmp_path / "weir.log") as weir:
            execute(db_url, insert, params=(400,))
            wait_for(lambda: len(first_seen(broker.read(events))) >= len(mine),
                     what="shard 0 to send its records")  # fmt: skip
            weir.kill()
    got = {int(d.payload["record"]["id"]) for d in broker.read(events)}
    assert got == set(mine), "shard 0 sent what is not its own, or missed some"
    _write(config, db_url, [events], 3)
    with WeirProcess(config, tmp_path / "weir.log") as weir:
        wait_for(lambda: len(first_seen(broker.read(events))) >= 400, what="every change")
        time.sleep(1.0)  # anything more (a duplicate) would show
        weir.stop()
    got_events = broker.consume(events)
    if broker.replays:  # webhooks: what a receiver that drops repeated idempotency keys keeps
        got_events = first_seen(got_events)
    assert sorted(d.seq for d in got_events) == list(range(1, 401)), "lost or sent twice"
    assert "connector events: split into 3 shards (it had 2) from seq 0" in weir.log_text()


@pytest.mark.slow
def test_shards_on_two_workers_survive_one_killed_alone(
    tmp_path: Path, db_url: str, nats_server: EmbeddedNats
) -> None:
    """Two shards of each connector over two connectors workers: connectors-1 SIGKILLed under
    load is restarted and takes its shards back, connectors-0 goes on undisturbed."""
    create_load_table(db_url)
    broker = NatsHarness(nats_server)
    events, records = crash_connectors(broker)
    config = _write(tmp_path / "weir.yaml", db_url, [events, records], 2)
    with WeirProcess(config, tmp_path / "weir.log") as weir:
        wait_for(lambda: len(weir.workers()) == 3, what="three workers")
        first = weir.workers()
        # every shard taken before the kill (on a slow machine the load reached its kill
        # before connectors-1 had taken its shards, which it then took once only)
        wait_for(lambda: all(f"leases: connector:{s}#{k}/2 is" in weir.log_text()
                             for s in ("events", "records") for k in (0, 1)),
                 what="all four shards taken")  # fmt: skip

        def kill_connectors_1() -> None:
            pid = weir.workers()["connectors-1"]
            os.kill(pid, signal.SIGKILL)
            wait_for(lambda: weir.workers().get("connectors-1", pid) != pid, timeout=30,
                     what="connectors-1 restarted")  # fmt: skip

        expected = load_with_interruptions(db_url, 2000, [900], kill_connectors_1)
        wait_delivered(broker, events, len(expected), settle=1.0)
        wait_delivered(broker, records, 1)
        assert weir.workers()["connectors-0"] == first["connectors-0"]
        weir.stop()
    check_delivered(db_url, broker.read(events), broker.read(records), expected)
    log = weir.log_text()
    # Shard k of the file's four runs in worker k mod 2: the events' and records' shard 1/2
    # in connectors-1, taken twice (first start and restart); shard 0/2 once.
    for stream in ("events", "records"):
        assert log.count(f"leases: connector:{stream}#1/2 is") == 2
        assert log.count(f"leases: connector:{stream}#0/2 is") == 1


@pytest.mark.slow
def test_a_resplit_waits_while_a_shard_of_the_old_split_runs_elsewhere(
    tmp_path: Path, db_url: str, nats_server: EmbeddedNats
) -> None:
    """Two instances on one store, one with 2 shards and one with 3: the second says why it
    waits, and re-splits when the first stops; the subscriber gets every change once."""
    create_load_table(db_url)
    broker = NatsHarness(nats_server)
    events = broker.connector("events", "events", batch={"max_messages": 50})
    broker.prepare(events, dedupe=False)
    old = _write(tmp_path / "old.yaml", db_url, [events], 2)
    new = _write(tmp_path / "new.yaml", db_url, [events], 3)
    insert = "INSERT INTO load (id, v) SELECT g, 0 FROM generate_series(%s::int, %s::int) g"
    with WeirProcess(old, tmp_path / "old.log") as first:
        execute(db_url, insert, params=(1, 300))
        wait_delivered(broker, events, 300)
        with WeirProcess(new, tmp_path / "new.log", standby=True) as second:
            waits = "cannot split into 3 shards while shard 0/2, shard 1/2 of its 2 shards"
            wait_for(lambda: waits in second.log_text(), what="the second to wait")
            execute(db_url, insert, params=(301, 600))
            first.stop()
            wait_for(lambda: "split into 3 shards (it had 2)" in second.log_text(), timeout=60,
                     what="the re-split")  # fmt: skip
            execute(db_url, insert, params=(601, 900))
            wait_delivered(broker, events, 900, settle=1.0)
            second.stop()
    got = broker.read(events)
    assert sorted(d.seq for d in got) == list(range(1, 901)), "a change lost or sent twice"


@pytest.fixture(scope="module")
def store_url(pg_server: EmbeddedPostgres) -> Iterator[str]:
    with fresh_database(pg_server) as url:
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn, "weir")
        yield url


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    collection=st.text(min_size=1, max_size=40).filter(lambda s: "\x00" not in s),
    record=st.none() | st.text(max_size=300).filter(lambda s: "\x00" not in s),
    shards=st.integers(1, 256),
)
def test_the_store_puts_a_record_in_the_shard_python_says(
    store_url: str, collection: str, record: str | None, shards: int
) -> None:
    with psycopg.connect(store_url) as conn:
        row = conn.execute("SELECT weir.shard_of(%s, %s, %s)", (collection, record, shards))
        assert row.fetchone() == (shard_of(collection, record, shards),)


@pytest.mark.slow
def test_an_owner_whose_lease_connection_drops_never_sends_beside_the_next_one(
    tmp_path: Path, db_url: str, nats_server: EmbeddedNats
) -> None:
    """Two instances share 4 shards of each connector; under load, a connectors worker's lease
    session is terminated by the store (a DBA, a proxy, a failover) five times while the worker
    itself runs on: the other instance takes the shards over at once, but sends only after the
    old owner's session ended (its fence), so nothing is sent twice or out of order."""
    create_load_table(db_url)
    broker = NatsHarness(nats_server)
    events, records = crash_connectors(broker)
    config = _write(tmp_path / "weir.yaml", db_url, [events, records], 4)
    terminate = (
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = ("
        " SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'weir-leases:connectors-%'"
        " ORDER BY random() LIMIT 1)"
    )
    with (
        WeirProcess(config, tmp_path / "a.log") as a,
        WeirProcess(config, tmp_path / "b.log", standby=True) as b,
    ):
        wait_for(lambda: "given up for another instance" in a.log_text(), timeout=60,
                 what="the instances to share the shards")  # fmt: skip

        def drop_a_lease_connection() -> None:
            execute(db_url, terminate)
            time.sleep(1.0)

        expected = load_with_interruptions(db_url, 3000, [400, 800, 1200, 1600, 2000],
                                           drop_a_lease_connection)  # fmt: skip
        wait_delivered(broker, events, len(expected), settle=1.0)
        wait_delivered(broker, records, 1)
        b.stop()
        a.stop()
    check_delivered(db_url, broker.read(events), broker.read(records), expected)
    logs = a.log_text() + b.log_text()
    assert logs.count("lost the store connection") >= 5
