"""Findings of the Nov 29 (j) outside try-out of the store (records stream, start positions, retention, crashes), against real servers: each test states a promise of README.md / docs/ and fails on the code it was written against, as its docstring tells."""  # noqa: E501

from __future__ import annotations

import copy
import logging
import re
import time
from pathlib import Path

import psycopg
import pytest

from core.runtime import jobs
from core.store import Store
from devkit.embedded import EmbeddedNats, EmbeddedPostgres
from tests.adversarial.test_tryout_nov29c_ops import (  # noqa: F401 (quickstart_pg: a fixture)
    _env,
    _quickstart_config,
    quickstart_pg,
)
from tests.connectors.nats.harness import NatsHarness
from tests.helpers import stored
from tests.helpers.api import api_config, api_serving, receive
from tests.helpers.brokers import Delivered, wait_delivered
from tests.helpers.capture import wait_for
from tests.helpers.cli import run_again, weir
from tests.helpers.quickstart import db_url as _db
from tests.helpers.sql import execute
from tests.helpers.weir import serving, weir_config


def _age(url: str, where: str = "true") -> None:
    """The events batches (``where``) as if stored 8 days ago: past the default 7d retention."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE weir.event_batches SET inserted_at = now() - interval '8 days'"
                     f" WHERE {where}")  # fmt: skip


def _queued(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM weir.consumer_messages").fetchone()
    return int(row[0]) if row else 0


SLOW = {"name": "slow", "stream": "events", "ack_wait_ms": 30000}  # an HTTP pull consumer


def _queue_and_prune(table: str, caplog: pytest.LogCaptureFixture) -> int:
    """20 inserts into ``t`` moved into consumer ``SLOW``'s queue, then aged past retention and
    the retention job run (its warnings in ``caplog``): how many events it deleted."""
    execute(table, "INSERT INTO t SELECT i, 'x' FROM generate_series(1, 20) i")
    wait_for(lambda: _queued(table) == 20, what="the consumer's queue to fill")
    _age(table)
    with caplog.at_level(logging.WARNING):
        return jobs.prune_events(api_config(table, 1), Store(table))


def _ids(got: list[Delivered]) -> list[int]:
    return sorted(int(d.payload["metadata"]["record_id"]) for d in got)


# --- retention ---------------------------------------------------------------------------------


def test_retention_of_events_a_consumer_queued_but_never_delivered_is_said(
    table: str, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/design.md “Guarantees”, **Nothing lost silently**: "Retention warns about a
    connector that had not delivered the events it deletes"; docs/consume-api.md “Delivery”:
    "State is in the store: workers and restarts lose nothing". An HTTP pull consumer
    ``slow`` (events stream) whose worker is behind: 20 inserts are captured and moved into its
    queue (``weir.consumer_messages`` holds 20, its cursor passed them), none received yet. The
    events pass ``events_retention`` and the retention job runs (``jobs.prune_events``:
    deleted 20). The next receive answers ``data: []``; ``num_pending`` is 0, the consumer's
    failed list is empty, and retention logged no warning at all (``behind`` in
    core/store/retention.py counts only events past a cursor, and a queued event is behind
    it): 20 messages the consumer still had to deliver are gone without a word (the queue rows
    are "buried" as pruned, core/store/consumers.py ``receive``)."""
    with api_serving(table, consumers=[SLOW]) as client:
        deleted = _queue_and_prune(table, caplog)
        got = receive(client, "slow", 100)
        failed = client.get("/v1/http-consumers/slow/failed").json()["data"]
    said = [r.getMessage() for r in caplog.records if "retention" in r.getMessage()]
    assert deleted == 20
    assert len(got) == 20 or failed or any("slow" in m for m in said), (len(got), failed, said)


def test_a_failed_event_retried_after_retention_is_sent_or_kept(
    table: str, nats_server: EmbeddedNats
) -> None:
    """docs/design.md “Guarantees”, **Nothing lost silently**: a message the broker refuses
    "goes to the failed list ... with the error, and the connector goes on; an operator sees
    it there and retries or discards it". An events connector to NATS with ``retry:
    {max_attempts: 1}`` whose JetStream stream takes only ``public:t``: the insert into table
    ``u`` (``{"id": 7}``) goes to its failed list ("no JetStream stream takes this subject"),
    the inserts into ``t`` are delivered. Retention then deletes those events (older than
    ``events_retention``); the operator adds a stream for ``public:u`` and asks ``POST
    /v1/connectors/ev/failed/retry {"all": true}`` (200). The entry leaves the failed list
    and nothing reaches NATS: the message, whose payload the failed list holds, is dropped
    for good. Without the retention run the same retry delivers ``{"id": 7}`` (it holds).
    core/store/failed.py ``_RETRIES`` asks ``PRESENT["events"]`` whether the event is "still
    in the stream", and core/store/reader.py ``retries`` takes a pruned event for one "a newer
    version replaced", which session.py resolves unsent."""
    execute(table, "CREATE TABLE u (id int PRIMARY KEY)")
    nats = NatsHarness(nats_server)
    c = nats.connector("ev", "events", retry={"initial": "10ms", "max_attempts": 1})
    c_u = copy.deepcopy(c)
    c_u["nats"]["events_stream"]["name"] += "-U"
    nats.prepare(c, only=["public:t"])
    with api_serving(table, connectors=[c]) as client:
        execute(table, "INSERT INTO t VALUES (1, 'a')", "INSERT INTO u VALUES (7)",
                "INSERT INTO t VALUES (2, 'b')")  # fmt: skip
        wait_for(lambda: client.get("/v1/connectors/ev/failed").json()["data"] != [],
                 what="u's event on the failed list")  # fmt: skip
        wait_delivered(nats, c, 2)
        _age(table)
        assert jobs.prune_events(api_config(table, 1), Store(table)) == 3
        assert len(client.get("/v1/connectors/ev/failed").json()["data"]) == 1
        nats.prepare(c_u, only=["public:u"])  # the operator fixes the destination
        r = client.post("/v1/connectors/ev/failed/retry", json={"all": True})
        assert r.status_code == 200, r.text
        time.sleep(3)
        after = client.get("/v1/connectors/ev/failed").json()["data"]
        sent = [d.payload["record"] for d in nats.read(c_u)]
    assert sent == [{"id": 7}] or after, f"sent {sent}; failed list {after}"


# --- start positions ---------------------------------------------------------------------------


def test_a_records_time_start_after_retention_and_a_postgres_crash_starts_at_that_time(
    nats_server: EmbeddedNats,
) -> None:
    """docs/design.md “Guarantees”, **Start positions**: ``{time: …}`` is where a connector's
    first start begins (docs/configuration.md: "a seq or a time"); “The store's layout”: the
    records index,
    emptied by a Postgres crash, is rebuilt "from the batches". Rows 1-5 are inserted, then at
    time T (3 s later) rows 6-10. A records connector to NATS with ``start_position: {time:
    T}`` gets rows 6-10 (that holds, also after retention). But after the retention job moved
    rows 1-5's versions into ``record_batches`` (their events older than ``events_retention``)
    and Postgres crashed (immediate shutdown, recovery), the same connector made afterwards
    gets records [1, 2, ..., 10]: rows 1-5, last changed before T, are sent too. The rebuild
    (core/store/index.py ``rebuild``) gives each version its batch's ``inserted_at`` as
    ``updated_at``, which for a moved version is when retention moved it, and
    core/store/reader.py ``start_seq`` starts a records stream at the least seq of a record
    ``updated_at >= T``."""
    with EmbeddedPostgres(durable=True) as server:
        url = server.url
        execute(url, "CREATE TABLE t (id int PRIMARY KEY, body text)")
        cfg = weir_config(url, [])
        with serving(cfg):
            execute(url, "INSERT INTO t SELECT i, 'a' FROM generate_series(1, 5) i")
            wait_for(lambda: stored.live_count(url, "public:t") == 5, what="rows 1-5")
            time.sleep(1.5)
            with psycopg.connect(url) as conn:
                at = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
            time.sleep(1.5)
            execute(url, "INSERT INTO t SELECT i, 'b' FROM generate_series(6, 10) i")
            wait_for(lambda: stored.live_count(url, "public:t") == 10, what="rows 6-10")
        _age(url, "last_seq <= 5")
        assert jobs.prune_events(cfg, Store(url)) == 5
        server.crash()
        server.start()
        nats = NatsHarness(nats_server)
        c = nats.connector("rec", "records", start_position={"time": at.isoformat()})
        nats.prepare(c)
        with serving(weir_config(url, [c])):
            got = wait_delivered(nats, c, 5, settle=1.5)
    assert _ids(got) == list(range(6, 11)), _ids(got)


# --- the store's errors ------------------------------------------------------------------------


def test_a_store_schema_another_role_made_is_told_with_a_fix_that_works(
    tmp_path: Path,
    quickstart_pg: EmbeddedPostgres,  # noqa: F811
    nats_server: EmbeddedNats,
) -> None:
    """README “Quickstart”: "What it cannot do it says in one line with the fix and exits 1
    (... a role without the grant it needs: the line names the GRANT)". The quickstart's
    store ``weir_store`` is owned by ``weir_cdc``, but its schema ``weir`` was made by a
    superuser (the DBA tried Weir once with the ``postgres`` URL). `weir run` as ``weir_cdc``
    exits 1 with ``weir run: role weir_cdc may not make the store's schema weir in database
    weir_store (permission denied for schema weir): as the database's owner run GRANT CREATE
    ON DATABASE weir_store TO weir_cdc; or give store.url a database the role owns (createdb
    -O weir_cdc weir_store)``: the role owns that database already, so it has CREATE; the
    GRANT run as written changes nothing and the next start fails the same way. What would fix
    it (the schema's owner: ``ALTER SCHEMA weir OWNER TO weir_cdc`` and its tables', or
    dropping the schema) is not named (core/store/__init__.py ``_may_not_create`` says the
    same for every InsufficientPrivilege). The fix the line names, run as it says, must let
    the next start go on."""
    pg = quickstart_pg
    Store(_db(pg, "weir_store")).prepare([])  # as the superuser: the schema and tables are its
    config = _quickstart_config(tmp_path, nats_server.url)
    out = weir("run", "--config", str(config), code=1, env=_env(pg), timeout=40)
    line = next((ln for ln in out.splitlines() if "weir run:" in ln), out)
    fix = re.search(r"GRANT [^;]*|DO \$\$.*? END \$\$", line)
    assert fix is not None, line
    with psycopg.connect(_db(pg, "weir_store"), autocommit=True) as conn:
        conn.execute(fix[0])  # the fix as the line names it
    again = run_again(config, _env(pg))
    assert "the store's schema" not in again, f"{line}\nthen, after {fix[0]}:" \
        f" {again.strip().splitlines()[-1]}"  # fmt: skip
