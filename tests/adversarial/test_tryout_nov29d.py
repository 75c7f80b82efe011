"""Findings of the Nov 29 (d) outside try-out, against real servers: each test states a promise
of README.md / docs/ and fails on the code it was written against, as its docstring tells."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import psycopg

from devkit.embedded import EmbeddedNats, EmbeddedPostgres
from devkit.server import free_port
from tests.adversarial.test_tryout_nov29c_ops import (  # noqa: F401 (quickstart_pg: a fixture)
    PASSWORD,
    TOKEN,
    _db,
    _env,
    _listed,
    _not_info,
    _quickstart_config,
    _spec,
    quickstart_pg,
)
from tests.conftest import fresh_database
from tests.helpers import stored, toast
from tests.helpers.capture import wait_for
from tests.helpers.cli import running, weir
from tests.helpers.echo import EchoReceiver
from tests.helpers.sql import execute
from tests.helpers.weir import serving, weir_config


def _short(rec: dict[str, Any] | None) -> dict[str, Any]:
    return {k: (v[:12] + "…" if isinstance(v, str) and len(v) > 16 else v)
            for k, v in (rec or {}).items()}  # fmt: skip


def _rec(url: str, collection: str, rid: str) -> dict[str, Any]:
    row = stored.record(url, collection, rid)
    return row["record"] if row else {}


def _updated(url: str, collection: str) -> bool:
    return any(e["collection_id"] == collection and e["action"] == "update"
               for e in stored.events(url))  # fmt: skip


def _last_update(url: str, collection: str) -> dict[str, Any]:
    ups = [e for e in stored.events(url)
           if e["collection_id"] == collection and e["action"] == "update"]  # fmt: skip
    return ups[-1]["record"] if ups else {}


def _check_same(url: str, table: str) -> None:
    want = toast.row(url, table, 1)
    event = _last_update(url, f"public:{table}")
    rec = _rec(url, f"public:{table}", "1")
    problems = []
    for k in ("a", "b"):
        if k in event and event[k] != want[k]:
            problems.append(f"event {k}={_short(event)[k]} but the row's {k}={_short(want)[k]}")
        if rec and k in rec and rec[k] != want[k]:
            problems.append(f"record {k}={_short(rec)[k]} but the row's {k}={_short(want)[k]}")
    assert not problems, problems


def test_two_toasted_columns_whose_names_are_swapped_keep_their_own_values(db_url: str) -> None:
    """docs/design.md “Values the WAL leaves out”: an unchanged TOAST value comes "from the
    record's previous version in the store ... and for a column renamed since that version was
    written"; when no version holds the value the column is left out, "never a guess".
    Swapping two TOASTed columns' names (``a→tmp, b→a, tmp→b``, a common fix of a mix-up) while
    capture follows the table, then ``UPDATE ... SET c``: the event and the records stream give
    ``a`` the value of the old ``a`` (the column now called ``b``) and ``b`` the old ``b``:
    each column holds the OTHER column's value."""
    toast.table(db_url, "sw")
    with serving(weir_config(db_url, [])):
        toast.insert(db_url, "sw", 1, 2)
        execute(db_url, "ALTER TABLE sw RENAME COLUMN a TO tmp",
                "ALTER TABLE sw RENAME COLUMN b TO a",
                "ALTER TABLE sw RENAME COLUMN tmp TO b",
                "UPDATE sw SET c = 1 WHERE id = 1")  # fmt: skip
        wait_for(lambda: _updated(db_url, "public:sw"), what="the update")
        _check_same(db_url, "sw")


def test_a_column_dropped_and_another_renamed_to_its_name_keeps_its_own_value(
    db_url: str,
) -> None:
    """Same promise ("never a guess"). ``ALTER TABLE dr DROP COLUMN a; ALTER TABLE dr RENAME
    COLUMN b TO a`` (the new column replaces the old one), then an update of ``c``: ``a`` is
    filled with the DROPPED column's last value, not the value the row holds."""
    toast.table(db_url, "dr")
    with serving(weir_config(db_url, [])):
        toast.insert(db_url, "dr", 3, 4)
        execute(db_url, "ALTER TABLE dr DROP COLUMN a", "ALTER TABLE dr RENAME COLUMN b TO a",
                "UPDATE dr SET c = 1 WHERE id = 1")  # fmt: skip
        wait_for(lambda: _updated(db_url, "public:dr"), what="the update")
        _check_same(db_url, "dr")


def test_names_swapped_while_weir_is_stopped_are_not_filled_from_the_other_column(
    db_url: str,
) -> None:
    """docs/design.md: "one renamed while Weir was stopped is the case of no version with the
    value" (left out, logged and backfilled, "never a guess"). The two TOASTed columns' names
    are swapped while Weir is stopped; after its restart an update of ``c`` gets ``a`` and
    ``b`` from the store's version under the SAME names, i.e. each other's values (the records
    stream is made right by a later backfill; the event stays wrong)."""
    toast.table(db_url, "ws")
    cfg = weir_config(db_url, [])
    with serving(cfg):
        toast.insert(db_url, "ws", 5, 6)
    execute(db_url, "ALTER TABLE ws RENAME COLUMN a TO tmp", "ALTER TABLE ws RENAME COLUMN b TO a",
            "ALTER TABLE ws RENAME COLUMN tmp TO b")  # fmt: skip
    with serving(cfg, first=False):
        execute(db_url, "UPDATE ws SET c = 1 WHERE id = 1")
        wait_for(lambda: _updated(db_url, "public:ws"), what="the update")
        event = _last_update(db_url, "public:ws")
        time.sleep(10)  # room for a backfill that would make the records stream right again
        rec = _rec(db_url, "public:ws", "1")
    want = toast.row(db_url, "ws", 1)
    wrong = {f"event {k}": _short(event)[k] for k in ("a", "b")
             if k in event and event[k] != want[k]}  # fmt: skip
    wrong |= {f"record {k}": _short(rec)[k] for k in ("a", "b") if k in rec and rec[k] != want[k]}
    assert not wrong, f"other columns' values: {wrong}"


# --- secrets: other echoes a receiver writes ---------------------------------------------------


def _php(v: str) -> str:
    """PHP's htmlspecialchars() as PHP 8.1+ calls it by default (ENT_QUOTES | ENT_HTML401)."""
    return (v.replace("&", "&amp;").replace('"', "&quot;").replace("'", "&#039;")
            .replace("<", "&lt;").replace(">", "&gt;"))  # fmt: skip


def _xml(v: str) -> str:
    """XML's five predefined entities (.NET's SecurityElement.Escape, Java's escapeXml)."""
    return (v.replace("&", "&amp;").replace('"', "&quot;").replace("'", "&apos;")
            .replace("<", "&lt;").replace(">", "&gt;"))  # fmt: skip


def _rejected(write: Callable[[str], str], got: str) -> str:
    return f"<p>rejected {write(got)}</p>"


def test_a_receivers_php_or_xml_escaped_echo_of_a_header_secret_is_masked(
    tmp_path: Path, pg_server: EmbeddedPostgres
) -> None:
    """docs/configuration.md “Secrets”: what a remote answered is masked by value, and a secret
    is text kept out of every output; the last fix masks a header secret a receiver echoes in
    HTML's entities (``&#x27;``, ``&#39;``). Two other common receivers: a PHP page
    (``htmlspecialchars`` writes ``'`` as ``&#039;`` by default since PHP 8.1) and an XML
    error body (``&apos;``). With header values ``Bearer k3y'Php<Word77>`` and
    ``Bearer k3y'Xml<Word88>`` the failed-list API, `weir failed list` and the log show
    ``rejected Bearer k3y&#039;Php&lt;Word77&gt;``: the secret, one unescape away."""
    secrets = {"php": "Bearer k3y'Php<Word77>", "xml": "Bearer k3y'Xml<Word88>"}
    writes = {"php": _php, "xml": _xml}
    echoes = {shape: EchoReceiver(partial(_rejected, writes[shape])) for shape in secrets}
    try:
        with fresh_database(pg_server) as db:
            execute(db, "CREATE TABLE t (id int PRIMARY KEY, b text)")
            spec = _spec(db, free_port(), "nats://127.0.0.1:4222")
            spec["connectors"] = [
                {"name": f"hook-{shape}", "type": "webhook", "stream": "events",
                 "retry": {"initial": "10ms", "max_attempts": 1},
                 "webhook": {"url": f"{echoes[shape].url}/x",
                             "headers": {"Authorization": secret}}}
                for shape, secret in secrets.items()
            ]  # fmt: skip
            spec["sources"][0]["slot"] = "echoes_d"  # type: ignore[index]
            seen = []
            with running(tmp_path, spec, TOKEN) as (client, config):
                execute(db, "INSERT INTO t VALUES (1, 'x')")
                for shape in secrets:
                    path = f"/v1/connectors/hook-{shape}/failed"
                    wait_for(partial(_listed, client, path), timeout=30,
                             what=f"hook-{shape}'s failed entry")  # fmt: skip
                    listed = weir("failed", "list", f"hook-{shape}", "--config", str(config))
                    seen += [client.get(path).text, listed]
            seen.append((tmp_path / "run.log").read_text())
    finally:
        for echo in echoes.values():
            echo.close()
    text = "\n".join(seen)
    assert "HTTP 401" in text, text
    leaked = sorted({w for w in ("Word77", "Word88") if w in text})
    assert not leaked, [line for line in text.splitlines() if "rejected" in line][:4]


# --- first run: other permanent errors ----------------------------------------------------------


def _one_line_exit(config: Path, env: dict[str, str]) -> tuple[list[str], str]:
    try:
        out = weir("run", "--config", str(config), code=None, env=env, timeout=30)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"weir run still running after 30 s: {e.stderr!r}"[-1500:]) from None
    return _not_info(out), out


def test_a_role_without_replication_is_told_the_alter_role(
    tmp_path: Path,
    quickstart_pg: EmbeddedPostgres,  # noqa: F811
    nats_server: EmbeddedNats,
) -> None:
    """README: "What it cannot do it says in one line with the fix and exits 1 (... a role
    without the grant it needs: the line names the GRANT)". The quickstart's role made without
    REPLICATION (``CREATE ROLE weir_nr LOGIN PASSWORD ...``, SELECT granted): the fix is
    ``ALTER ROLE weir_nr REPLICATION``."""
    pg = quickstart_pg
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS weir_nr")
        conn.execute(f"CREATE ROLE weir_nr LOGIN PASSWORD '{PASSWORD}'")
    with psycopg.connect(_db(pg, "app"), autocommit=True) as conn:
        conn.execute("GRANT SELECT ON public.users, public.orders TO weir_nr")
    config = _quickstart_config(tmp_path, nats_server.url, slot="nr_slot")
    said, out = _one_line_exit(config, _env(pg, app=_db(pg, "app", "weir_nr", PASSWORD)))
    assert len(said) == 1 and "Traceback" not in out, out[-3000:]
    assert "REPLICATION" in said[0] and "weir_nr" in said[0], said[0]


def test_a_server_without_wal_senders_is_said_in_one_line(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    """README: a permanent error is one line naming the fix, exit 1. ``max_wal_senders = 0``
    (a server never set up for replication): the fix is the setting (and a restart)."""
    with EmbeddedPostgres(settings={"max_wal_senders": "0"}) as pg:
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE users (id int PRIMARY KEY, name text)")
            conn.execute("CREATE TABLE orders (id int PRIMARY KEY)")
        config = _quickstart_config(tmp_path, nats_server.url, create_publication=True)
        said, out = _one_line_exit(config, _env(pg, app=pg.url, store=pg.url))
    assert len(said) == 1 and "Traceback" not in out, out[-3000:]
    assert "max_wal_senders" in said[0], said[0]


# --- a table's key changed between runs --------------------------------------------------------


def _live_ids(url: str, collection: str) -> list[str]:
    return sorted(r["record_id"] for r in stored.records(url, live_only=True)
                  if r["collection_id"] == collection)  # fmt: skip


def test_key_columns_edited_between_runs_rekey_the_records(db_url: str) -> None:
    """docs/design.md “The store's layout”: "a change of key, name or columns makes capture ask
    for a backfill"; the records stream is "the latest version of each record", its id "the
    columns the WAL names a deleted row by" (with FULL: ``key_columns``). A table without a
    primary key (REPLICA IDENTITY FULL) captured with ``key_columns: {public.kc: [a]}``, then
    Weir restarted with ``[b]`` and a row updated: the records stream must hold the 5 rows
    keyed by ``b`` only."""
    execute(db_url, "CREATE TABLE kc (a int NOT NULL, b int NOT NULL, v text)",
            "ALTER TABLE kc REPLICA IDENTITY FULL",
            "INSERT INTO kc SELECT i, i + 100, 'v' FROM generate_series(1, 5) i")  # fmt: skip
    with serving(weir_config(db_url, [], backfill={}, key_columns={"public.kc": ["a"]})):
        wait_for(lambda: stored.live_count(db_url, "public:kc") == 5, what="the backfill")
    want = [str(k) for k in range(101, 106)]
    cfg = weir_config(db_url, [], backfill={}, key_columns={"public.kc": ["b"]})
    with serving(cfg, first=False):
        execute(db_url, "UPDATE kc SET v = 'w' WHERE a = 1")
        with contextlib.suppress(AssertionError):  # the difference is named below
            wait_for(lambda: _live_ids(db_url, "public:kc") == want, timeout=30,
                     what="the records stream keyed by b")  # fmt: skip
        got = _live_ids(db_url, "public:kc")
    assert got == want, f"live record ids {got}, the table's by b {want}"
