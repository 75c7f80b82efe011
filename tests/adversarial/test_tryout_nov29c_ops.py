"""An outside tryout (Nov 29, c): first-run errors, waits that must be said, and secrets that
mask what is no secret. Each test states what a user relies on, and fails on the code as it
was found."""

from __future__ import annotations

import html
import itertools
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import partial
from pathlib import Path

import httpx
import psycopg
import pytest
import yaml

from devkit.embedded import EmbeddedNats, EmbeddedPostgres
from devkit.server import free_port
from tests.conftest import fresh_database
from tests.helpers.capture import wait_for
from tests.helpers.cli import WEIR, answers, running, weir
from tests.helpers.echo import EchoReceiver
from tests.helpers.quickstart import PASSWORD, ROLE, quickstart_server
from tests.helpers.quickstart import db_url as _db

TOKEN = "a-token-of-24-characters"
STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) ")


def _stamps(log: str, level: str = "WARNING") -> list[tuple[float, str]]:
    """(time, line) of the log's lines at ``level`` or above."""
    levels = {"WARNING": ("WARNING", "ERROR", "CRITICAL"), "INFO": ("INFO", "WARNING", "ERROR")}
    out = []
    for line in log.splitlines():
        m = STAMP.match(line)
        if m and m[2] in levels[level]:
            out.append((datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp(), line))
    return out


@pytest.fixture(scope="module")
def quickstart_pg() -> Iterator[EmbeddedPostgres]:
    """The README's quickstart as a DBA runs it: database ``app`` and its tables belong to
    the role ``app``; Weir's role ``weir_cdc`` logs in with a password, owns ``weir_store``,
    has SELECT on the tables, and the publication is made by the tables' owner."""
    with quickstart_server() as pg:
        yield pg


def _quickstart_config(tmp: Path, nats_url: str, **changes: object) -> Path:
    """The quickstart's weir.yaml (its ${VAR}s kept), with ``changes`` to its source."""
    spec = {
        "store": {"url": "${WEIR_STORE_URL}"},
        "sources": [{"name": "app-db", "kind": "postgres", "url": "${APP_DB_URL}",
                     "tables": ["public.users", "public.orders"],
                     "create_publication": False, **changes}],
        "connectors": [{"name": "events-to-nats", "type": "nats", "stream": "events",
                        "nats": {"url": nats_url}}],
    }  # fmt: skip
    path = tmp / "weir.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _env(pg: EmbeddedPostgres, app: str | None = None, store: str | None = None) -> dict[str, str]:
    return os.environ | {
        "APP_DB_URL": app or _db(pg, "app", ROLE, PASSWORD),
        "WEIR_STORE_URL": store or _db(pg, "weir_store", ROLE, PASSWORD),
    }


def _not_info(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.strip() and " INFO " not in line]


# --- first run: permanent errors name their fix -------------------------------------------


def test_a_role_without_connect_on_the_database_is_told_the_grant(
    tmp_path: Path, quickstart_pg: EmbeddedPostgres, nats_server: EmbeddedNats
) -> None:
    """A permanent error stops `weir run` with one line naming the fix (README: "What it cannot
    do it says in one line with the fix and exits 1 (... a role without the grant it needs: the
    line names the GRANT)"). A database whose CONNECT was revoked from PUBLIC (a common
    hardening) is said as ``permission denied for database "locked"; check that PostgreSQL runs
    there and accepts connections from this host``: the fix named is the one for a server that
    is down, not ``GRANT CONNECT ON DATABASE locked TO weir_cdc``."""
    pg = quickstart_pg
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute("CREATE DATABASE locked")
        conn.execute("REVOKE CONNECT ON DATABASE locked FROM PUBLIC")
    config = _quickstart_config(tmp_path, nats_server.url)
    for env in (_env(pg, app=_db(pg, "locked", ROLE, PASSWORD)),
                _env(pg, store=_db(pg, "locked", ROLE, PASSWORD))):  # fmt: skip
        out = weir("run", "--config", str(config), code=1, env=env, timeout=30)
        said = _not_info(out)
        assert len(said) == 1 and "Traceback" not in out, out
        assert "GRANT CONNECT ON DATABASE locked TO weir_cdc" in said[0], said[0]
        assert "check that PostgreSQL runs there" not in said[0], said[0]


def test_a_misspelt_table_is_named_with_the_closest_one_in_one_line(
    tmp_path: Path, quickstart_pg: EmbeddedPostgres, nats_server: EmbeddedNats
) -> None:
    """`tables: [public.users, public.ordrs]`: `weir run` ends (exit 1, within 30 s) as the
    docs say ("A configured table that cannot be stops weir run saying why"), but in two ERROR
    lines, the first saying the source twice (``source app-db: source 'app-db': table
    public.ordrs does not exist (check 'tables:' in the config)``) and without the closest name
    that a typo'd collection or filter column gets (``did you mean 'public.orders'?``); the
    second is ``worker sources-0 (pid N) exited with status 1: failed for good; stopping every
    worker``. A user relies on one line naming the fix."""
    pg = quickstart_pg
    config = _quickstart_config(tmp_path, nats_server.url,
                                tables=["public.users", "public.ordrs"])  # fmt: skip
    out = weir("run", "--config", str(config), code=1, env=_env(pg), timeout=30)
    said = _not_info(out)
    assert "Traceback" not in out, out
    problems = []
    if len(said) != 1:
        problems.append(f"{len(said)} lines: {said}")
    if "public.orders" not in said[0]:  # the closest name
        problems.append(f"no closest name: {said[0]}")
    assert not problems, problems


def test_config_validate_names_a_selection_that_matches_nothing(
    tmp_path: Path, quickstart_pg: EmbeddedPostgres, nats_server: EmbeddedNats
) -> None:
    """The issue this tryout checks: typos that select nothing are named, with the closest
    name, by `weir config validate` and at start. `weir run` warns about `public:custmers`
    (docs/configuration.md), and stops on a table `public.ordrs` that does not exist; but
    `weir config validate`, which the systemd unit runs first (ExecStartPre) and which a user
    runs before `weir run` (README), says ``ok (1 sources, 1 connectors, 0 consumers)`` for
    both, so the mistake is only found by starting the service."""
    pg = quickstart_pg
    with psycopg.connect(_db(pg, "app"), autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS customers (id int PRIMARY KEY)")
    tables = ["public.users", "public.customers", "public.ordrs"]
    config = _quickstart_config(tmp_path, nats_server.url, tables=tables)
    spec = yaml.safe_load(config.read_text())
    spec["connectors"][0]["collections"] = ["public:custmers"]  # among the source's tables
    config.write_text(yaml.safe_dump(spec))
    out = weir("config", "validate", str(config), code=None, env=_env(pg))
    assert "public.orders" in out, out  # tables: the closest name
    assert "public:customers" in out, out  # collections: the closest name


def test_a_required_tls_the_server_does_not_offer_stops_weir_run(
    tmp_path: Path, quickstart_pg: EmbeddedPostgres, nats_server: EmbeddedNats
) -> None:
    """``?sslmode=require`` against a server without TLS (a URL copied from production to a
    local server) can only be fixed by changing the URL or the server, as a wrong password
    can; `weir run` retries it for ever (``server does not support SSL, but SSL was required;
    reconnecting in 25.0s``) with capture never starting, instead of one line naming the fix
    (sslmode) and exit 1 within 30 s."""
    pg = quickstart_pg
    config = _quickstart_config(tmp_path, nats_server.url, slot="tls_slot")
    env = _env(pg, app=_db(pg, "app", ROLE, PASSWORD) + "?sslmode=require")
    try:
        out = weir("run", "--config", str(config), code=None, env=env, timeout=30)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"weir run still retried after 30 s: {e.stderr!r}") from None
    said = _not_info(out)
    assert len(said) == 1 and "sslmode" in said[0], out


# --- waits: said at least every 30 s, and shown ----------------------------------------------


def _spec(db: str, port: int, nats_url: str) -> dict[str, object]:
    return {
        "api": {"listen": f"127.0.0.1:{port}", "tokens": [TOKEN]},
        "sources": [{"name": "app", "kind": "postgres", "url": db, "tables": ["public.t"]}],
        "connectors": [{"name": "n", "type": "nats", "stream": "events",
                        "nats": {"url": nats_url}}],
    }  # fmt: skip


def test_a_store_down_while_weir_runs_is_said_at_least_every_30s(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    """The rule for a transient error (a server restarting, refusing connections): Weir
    retries "saying so at least every 30 s" (README). With the store's (and source's) server
    stopped for 65 s while `weir run` runs, the log says ``leases: lost the store connection
    (AdminShutdown); stopping all work`` three times (once a worker, alike) and then nothing
    for 50 s and more; the first word after it is a slot check's. Once the server is back it
    goes on (that holds)."""
    with EmbeddedPostgres(durable=True) as pg:
        db = _db(pg, "postgres")
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, b text)")
        config = tmp_path / "weir.yaml"
        config.write_text(yaml.safe_dump(_spec(db, free_port(), nats_server.url)))
        log = tmp_path / "run.log"
        with log.open("w") as f:
            run = subprocess.Popen([*WEIR, "run", "--config", str(config)], stderr=f)
        try:
            wait_for(lambda: "connector n: streaming" in log.read_text(), timeout=60,
                     what="weir run to stream")  # fmt: skip
            time.sleep(1)
            down = time.time()
            pg.stop()
            time.sleep(65)
            up = time.time()
            pg.start()
            wait_for(lambda: log.read_text().count("streaming from slot") == 2, timeout=60,
                     what="capture again")  # fmt: skip
        finally:
            run.send_signal(signal.SIGTERM)
            run.wait(60)
    said = [t for t, _ in _stamps(log.read_text()) if down <= t <= up]
    marks = [down, *said, up]
    gaps = [round(b - a, 1) for a, b in itertools.pairwise(marks)]
    assert max(gaps) <= 30, (gaps, log.read_text()[-3000:])
    assert run.returncode == 0


def test_a_store_not_answering_at_start_is_said_within_30s(tmp_path: Path) -> None:
    """docs/operations.md “Deployment” (Start order): `weir run` waits for an unreachable store
    (retries 1 s doubling to 30 s); README: it says so "at least every 30 s". Its first two
    lines come 31 s apart (at 0 s, then after 1+2+4+8+16 s of waits: ``SAY_AGAIN`` is 25 s but
    is only looked at when a retry ends)."""
    db = f"postgresql://postgres@127.0.0.1:{free_port()}/app"  # nothing listens
    config = tmp_path / "weir.yaml"
    config.write_text(yaml.safe_dump(_spec(db, free_port(), "nats://127.0.0.1:4222")))
    log = tmp_path / "run.log"
    with log.open("w") as f:
        run = subprocess.Popen([*WEIR, "run", "--config", str(config)], stderr=f)
    try:
        wait_for(lambda: "retrying until it answers" in log.read_text(), timeout=30,
                 what="the first line")  # fmt: skip
        time.sleep(33)
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(60)
    said = [t for t, line in _stamps(log.read_text()) if "retrying until it answers" in line]
    assert len(said) >= 2 and said[1] - said[0] <= 30, log.read_text()


def test_ready_answers_503_while_the_store_is_awaited_at_start(tmp_path: Path) -> None:
    """docs/operations.md “Monitoring”: ``GET /ready`` (store and sources answer; 503
    otherwise). While `weir run` waits for a store that does not answer yet (a service started
    before its database, the case “Start order” describes), nothing listens on the API port:
    /ready and /health refuse the connection and the console cannot be opened, so a probe or
    an operator learns nothing of why (the container's health check, which asks /health,
    calls it unhealthy). Once the store answers it is 503 with the reason."""
    db = f"postgresql://postgres@127.0.0.1:{free_port()}/app"  # nothing listens
    port = free_port()
    config = tmp_path / "weir.yaml"
    config.write_text(yaml.safe_dump(_spec(db, port, "nats://127.0.0.1:4222")))
    log = tmp_path / "run.log"
    with log.open("w") as f:
        run = subprocess.Popen([*WEIR, "run", "--config", str(config)], stderr=f)
    try:
        wait_for(lambda: "retrying until it answers" in log.read_text(), timeout=30,
                 what="the wait")  # fmt: skip
        time.sleep(5)
        try:
            ready = httpx.get(f"http://127.0.0.1:{port}/ready", timeout=5)
            answer: object = (ready.status_code, ready.text)
        except httpx.TransportError as e:
            answer = repr(e)
        health = answers(f"http://127.0.0.1:{port}/health")
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(60)
    assert isinstance(answer, tuple) and answer[0] == 503, answer
    assert "store" in answer[1], answer
    assert health, "/health does not answer"


# --- secrets: what is no secret stays readable ------------------------------------------------


def test_weirs_own_words_in_the_run_log_are_not_masked_when_a_password_spells_them(
    tmp_path: Path, pg_server: EmbeddedPostgres, nats_server: EmbeddedNats
) -> None:
    """docs/configuration.md “Secrets”: "Weir's own words (log formats, its own error messages,
    ...) ... are never masked, also when a password is the same word". A webhook signing
    secret ``streaming`` and a store/source password ``events`` turn `weir run`'s log into
    ``connector n: ***`` (its state), ``applying migration 1 (sources, *** stream, records
    stream, cursors)``; with ``connector`` the leases read ``leases: ***:n is ...'s now``. The
    planted words are Weir's vocabulary (states, stream names, work kinds), not data."""
    with fresh_database(pg_server) as db:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, b text)")
        url = db.replace("postgresql://postgres@", "postgresql://postgres:events@", 1)
        spec = _spec(url, free_port(), nats_server.url)
        spec["connectors"] = [
            {"name": "n", "type": "nats", "stream": "events", "nats": {"url": nats_server.url}},
            {"name": "w", "type": "webhook", "stream": "events",
             "webhook": {"url": "http://127.0.0.1:9/x", "secret": "streaming",
                         "headers": {"X-Kind": "connector"}}},
        ]  # fmt: skip
        spec["sources"][0]["slot"] = "words"  # type: ignore[index]
        with running(tmp_path, spec, TOKEN) as (client, _):
            wait_for(lambda: "connector n:" in (tmp_path / "run.log").read_text()
                     and client.get("/v1/connectors/n").json()["shards"][0]["state"]
                     == "streaming", timeout=60, what="the connector to stream")  # fmt: skip
    text = (tmp_path / "run.log").read_text()
    expected = ("connector n: streaming", "applying migration 1 (sources, events stream",
                "leases: connector:n is ")  # fmt: skip
    masked = [line for line in text.splitlines() if "***" in line]
    assert all(e in text for e in expected), masked


def _listed(client: httpx.Client, path: str) -> bool:
    return bool(client.get(path).json()["data"])


def _echo_body(shape: str) -> Callable[[str], str]:
    """A receiver's 401 body of the Authorization header it got, in ``shape``: ``html`` (an
    HTML error page, the header HTML-escaped) or ``go`` (JSON as Go's encoding/json writes it by
    default: ``<``, ``>`` and ``&`` as ``\\u003c``, ``\\u003e``, ``\\u0026``)."""

    def body(got: str) -> str:
        if shape == "html":
            return f"<html><body><p>rejected {html.escape(got)}</p></body></html>"
        out = json.dumps({"error": f"invalid credentials {got}"})
        for c, e in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e")):
            out = out.replace(c, e)
        return out

    return body


def test_a_receivers_escaped_echo_of_a_header_secret_is_masked(
    tmp_path: Path, pg_server: EmbeddedPostgres
) -> None:
    """docs/configuration.md “Secrets”: what a remote answered (a webhook receiver echoing the
    headers it got) is masked by value, JSON-escaped spellings included; a secret is "text kept
    out of every output". Two common receivers: an HTML 401 page (HTML-escaped) and a Go
    service answering JSON (encoding/json escapes ``<``, ``>``, ``&`` by default). With header
    values ``Bearer Tok<en>&Secret99`` and ``Bearer k3y&Pa"ss'Word77``, `weir failed list`,
    the failed-list API and the log show ``HTTP 401: {"error": "invalid credentials Bearer
    Tok\\u003cen\\u003e\\u0026Secret99"}`` and ``rejected Bearer k3y&amp;Pa&quot;ss&#x27;Word77``:
    the secrets, one unescape away."""
    secrets = {"go": "Bearer Tok<en>&Secret99", "html": "Bearer k3y&Pa\"ss'Word77"}
    echoes = {shape: EchoReceiver(_echo_body(shape)) for shape in secrets}
    try:
        with fresh_database(pg_server) as db:
            with psycopg.connect(db, autocommit=True) as conn:
                conn.execute("CREATE TABLE t (id int PRIMARY KEY, b text)")
            spec = _spec(db, free_port(), "nats://127.0.0.1:4222")
            spec["connectors"] = [
                {"name": f"hook-{shape}", "type": "webhook", "stream": "events",
                 "retry": {"initial": "10ms", "max_attempts": 1},
                 "webhook": {"url": f"{echoes[shape].url}/x",
                             "headers": {"Authorization": secret}}}
                for shape, secret in secrets.items()
            ]  # fmt: skip
            spec["sources"][0]["slot"] = "echoes"  # type: ignore[index]
            seen = []
            with running(tmp_path, spec, TOKEN) as (client, config):
                with psycopg.connect(db, autocommit=True) as conn:
                    conn.execute("INSERT INTO t VALUES (1, 'x')")
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
    leaked = {s: w for s, w in {"Secret99": "Tok\\u003cen\\u003e\\u0026Secret99",
                                 "Word77": "k3y&amp;Pa&quot;ss&#x27;Word77"}.items()
              if w in text or s in text}  # fmt: skip
    assert not leaked, [line for line in text.splitlines() if "HTTP 401" in line][:4]


def test_config_validate_refuses_a_header_value_no_request_can_carry(tmp_path: Path) -> None:
    """docs/configuration.md: webhook ``headers`` values "are secrets and hold no line break",
    and `weir config validate` refuses a line break. A value with a non-ASCII letter (a
    password ``Pässwörd``) is accepted (``ok``), and `weir run` then reconnects the connector
    for ever, logging ``reconnecting (UnicodeEncodeError: 'ascii' codec can't encode character
    '\\xe4' in position 8: ordinal not in range(128); retry in 10.6s)``, a Python error that
    names neither the connector's header nor the fix."""
    config = tmp_path / "weir.yaml"
    config.write_text(yaml.safe_dump({
        "sources": [{"name": "app", "kind": "postgres", "url": "postgresql://u@h/db",
                     "tables": ["public.t"]}],
        "connectors": [{"name": "hook", "type": "webhook", "stream": "events",
                        "webhook": {"url": "http://127.0.0.1:9/x",
                                    "headers": {"Authorization": "Bearer Pässwörd-42"}}}],
    }, allow_unicode=True))  # fmt: skip
    out = weir("config", "validate", str(config), code=None)
    assert "webhook.headers.Authorization" in out, out
    assert "Pässwörd" not in out, out


def test_a_malformed_nkey_seed_file_stops_weir_run_naming_the_key(
    tmp_path: Path, pg_server: EmbeddedPostgres, nats_server: EmbeddedNats
) -> None:
    """docs/operations.md “Deployment” (Start order): a destination that turns a connector of the
    file away at its first connect (NATS refusing its credentials) stops `weir run` with one
    line naming the fix, exit 1. An ``nkey_seed_file`` whose seed is cut short (a copy-paste
    that lost a character) passes `weir config validate` (``ok``) and `weir run` retries it for
    ever, every line ``connector n: reconnecting (ValueError: The seed must be exactly 32 bytes
    long; retry in ...)``, naming neither ``nats.nkey_seed_file`` nor the file: it can never
    connect."""
    seed = tmp_path / "user.nk"
    seed.write_text("SUAMLK2ZNL35WSMW37E7UD4VZ7ELPKW7DHC3BWBSD2GCZ7IUQQXZIORRBUQX\n")
    with fresh_database(pg_server) as db:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY, b text)")
        spec = _spec(db, free_port(), nats_server.url)
        spec["connectors"][0]["nats"]["nkey_seed_file"] = str(seed)  # type: ignore[index]
        config = tmp_path / "weir.yaml"
        config.write_text(yaml.safe_dump(spec))
        validated = weir("config", "validate", str(config), code=None)
        if "nkey_seed_file" in validated:  # refused at load: that is the fix named too
            return
        try:
            out = weir("run", "--config", str(config), code=None, timeout=30)
        except subprocess.TimeoutExpired as e:
            said = sorted({ln.split(": ", 1)[-1] for ln in (e.stderr or b"").decode().splitlines()
                           if "WARNING" in ln})  # fmt: skip
            raise AssertionError(f"weir run still retried after 30 s: {said}") from None
    said = _not_info(out)
    assert len(said) == 1 and "nkey_seed_file" in said[0], out


def test_a_source_refused_for_good_after_the_workers_start_is_said_in_one_line(
    tmp_path: Path,
) -> None:
    """README: "What it cannot do it says in one line with the fix and exits 1". A source
    server with ``wal_level = replica``: `weir run` exits 1 in 3 s, but says it in two ERROR
    lines, the first naming the source twice: ``ERROR weir: source app: source 'app': wal_level
    is 'replica' but capture needs 'logical': run ALTER SYSTEM SET wal_level = logical; and
    restart PostgreSQL`` and ``ERROR weir: worker sources-0 (pid N) exited with status 1:
    failed for good; stopping every worker`` (a wrong password, checked before the workers
    start, is one line)."""
    with EmbeddedPostgres(settings={"wal_level": "replica"}) as pg:
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        spec = {"sources": [{"name": "app", "kind": "postgres", "url": pg.url,
                             "tables": ["public.t"]}], "connectors": []}  # fmt: skip
        config = tmp_path / "weir.yaml"
        config.write_text(yaml.safe_dump(spec))
        out = weir("run", "--config", str(config), code=1, timeout=30)
    said = _not_info(out)
    assert "Traceback" not in out, out
    assert len(said) == 1, said
    assert "wal_level = logical" in said[0] and said[0].count("source") == 1, said[0]


def test_the_closest_table_named_for_a_typo_is_not_masked_when_a_secret_spells_it(
    tmp_path: Path, pg_server: EmbeddedPostgres, nats_server: EmbeddedNats
) -> None:
    """docs/configuration.md “Secrets”: the tables a source captures are never masked, also
    when a password is the same word; and a collection that matches nothing is warned about
    "with the closest name". A webhook whose signing secret is ``users`` (the name of a table
    it sends) and whose ``collections`` is typo'd ``public:user`` is warned about as
    ``collections: 'public:user' matches none of its sources' tables (did you mean
    'public:***'?)``: the one word the warning exists to say is masked."""
    with fresh_database(pg_server) as db:
        with psycopg.connect(db, autocommit=True) as conn:
            conn.execute("CREATE TABLE users (id int PRIMARY KEY, name text)")
        spec = _spec(db, free_port(), nats_server.url)
        spec["sources"][0] |= {"tables": ["public.users"], "slot": "typo"}  # type: ignore[index]
        spec["connectors"] = [{
            "name": "hook", "type": "webhook", "stream": "events", "collections": ["public:user"],
            "webhook": {"url": "http://127.0.0.1:9/x", "secret": "users"}}]  # fmt: skip
        with running(tmp_path, spec, TOKEN) as (client, _):
            made = client.post("/v1/connectors", json={
                "name": "made", "type": "nats", "stream": "events",
                "collections": ["public:usr"], "nats": {"url": nats_server.url}})  # fmt: skip
    said = [ln for ln in (tmp_path / "run.log").read_text().splitlines() if "did you mean" in ln]
    assert made.status_code == 201, made.text
    problems = [ln.split(": ", 1)[1] for ln in said if "'public:users'?" not in ln]
    if "did you mean 'public:users'?" not in made.text:
        problems.append(f"API: {made.json()['warnings']}")
    assert said and not problems, problems
