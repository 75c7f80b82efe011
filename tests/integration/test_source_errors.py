"""What a user sees when a source cannot be captured: one line that says what to do."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import psycopg
import pytest

from core.sources.pg.capture import PostgresCapture
from core.sources.pg.errors import SlotBusyError, SourceSetupError
from core.sources.pg.setup import ensure_slot, prepare
from core.store.writer import WriterBusyError
from devkit.embedded import EmbeddedPostgres
from tests.helpers.capture import capturing, pg_source, store_for


def _prepare(url: str, **overrides: object) -> None:
    """The source's checks, publication and slot, as a first start makes them."""
    src = pg_source(url, **overrides)
    with psycopg.connect(url, autocommit=True) as conn:
        prepare(conn, src)
        ensure_slot(conn, src)


def test_wal_level_not_logical() -> None:
    with (
        EmbeddedPostgres(settings={"wal_level": "replica"}) as server,
        pytest.raises(SourceSetupError) as e,
    ):
        _prepare(server.url)
    assert str(e.value) == (
        "source 'app': wal_level is 'replica' but capture needs 'logical': run "
        "ALTER SYSTEM SET wal_level = logical; and restart PostgreSQL"
    )


def test_missing_table(db_url: str) -> None:
    with pytest.raises(SourceSetupError, match=r"table public\.nope does not exist \(check"):
        _prepare(db_url, schemas=[], tables=["public.nope"])


def test_table_without_primary_key(db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """Named in tables: an error. In a followed schema: reported and left out of the
    publication, so the user's updates and deletes of it still work."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE loose (a int, b text)")
        conn.execute("INSERT INTO loose VALUES (1, 'x')")
    with pytest.raises(SourceSetupError, match=r"public\.loose has no primary key, so Postgres"):
        _prepare(db_url, schemas=[], tables=["public.loose"])
    _prepare(db_url)
    assert "not capturing: table public.loose has no primary key" in caplog.text
    with psycopg.connect(db_url, autocommit=True) as conn:
        assert conn.execute("UPDATE loose SET b = 'y'").rowcount == 1
        assert conn.execute("SELECT count(*) FROM pg_publication_tables").fetchone() == (0,)
        # The remedy the message names works.
        conn.execute("ALTER TABLE loose REPLICA IDENTITY FULL")
    _prepare(db_url, schemas=[], tables=["public.loose"], key_columns={"public.loose": ["a"]})


def test_replica_identity_nothing(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("ALTER TABLE t REPLICA IDENTITY NOTHING")
    with pytest.raises(SourceSetupError, match="REPLICA IDENTITY NOTHING"):
        _prepare(db_url, schemas=[], tables=["public.t"])


def test_slot_held_by_another_process(db_url: str) -> None:
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    src = pg_source(db_url)
    with capturing(src):
        with pytest.raises(SlotBusyError, match=r"slot 'weir_slot' is in use by another process"):
            _prepare(db_url, name="other")
        # A second writer of the same source is refused at once.
        with pytest.raises(WriterBusyError, match="already being written by another weir"):
            PostgresCapture(src, store_for(src)).session(threading.Event())


def test_a_server_without_room_for_replication_is_said_with_the_fix() -> None:
    """What only a DBA can change is said at start with the fix, not retried for ever: no
    replication connection let in (max_wal_senders = 0), and every slot taken by others."""
    with (
        EmbeddedPostgres(settings={"max_wal_senders": "0"}) as server,
        pytest.raises(SourceSetupError) as e,
    ):
        _prepare(server.url)
    assert "max_wal_senders is 0" in str(e.value)
    assert "ALTER SYSTEM SET max_wal_senders = 10" in str(e.value)
    with EmbeddedPostgres(settings={"max_replication_slots": "1"}) as server:
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("SELECT pg_create_logical_replication_slot('someone_elses', 'pgoutput')")
        with pytest.raises(SourceSetupError) as e:
            _prepare(server.url)
        _prepare(server.url, slot="someone_elses")  # a slot of its own there: it fits
    assert "all 1 replication slots are in use and none is weir_slot" in str(e.value)
    assert "pg_drop_replication_slot" in str(e.value)


def test_weir_run_exits_with_the_one_line_error(tmp_path: Path, db_url: str) -> None:
    cfg = tmp_path / "weir.yaml"
    cfg.write_text(
        textwrap.dedent(f"""\
        sources:
          - name: app
            kind: postgres
            url: {db_url}
            tables: [public.missing]
        """)
    )
    run = subprocess.run(
        [sys.executable, "-m", "core.cli", "run", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1
    errors = [line for line in run.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, errors  # one line, the source named once
    assert errors[0].endswith("ERROR weir: source 'app': table public.missing does not exist "
                              "(check 'tables:' in the config)"), errors  # fmt: skip
    assert db_url not in run.stderr  # the url may hold a password: never logged
