"""A store written by the Weir before the batched layout (store migration 11: a row per event
and per record, their JSON as jsonb) is upgraded under load by the current one: migration 12
moves its streams into batches (core/store/upgrade.py) while the source goes on changing, and
the connectors go on from their cursors with nothing lost and nothing twice."""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
from pathlib import Path

import psycopg
import pytest

from core.store import Store, migrations
from core.store.leases import Owners
from devkit.embedded import EmbeddedNats
from devkit.server import CHECKOUT
from tests.connectors.nats.harness import NatsHarness
from tests.helpers import stored
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

# The last main whose store had a row per change (its migrations end at 11).
ROW_PER_CHANGE = "1e9812f719990d3c08ced01bd94f84778c8d34f5"


@pytest.fixture(scope="session")
def old_weir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """That version's packages, from the repository's history."""
    out = tmp_path_factory.mktemp("weir-row-per-change")
    archive = subprocess.run(
        # spark/ too: that core's cli imports its seed job, which the checkout's would not fit
        ["git", "-C", str(CHECKOUT), "archive", ROW_PER_CHANGE, "core", "connectors", "spark"],
        capture_output=True,
    )
    assert archive.returncode == 0, (
        f"the upgrade test needs commit {ROW_PER_CHANGE} of this repository's history (a clone "
        f"with its history): {archive.stderr.decode()}"
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(out, filter="data")
    return out


@pytest.mark.slow
def test_a_row_per_change_store_is_upgraded_under_load(
    tmp_path: Path, db_url: str, nats_server: EmbeddedNats, old_weir: Path
) -> None:
    create_load_table(db_url)
    broker = NatsHarness(nats_server)
    events, records = crash_connectors(broker)
    cfg = {"sources": [{"name": "app", "kind": "postgres", "url": db_url,
                        "tables": ["public.load"]}], "connectors": [events, records]}  # fmt: skip
    config = tmp_path / "weir.yaml"
    config.write_text(json.dumps(cfg))

    with WeirProcess(config, tmp_path / "weir.log", code=old_weir) as weir:

        def upgrade() -> None:
            wait_for(lambda: len(broker.read(events)) > 300, what="the old weir to deliver")
            weir.kill()  # SIGKILL mid-stream: the new one finds what the old left in flight
            weir.code = None
            weir.start()

        expected = load_with_interruptions(db_url, 3000, [1000], upgrade)
        wait_all_delivered(broker, events, records, len(expected))
        weir.stop()
    # the old weir made the store up to 11 and ran; the new one upgraded it before it ran
    old, new = weir.log_text().split("applying migration 12", 1)
    assert "applying migration 11" in old and "weir: instance " in old
    assert "applying migration 12" not in new and "weir: instance " in new
    assert re.search(r"store: moved \d+ events and records into batches in [\d.]+s", new), new
    assert count_events(db_url) == len(expected)
    check_delivered(db_url, *consumed(broker, events, records), expected)
    with psycopg.connect(db_url) as conn:
        table = {str(i): {"id": i, "v": v} for i, v in conn.execute("SELECT id, v FROM load")}
    assert {r["record_id"]: r["record"] for r in stored.records(db_url, live_only=True)} == table


def test_a_store_is_not_upgraded_to_schema_keyed_locks_while_an_earlier_weir_runs(
    db_url: str,
) -> None:
    """Migration 15 changed the keys of the store's locks: while a `weir run` of an earlier
    version is on the store (its lease connection open), this version refuses to start on it,
    saying what to do, and starts once that one has stopped. Another store's instance in the
    database is no hindrance."""
    store = Store(db_url)
    with store.connect() as conn:
        assert migrations.migrate_to(conn, store.schema, 14) == 14
    with Owners(Store(db_url, "weir_other"), "host:1:abc").connect():
        with Owners(store, "host:2:abc").connect():
            with pytest.raises(RuntimeError, match="stop every instance of the store") as refused:
                store.prepare([])
            assert "weir-leases:all." in str(refused.value)
        store.prepare([])
    with store.connect() as conn:
        assert conn.execute("SELECT 1 FROM weir.schema_migrations WHERE version = 15").fetchone()
