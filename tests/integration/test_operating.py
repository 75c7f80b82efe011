"""Operating Weir: /metrics against what was delivered, health and readiness, `weir status`,
events retention and the slot-lag check.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from core.api.probes import reachable as _reachable
from core.config.model import WeirConfig
from core.runtime import jobs
from core.runtime.service import prepare, serve
from devkit.embedded import EmbeddedNats
from tests.connectors.nats.harness import NatsHarness
from tests.connectors.webhook.harness import WebhookHarness
from tests.connectors.webhook.receiver import Receiver
from tests.helpers import stored
from tests.helpers.api import api_serving
from tests.helpers.brokers import wait_delivered
from tests.helpers.capture import count_events, wait_for
from tests.helpers.weir import (
    RETAINED,
    captured_then_pruned,
    cursor_of,
    insert_t,
    serving,
    weir_config,
)


def samples(client: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = client.get("/metrics")
    assert r.status_code == 200, r.text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def test_metrics_count_what_was_delivered(table: str, webhook_receiver: Receiver) -> None:
    harness = WebhookHarness(webhook_receiver)
    hooks = harness.connector("hooks", "events", sources=["app"])
    harness.prepare(hooks)
    with api_serving(table, connectors=[hooks], consumers=[{"name": "w"}]) as client:
        insert_t(table, range(50))
        one = {"collection_id": "stripe:sub", "record_id": "1", "data": {}, "version": 1}
        r = client.post("/v1/sources/stripe/records", json={"records": [one]})
        assert r.json()["accepted"] == 1
        wait_for(lambda: cursor_of(table, "hooks")[0] == 50, what="hooks at the head")
        got = samples(client)
        hook = (("connector", "hooks"),)
        assert got[("weir_source_changes_total", (("source", "app"),))] == 50
        assert got[("weir_source_changes_total", (("source", "stripe"),))] == 1
        assert got[("weir_connector_delivered_total", hook)] == len(harness.read(hooks)) == 50
        assert got[("weir_connector_delivery_latency_seconds_count", hook)] == 50
        assert 0 < got[("weir_connector_delivery_latency_seconds_sum", hook)] < 50 * 30
        assert got[("weir_connector_in_flight", hook)] == 0
        lag = (("connector", "hooks"), ("source", "app"))
        assert got[("weir_cursor_lag_messages", lag)] == 0
        assert got[("weir_cursor_lag_seconds", lag)] == 0
        assert got[("weir_failed_messages", lag)] == 0
        assert got[("weir_source_slot_lag_bytes", (("source", "app"),))] >= 0
        assert got[("weir_store_up", ())] == 1
        wait_for(lambda: samples(client)[("weir_consumer_pending", (("consumer", "w"),))] == 51,
                 what="the consumer's queue")  # fmt: skip
        assert httpx.get(f"{client.base_url}/metrics").status_code == 401


def test_health_and_readiness_need_no_token(table: str) -> None:
    with api_serving(table) as client:
        r = httpx.get(f"{client.base_url}/health")
        assert (r.status_code, r.json()) == (200, {"status": "up"})
        r = httpx.get(f"{client.base_url}/ready")
        assert r.status_code == 200
        assert r.json() == {"status": "ready", "checks": {"store": "ok", "source app": "ok"}}


def test_a_source_that_does_not_answer_is_not_ready() -> None:
    reason = asyncio.run(_reachable("postgresql://weir:s3cret@127.0.0.1:1/app", "source app"))
    assert reason == (
        "cannot reach source app at 127.0.0.1:1: Connection refused; check that PostgreSQL "
        "runs there and accepts connections from this host"
    )


def test_weir_status_shows_lag_rate_and_failures(tmp_path: Path, table: str,
                                                 webhook_receiver: Receiver) -> None:  # fmt: skip
    harness = WebhookHarness(webhook_receiver)
    hooks = harness.connector("hooks", "events", retry={"max_attempts": 1})
    harness.prepare(hooks, only=["public:nothing"])  # refuses everything: the failed list
    config = tmp_path / "weir.yaml"
    source = {"name": "app", "kind": "postgres", "url": table, "schemas": ["public"]}
    config.write_text(json.dumps({"sources": [source], "connectors": [hooks]}))

    def status() -> dict[str, dict[str, str]]:
        """Each row of the two tables, by its first column, as {heading: value}."""
        out = subprocess.run(
            [sys.executable, "-m", "core.cli", "status", "--config", str(config),
             "--interval", "0.2"], capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        assert table.rsplit("@", 1)[0] not in out.stdout  # no URL (and no password) printed
        rows: dict[str, dict[str, str]] = {}
        for block in out.stdout.split("\n\n")[:2]:
            header, *lines = block.splitlines()
            starts = [m.start() for m in re.finditer(r"(?<!\S)\S+(?: \S+)*", header)]
            names = [header[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
            for line in lines:
                cells = [
                    line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)
                ]
                rows[cells[0]] = dict(zip(names, cells, strict=True))
        return rows

    with serving(weir_config(table, [hooks])):
        insert_t(table, range(3))
        wait_for(lambda: cursor_of(table, "hooks")[0] == 3, what="hooks past the refusals")
        now = status()
        assert now["hooks"]["OWNER"].startswith(socket.gethostname() + ":")  # this process
        # weir run writes what it runs is doing once a second: "streaming" soon, if not yet.
        wait_for(lambda: status()["app"]["STATE"] == "streaming", what="app streaming")
    insert_t(table, range(3, 10))  # captured later: lag on the slot, none in the store yet
    rows = status()
    assert {k: rows["app"][k] for k in ("KIND", "STATE", "EVENTS SEQ", "RECORDS SEQ", "NOTE")} == {
        "KIND": "postgres", "STATE": "not running", "EVENTS SEQ": "3", "RECORDS SEQ": "3",
        "NOTE": "slot not being read"}  # fmt: skip
    hook = rows["hooks"]
    assert (hook["STATE"], hook["SOURCE"], hook["BEHIND"], hook["FAILED"], hook["OWNER"]) == (
        "not running", "app", "0", "3", "-")  # fmt: skip


def test_retention_deletes_old_events_and_names_connectors_behind(
    table: str, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = WeirConfig.model_validate({
        "store": {"events_retention": "7d"},
        "sources": [{"name": "app", "kind": "postgres", "url": table, "schemas": ["public"]}],
    })  # fmt: skip
    store = prepare(cfg)
    with serving(cfg):
        insert_t(table, range(6))
        wait_for(lambda: count_events(table) == 6, what="capture")
        insert_t(table, range(6, 10))  # in batches of their own
        wait_for(lambda: count_events(table) == 10, what="capture")
    with psycopg.connect(table, autocommit=True) as conn:
        conn.execute("UPDATE weir.event_batches SET inserted_at = now() - interval '8 days'"
                     " WHERE last_seq <= 6")  # fmt: skip
        conn.execute("INSERT INTO weir.cursors (connector, sync_id, stream, seq) SELECT 'slow',"
                     " sync_id, 'events', 2 FROM weir.sources")  # fmt: skip
    with caplog.at_level(logging.WARNING):
        assert jobs.prune_events(cfg, store) == 6
    assert [e["seq"] for e in stored.events(table)] == [7, 8, 9, 10]
    assert "slow had not delivered 4 events of source app" in caplog.text
    assert jobs.prune_events(cfg, store) == 0
    # The records stream keeps every record's newest version, their events gone or not.
    live = stored.records(table, live_only=True)
    assert sorted(r["record"]["id"] for r in live) == list(range(10))
    assert [r["seq"] for r in live] == list(range(1, 11))


def test_a_start_in_events_retention_deleted_is_told_and_begins_at_the_first_kept(
    table: str, nats_server: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/design.md “Guarantees” (**Nothing lost silently**, **Start positions**): a new
    connector whose ``{time: …}`` or ``{seq: N}`` start falls in events retention deleted
    starts at the first kept event and says so in one line naming them; ``beginning`` (every
    retained message) and a time after them say nothing. Before, it started there silently."""

    with psycopg.connect(table) as conn:
        before = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
    between = captured_then_pruned(table)
    nats = NatsHarness(nats_server)
    starts = {"at_time": {"time": before.isoformat()}, "at_seq": {"seq": 2},
              "beginning": "beginning", "after": {"time": between.isoformat()}}  # fmt: skip
    connectors = [nats.connector(name, "events", start_position=s) for name, s in starts.items()]
    for c in connectors:
        nats.prepare(c)
    with caplog.at_level(logging.WARNING), serving(weir_config(table, connectors, store=RETAINED)):
        got = {c["name"]: wait_delivered(nats, c, 3) for c in connectors}
    for name, delivered in got.items():
        assert sorted(d.payload["record"]["id"] for d in delivered) == [5, 6, 7], name
    said = sorted(r.getMessage() for r in caplog.records if "start_position" in r.getMessage())
    assert said == [
        f"connector {name}: its start_position begins in events {first} to 5 of source app, which "
        "retention deleted (store.events_retention); it starts at the first kept, 6"
        for name, first in (("at_seq", 2), ("at_time", 1))
    ]


def test_a_start_time_still_to_come_waits_and_then_delivers_what_is_written_after_it(
    table: str, nats_server: EmbeddedNats
) -> None:
    """docs/design.md “Guarantees” (**Start positions**): ``{time: T}`` delivers what is
    written at or after T; a T still to come waits for it: rows written before T are not
    sent, rows written after it are."""
    with psycopg.connect(table) as conn:
        at = conn.execute("SELECT now() + interval '4 seconds'").fetchone()[0]  # type: ignore[index]
    nats = NatsHarness(nats_server)
    c = nats.connector("later", "events", start_position={"time": at.isoformat()})
    control = nats.connector("all", "events")
    for each in (c, control):
        nats.prepare(each)
    with serving(weir_config(table, [c, control])):
        wait_for(lambda: cursor_of(table, "all")[0] >= 0, what="the control connector's start")
        time.sleep(1)  # the other one has started too (its cursor made, before the fix)
        insert_t(table, range(3))
        wait_for(lambda: count_events(table) == 3, what="capture")
        with psycopg.connect(table) as conn:
            wait_for(
                lambda: conn.execute("SELECT clock_timestamp() > %s", (at,)).fetchone()[0], what="T"
            )
        insert_t(table, range(3, 6))
        got = wait_delivered(nats, c, 3, settle=2.0)
    assert sorted(d.payload["record"]["id"] for d in got) == [3, 4, 5]


def test_connectors_hear_commits_again_after_the_store_drops_their_listener(
    table: str, nats_server: EmbeddedNats
) -> None:
    """docs/design.md “Guarantees”: a caught-up connector is woken by the store's commit
    notification, not a poll. The store ends the listening connection (``weir:notify``): it
    comes back within seconds, and changes committed after it still reach NATS."""

    def listener() -> int | None:
        with psycopg.connect(table) as conn:
            row = conn.execute("SELECT pid FROM pg_stat_activity"
                               " WHERE application_name = 'weir:notify'").fetchone()  # fmt: skip
        return row[0] if row else None

    nats = NatsHarness(nats_server)
    c = nats.connector("hear", "events")
    nats.prepare(c)
    with serving(weir_config(table, [c])):
        insert_t(table, range(3))
        wait_delivered(nats, c, 3)
        first = listener()
        assert first is not None
        with psycopg.connect(table, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(%s)", (first,))
        wait_for(lambda: listener() not in (None, first), what="the listener to come back")
        insert_t(table, range(3, 6))
        got = wait_delivered(nats, c, 6)
    assert sorted(d.payload["record"]["id"] for d in got) == list(range(6))


def test_slot_lag_check_warns_when_wal_piles_up(table: str) -> None:
    cfg = WeirConfig.model_validate({"sources": [
        {"name": "app", "kind": "postgres", "url": table, "schemas": ["public"],
         "slot_lag_warning": "1KiB"}]})  # fmt: skip
    prepare(cfg)
    assert jobs.check_slots(cfg) == []
    insert_t(table, range(200), body="x" * 100)  # nothing captures: the slot holds the WAL
    [warning] = jobs.check_slots(cfg)
    assert "holds back" in warning and "nothing is reading the slot" in warning


def _count(url: str, q: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(q).fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def test_a_shutdown_drains_every_connector_within_one_grace(table: str) -> None:
    """``WEIR_SHUTDOWN_GRACE`` is the whole drain's time: each stuck connector was waited for a
    grace of its own, so two on an unreachable Kafka broker took 60 s of a 30 s grace (found
    when a test of the API's schema made such connectors and weir did not stop in 60 s)."""
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens there: the connectors' batches never leave
    kafka = [{"name": f"k{i}", "type": "kafka", "stream": "events", "retry": {"max_attempts": None},
              "kafka": {"bootstrap_servers": f"127.0.0.1:{port}", "topic": "t"}}
             for i in range(8)]  # fmt: skip
    cfg = weir_config(table, kafka)
    prepare(cfg)
    stop = threading.Event()
    ended: list[float] = []

    def run() -> None:
        serve(cfg, stop, grace=2.0)
        ended.append(time.monotonic())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(4)  # each connector reconnecting to a broker that is not there
    stopped = time.monotonic()
    stop.set()
    thread.join(60)
    assert ended and ended[0] - stopped < 2.0 + 4, ended[0] - stopped  # one grace, and cleanup
