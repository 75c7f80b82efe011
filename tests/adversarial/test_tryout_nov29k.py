"""Findings of the Nov 29 (k) outside try-out of the newest fixes (retention and consumers, failed-list retries, start times, the records index rebuild, store-schema ownership, the Spark source's options, typed columns and writer), against real servers: each test states a promise of README.md / docs/ and fails on the code it was written against, as its docstring tells."""  # noqa: E501

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import time
from datetime import UTC, datetime
from datetime import timedelta as td
from io import BytesIO
from pathlib import Path

import psycopg
import pytest
import yaml

from core.config.load import load_config
from core.runtime import jobs
from core.store import Store
from devkit.embedded import EmbeddedNats, EmbeddedPostgres
from devkit.server import CHECKOUT
from spark.options import spec_of
from spark.position import Position
from spark.typed import SourceError
from tests.adversarial.test_tryout_nov29c_ops import (  # noqa: F401 (quickstart_pg: a fixture)
    _env,
    _quickstart_config,
    quickstart_pg,
)
from tests.adversarial.test_tryout_nov29j import SLOW, _age, _ids, _queue_and_prune
from tests.adversarial.test_tryout_spark_nov29c import _config, _head, _read_from
from tests.connectors.nats.harness import NatsHarness
from tests.helpers.api import api_config, api_serving, receive
from tests.helpers.brokers import wait_delivered
from tests.helpers.capture import wait_for
from tests.helpers.cli import run_again, weir
from tests.helpers.quickstart import db_url as _db
from tests.helpers.sql import execute
from tests.helpers.weir import insert_t, serving

# --- retention and an HTTP pull consumer's queue -----------------------------------------------


def test_retention_does_not_warn_of_deleting_queued_events_a_spark_query_keeps(
    table: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/design.md “Guarantees”: "Retention warns about a connector, or an HTTP pull
    consumer's queue, that had not delivered the events it deletes"; docs/spark.md: retention
    "keeps the events such a query has not read yet, also while it is stopped, for at most
    store.readers_hold" (30 days). A named Spark query ``lake`` (its position kept at seq 0 by
    spark/position.py ``Position.note``) and an HTTP pull consumer ``slow`` whose queue holds
    the 20 events, received by none of its workers yet. The events pass ``events_retention``
    (8 days old) and the retention job runs: it deletes 0 events (the Spark query holds them),
    the consumer then receives all 20; yet the job logged ``retention: consumer slow had not
    delivered 20 events of source app older than 7 days, 0:00:00; they are deleted now (raise
    store.events_retention to keep them longer)``: an operator told of a loss that did not
    happen. core/store/retention.py ``behind`` counts the queue's rows in every batch older
    than the cutoff, not those ``_prune`` deletes (it keeps batches a Spark query has not read
    unless older than ``readers_hold``)."""
    config = _config(tmp_path, table)
    with api_serving(table, consumers=[SLOW]) as client:
        Position(spec_of({"config": str(config), "name": "lake"})).note(0)
        deleted = _queue_and_prune(table, caplog)
        got = receive(client, "slow", 100)
    said = [r.getMessage() for r in caplog.records if "retention" in r.getMessage()]
    assert deleted == 0 and len(got) == 20, (deleted, len(got))
    assert not [m for m in said if "slow" in m], said


# --- a start time before deleted events, on a store upgraded from before migration 19 -----------

_OLD = r"""
import sys
from datetime import timedelta as td
from core.config.load import load_config
from core.store import Store, retention
from tests.helpers.brokers import wait_delivered
from tests.helpers.capture import wait_for
from tests.helpers.cli import WEIR, weir
from tests.helpers.quickstart import db_url as _db
from tests.helpers.weir import insert_t, serving
import psycopg
config, url = sys.argv[1], sys.argv[2]
cfg = load_config(config)
def head():
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT events_seq FROM weir.sources WHERE name = 'app'").fetchone()[0]
with serving(cfg):
    insert_t(url, range(5))
    wait_for(lambda: head() == 5, what="5 changes stored")
print("DELETED", retention.delete_older(Store(cfg.store_url), td(0), td(0)))
"""


def test_a_start_time_before_events_deleted_before_the_upgrade_is_not_a_silent_gap(
    tmp_path: Path, table: str
) -> None:
    """docs/spark.md “What a query keeps”, **Never a silent gap**: "It never skips them: a
    start time at or before the newest commit of the events retention deleted (the store keeps
    that time) begins in
    them, and fails so too"; docs/operations.md “Upgrading”: store migrations run when a Weir
    process starts. The Weir before migration 19 (commit 6ed9db4, this repository's history)
    captures 5 changes after time T and its retention deletes them; the current Weir then
    starts on that store (migration 19 runs) and captures 5 more. A read with ``start`` T
    returns seqs [6, 7, 8, 9, 10] without a word, where ``start`` ``beginning`` fails with
    ``events 1 to 5 of source app … deleted by retention``: migration 19 adds
    ``sources.events_pruned_to`` as NULL for a source whose first events are gone already
    (core/store/history_later.py), and spark/position.py ``bounds`` then starts at the first
    stored batch after T."""
    old = tmp_path / "old"
    old.mkdir()
    parts = ["core", "connectors", "spark", "tests", "devkit"]
    archive = subprocess.run(["git", "-C", str(CHECKOUT), "archive", "6ed9db4", *parts],
                             capture_output=True)  # fmt: skip
    assert archive.returncode == 0, archive.stderr.decode()
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(old, filter="data")
    (old / "old.py").write_text(_OLD)
    config = _config(tmp_path, table)
    before = (datetime.now(UTC) - td(seconds=5)).isoformat()
    done = subprocess.run([sys.executable, str(old / "old.py"), str(config), table], cwd=old,
                          env={**os.environ, "PYTHONPATH": str(old)}, capture_output=True,
                          text=True, timeout=180)  # fmt: skip
    assert "DELETED 5" in done.stdout, done.stdout + done.stderr[-3000:]
    with serving(load_config(config)):
        insert_t(table, range(5, 10))
        wait_for(lambda: _head(table) == 10, what="5 more stored")

    with pytest.raises(SourceError, match="deleted by retention"):
        _read_from(config, "beginning")
    with pytest.raises(SourceError, match="deleted by retention"):
        print(_read_from(config, before))  # Found: [6, 7, 8, 9, 10]


# --- the store's schema made by another role ---------------------------------------------------


def test_the_handover_a_schema_owner_is_told_to_run_works_as_that_owner(
    tmp_path: Path,
    quickstart_pg: EmbeddedPostgres,  # noqa: F811
    nats_server: EmbeddedNats,
) -> None:
    """README “Quickstart”: "What it cannot do it says in one line with the fix and exits 1".
    The quickstart's store ``weir_store`` (owned by ``weir_cdc``) got its schema ``weir`` from
    a run as the role ``app`` (not a superuser; the DBA had granted it CREATE on the
    database). `weir run` as ``weir_cdc`` exits 1 with ``… role app owns it (a run as that
    role made it); as app or a superuser hand it and what it holds to weir_cdc: DO $$ …
    ALTER SCHEMA weir OWNER TO weir_cdc; … END $$; or DROP SCHEMA weir CASCADE …``. Run as
    ``app``, as the line says, the statement fails: ``must be able to SET ROLE "weir_cdc"``
    (Postgres lets a non-superuser owner give an object only to a role it is a member of), so
    the next start fails the same way. core/store/__init__.py ``_may_not_create`` named the
    owner as one who can run it; the line must name who can, and its statement, run so, must
    let the next start go on."""
    pg = quickstart_pg
    with psycopg.connect(_db(pg, "weir_store"), autocommit=True) as conn:
        conn.execute("GRANT CREATE ON DATABASE weir_store TO app")
    Store(_db(pg, "weir_store", "app")).prepare([])  # as app: the schema and tables are its
    config = _quickstart_config(tmp_path, nats_server.url)
    out = weir("run", "--config", str(config), code=1, env=_env(pg), timeout=40)
    line = next((ln for ln in out.splitlines() if "weir run:" in ln), out)
    assert "as a superuser" in line, line  # who can run it: not app, not a member of weir_cdc
    fix = re.search(r"DO \$\$.*? END \$\$", line)
    assert fix is not None, line
    try:
        with psycopg.connect(_db(pg, "weir_store"), autocommit=True) as conn:
            conn.execute(fix[0])  # as the superuser, as the line says
    except psycopg.Error as e:
        pytest.fail(f"{line}\nthen, as the superuser: {e}")
    again = run_again(config, _env(pg))
    assert "the store's schema" not in again, again.strip().splitlines()[-1]


# --- the Spark source: a schema given with .schema() -------------------------------------------

_SCHEMA_OF_A_TYPED_READ = r"""
import json, sys
from spark.session import spark_session
from spark.source import WeirSource
config = sys.argv[1]
spark = spark_session("local[1]", None, app="tryout-k-schema")
spark.dataSource.register(WeirSource)
def base():
    return spark.read.format("weir").option("config", config).option("source", "app")
typed = base().option("schema", "id INT").load()
try:  # the schema Spark gave the first read, given again the usual Spark way
    said = {"ok": base().schema(typed.schema).load().count()}
except Exception as e:
    said = {"error": str(e)}
print("SAY", json.dumps(said), flush=True)
spark.stop()
"""


@pytest.mark.slow
def test_the_schema_of_a_typed_read_given_with_dot_schema_is_refused_before_the_tasks(
    tmp_path: Path, table: str
) -> None:
    """docs/spark.md “Typed columns”: typed columns come from the option ``schema``; a wrong
    schema is refused "before any task runs", naming the field; the Nov 29 (c) fix: "A weir
    read given a schema with .schema() is refused on the driver, saying to give it as option
    schema". A user reuses the schema of a typed read (``.option("schema", "id INT")``, 11
    columns: the envelope's ten, then ``id``) with ``.schema(typed.schema)`` and no option: no
    refusal on the driver; the task fails inside PySpark's worker with
    ``[DATA_SOURCE_RETURN_SCHEMA_MISMATCH] Return schema mismatch in the result from 'read'
    method. Expected: 11 columns, Found: 10 columns``, which says nothing of the option.
    spark/source.py ``_typed`` refuses only a schema whose first columns are not the
    envelope's, and without the option yields the envelope alone whatever Spark was given."""
    config = _config(tmp_path, table)
    with serving(load_config(config)):
        insert_t(table, range(3))
        wait_for(lambda: _head(table) == 3, what="3 changes stored")
    driver = tmp_path / "driver.py"
    driver.write_text(_SCHEMA_OF_A_TYPED_READ)
    done = subprocess.run([sys.executable, str(driver), str(config)], capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    said = next((json.loads(ln[4:]) for ln in done.stdout.splitlines() if ln.startswith("SAY ")),
                None)  # fmt: skip
    assert said is not None, done.stderr[-3000:]
    if "ok" in said:
        assert said["ok"] == 3, said  # read as typed columns: fine
        return
    assert "DATA_SOURCE_RETURN_SCHEMA_MISMATCH" not in said["error"], said["error"][-600:]
    assert 'option "schema"' in said["error"], said["error"][-600:]


# --- the records index rebuilt after a crash ---------------------------------------------------


def test_a_records_time_start_sends_the_same_pushed_records_after_a_crash(
    nats_server: EmbeddedNats,
) -> None:
    """docs/design.md “Guarantees” (**Start positions**) and “The store's layout”:
    ``{time: …}`` "deliver[s] messages written at or after this time" (docs/configuration.md),
    and the records index,
    emptied by a Postgres crash, is rebuilt "from the batches": the same index. At time T an
    API sync pushes 5 records into the http source ``stripe`` with ``upstream_updated_at``
    2020-01-01 (data synced late from a provider). A records connector made with
    ``start_position: {time: T}`` gets all 5 (written after T). After retention moved their
    versions into ``record_batches`` and Postgres crashed (immediate shutdown, recovery), the
    same connector made anew gets none of them: core/store/index.py ``made`` (the rebuild)
    gives a moved version its commit time, the 2020 ``upstream_updated_at``, where the index
    had kept when it was written (``updated_at = now()``), and core/store/reader.py
    ``start_seq`` starts the records stream at the first version ``updated_at >= T``. (T is
    nine days back, so that the batches, aged eight days past retention, were written after
    it: a moved version keeps when it was written.)"""
    with EmbeddedPostgres(durable=True) as server:
        url = server.url
        execute(url, "CREATE TABLE t (id int PRIMARY KEY, body text)")
        nats = NatsHarness(nats_server)
        with psycopg.connect(url) as conn:
            at = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
        time.sleep(1)
        pushed = [{"collection_id": "charges", "record_id": str(i), "data": {"n": i},
                   "upstream_updated_at": "2020-01-01T00:00:00Z"} for i in range(1, 6)]  # fmt: skip
        # T nine days back: the batches aged eight days below (past retention) are still
        # written after T, as they would be had the 7 days passed
        start = {"time": (at - td(days=9)).isoformat()}
        c1 = nats.connector("rec1", "records", start_position=start)
        nats.prepare(c1)
        with api_serving(url, connectors=[c1]) as client:
            r = client.post("/v1/sources/stripe/records", json={"records": pushed})
            assert r.status_code == 200 and r.json()["accepted"] == 5, r.text
            before = _ids(wait_delivered(nats, c1, 5, settle=1))
        _age(url)
        assert jobs.prune_events(api_config(url, 1), Store(url)) == 5
        server.crash()
        server.start()
        c2 = nats.connector("rec2", "records", start_position=start)
        nats.prepare(c2)
        with api_serving(url, connectors=[c2]):
            time.sleep(5)
            after = _ids(nats.read(c2))
    assert before == [1, 2, 3, 4, 5]
    assert after == before, f"before the crash {before}, after it {after}"


def test_a_store_whose_tables_another_role_owns_is_told_a_fix_that_works(
    tmp_path: Path,
    quickstart_pg: EmbeddedPostgres,  # noqa: F811
    nats_server: EmbeddedNats,
) -> None:
    """README “Quickstart”: "What it cannot do it says in one line with the fix and exits 1".
    The quickstart's store ``weir_store`` got its schema and tables from a run as the
    superuser; the DBA then handed the schema itself to ``weir_cdc`` (``ALTER SCHEMA
    weir_k OWNER TO weir_cdc``, the first thing one tries), not its tables and functions.
    `weir run` as ``weir_cdc`` exits 1 with ``role weir_cdc may not make the store's schema
    weir_k in database weir_store (permission denied for table schema_migrations): as the
    database's owner run GRANT CREATE ON DATABASE weir_store TO weir_cdc; or …``: the role
    owns the database already, the GRANT run as written changes nothing, and the next start
    fails the same way.
    core/store/__init__.py ``_may_not_create`` tells the handover only when another role owns
    the schema, not when it owns what the schema holds."""
    pg = quickstart_pg
    store = {"url": "${WEIR_STORE_URL}", "schema": "weir_k"}
    Store(_db(pg, "weir_store"), "weir_k").prepare([])  # as the superuser
    with psycopg.connect(_db(pg, "weir_store"), autocommit=True) as conn:
        conn.execute("ALTER SCHEMA weir_k OWNER TO weir_cdc")
    config = _quickstart_config(tmp_path, nats_server.url)
    spec = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**spec, "store": store}, sort_keys=False))
    out = weir("run", "--config", str(config), code=1, env=_env(pg), timeout=40)
    line = next((ln for ln in out.splitlines() if "weir run:" in ln), out)
    fix = re.search(r"GRANT [^;]*|DO \$\$.*? END \$\$", line)
    assert fix is not None, line
    with psycopg.connect(_db(pg, "weir_store"), autocommit=True) as conn:
        conn.execute(fix[0])  # the fix as the line names it, as the superuser
    again = run_again(config, _env(pg))
    assert "the store's schema" not in again, f"{line}\nthen, after {fix[0]}:" \
        f" {again.strip().splitlines()[-1]}"  # fmt: skip
