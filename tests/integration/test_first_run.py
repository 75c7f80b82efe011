"""A first run as the README's quickstart has it, against a database whose tables belong to the
application: the DBA's SQL and the config as written work, and each mistake a new user makes
gives one line that names the fix; a permanent one ends `weir run` with exit 1 within 30 s."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import yaml

from core.config.load import load_config
from core.runtime.service import prepare
from devkit.embedded import EmbeddedNats, EmbeddedPostgres
from devkit.server import free_port
from tests.connectors.nats.harness import NatsHarness
from tests.helpers.capture import wait_for
from tests.helpers.cli import WEIR, answers, weir
from tests.helpers.quickstart import (
    PASSWORD,
    ROLE,
    quickstart,
    quickstart_server,
)
from tests.helpers.quickstart import db_url as _db

AUTH = {"Authorization": "Bearer a-token-of-24-characters"}


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[EmbeddedPostgres, EmbeddedNats]]:
    """A server whose database ``app`` and its tables belong to the role ``app``, where Weir's
    role logs in with a password; the DBA's SQL of the quickstart run on it as written."""
    with quickstart_server() as pg, EmbeddedNats() as ns:
        with psycopg.connect(_db(pg, "app"), autocommit=True) as conn:
            conn.execute("INSERT INTO users VALUES (1, 'ann')")
        yield pg, ns


def _config(tmp_path: Path, ns: EmbeddedNats, **source: object) -> str:
    """The quickstart's weir.yaml, with the test's NATS and the API on a free port."""
    spec = yaml.safe_load(quickstart()["yaml"])
    spec["connectors"][0]["nats"]["url"] = ns.url
    spec["sources"][0].update(source)
    spec["api"] = {"listen": f"127.0.0.1:{free_port()}", "tokens": ["a-token-of-24-characters"]}
    path = tmp_path / "weir.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def _env(
    pg: EmbeddedPostgres, password: str = PASSWORD, store: str = "weir_store"
) -> dict[str, str]:
    """The quickstart's exports, against the test's server."""
    return os.environ | {"APP_DB_URL": _db(pg, "app", ROLE, password),
                         "WEIR_STORE_URL": _db(pg, store, ROLE, PASSWORD)}  # fmt: skip


def _fails(config: str, env: dict[str, str], *args: str) -> str:
    """A command that must fail for good: exit 1 within 30 s; its lines that are errors."""
    out = weir(*args, "--config", config, code=1, env=env, timeout=30)
    assert "Traceback" not in out, out
    return "\n".join(line for line in out.splitlines() if "INFO" not in line)


def test_the_quickstart_as_written(
    tmp_path: Path, servers: tuple[EmbeddedPostgres, EmbeddedNats]
) -> None:
    """Its commands in order; a change of the application's reaches the NATS stream, and
    nothing is logged above INFO."""
    pg, ns = servers
    config, env = _config(tmp_path, ns), _env(pg)
    for command in quickstart()["sh"].splitlines():
        args = [a.replace("weir.yaml", config) for a in command.split("#")[0].split()]
        if args[:1] in (["weir"], [".venv/bin/weir"]) and args[1] in ("config", "nats"):
            out = subprocess.run([*WEIR, *args[1:]], capture_output=True, text=True, env=env,
                                 timeout=60)  # fmt: skip
            assert out.returncode == 0, out.stdout + out.stderr
    log = tmp_path / "run.log"
    with log.open("w") as f:
        run = subprocess.Popen([*WEIR, "run", "--config", config], env=env, stderr=f)
    connector = yaml.safe_load(Path(config).read_text())["connectors"][0]
    connector["nats"]["events_stream"] = {"name": "SEQUIN-EVENTS"}
    try:
        wait_for(lambda: "streaming from slot" in log.read_text(), timeout=60, what="capture")
        with psycopg.connect(_db(pg, "app"), autocommit=True) as conn:
            conn.execute("INSERT INTO orders VALUES (1, 1, 9.5)")
        wait_for(lambda: len(NatsHarness(ns).read(connector)) == 1, timeout=60,
                 what="the order in the NATS stream")  # fmt: skip
        assert (
            NatsHarness(ns).read(connector)[0].payload["record"]["total"] == "9.5"
        )  # numeric: its text
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(60)
    assert run.returncode == 0, log.read_text()
    assert " ERROR " not in log.read_text() and " WARNING " not in log.read_text()


def test_a_wrong_password(tmp_path: Path, servers: tuple[EmbeddedPostgres, EmbeddedNats]) -> None:
    pg, ns = servers
    err = _fails(_config(tmp_path, ns), _env(pg, password="not-it"), "run")
    assert (f'cannot reach source app-db at 127.0.0.1:{pg.port}: password authentication failed '
            f'for user "{ROLE}"; check the user and password of its url') in err, err  # fmt: skip

    # A url no server could answer: libpq refuses it before any connection is tried.
    for bad, said in (
        ("127.0.0.1:99999/app", 'invalid port number: "99999"'),
        (f"127.0.0.1:{pg.port}/app?sslmode=bogus", "invalid sslmode value"),
        (f"127.0.0.1:{pg.port}/app?connect_timeout=abc", "connect_timeout: 'abc'"),  # psycopg's
    ):
        env = _env(pg) | {"APP_DB_URL": f"postgresql://{ROLE}:{PASSWORD}@{bad}"}
        err = _fails(_config(tmp_path, ns), env, "run")
        assert "cannot reach source app-db at 127.0.0.1:" in err and said in err, err
        assert "check its url" in err and PASSWORD not in err, err


def test_wrong_nats_credentials(
    tmp_path: Path, servers: tuple[EmbeddedPostgres, EmbeddedNats]
) -> None:
    """A destination that turns a new connector's credentials away ends ``weir run`` as a
    source's does, naming the connector and what to check (it retried them for ever), in one
    line however many shards it has (it was one a shard), in as many worker processes (it was
    one a process; found by an outside tryout). One that ran before (a password changed on the
    broker, a worker restarted) retries instead, and ``weir run`` goes on with its other work."""
    pg, _ = servers
    with EmbeddedNats(args=["--user", "natsuser", "--pass", "the-right-one"]) as guarded:
        config = _config(tmp_path, guarded)
        spec = yaml.safe_load(Path(config).read_text())
        # No cursor from the module's other tests; shards, each turned away alike.
        spec["connectors"][0] |= {"name": "guarded", "shards": 3}

        def with_password(password: str) -> None:
            spec["connectors"][0]["nats"] |= {"user": "natsuser", "password": password}
            Path(config).write_text(yaml.safe_dump(spec))

        said = (f"connector guarded: cannot reach NATS at 127.0.0.1:{guarded.port}: it refused "
                "the credentials; check nats.user and nats.password")  # fmt: skip
        for workers in (1, 3):  # its shards in one worker process, then one in each
            spec["workers"] = {"connectors": workers}
            with_password("not-the-one-9")
            err = _fails(config, _env(pg), "run")
            assert err.count("refused the credentials") == 1 and said in err, err
            assert "not-the-one-9" not in err, err
        del spec["workers"]

        with_password("the-right-one")
        weir("nats", "setup", "--config", config, env=_env(pg))
        for password, said in (("the-right-one", "connector guarded#2/3: streaming"),
                               ("not-the-one-9", "it refused the credentials")):  # fmt: skip
            with_password(password)
            log = tmp_path / f"{password}.log"
            with log.open("w") as f:
                run = subprocess.Popen([*WEIR, "run", "--config", config], env=_env(pg), stderr=f)
            try:
                wait_for(lambda s=said, lg=log: s in lg.read_text(), timeout=60, what=said)
                time.sleep(2)
                assert run.poll() is None, log.read_text()  # it retries, and runs on
            finally:
                run.send_signal(signal.SIGTERM)
                run.wait(60)
            assert run.returncode == 0, log.read_text()
            assert "not-the-one-9" not in log.read_text()
            refused = [ln for ln in log.read_text().splitlines() if "refused the cred" in ln]
            warned = any(" WARNING " in ln for ln in refused)  # heard at WARNING too
            assert warned == (password != "the-right-one"), refused


def _a_secret_that_is_a_word(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with a connector whose secret is ``weir``, the store's schema and the word of
    Weir's own sentences: they are said as they are (found by an outside tester)."""
    hook = {"name": "w", "type": "webhook", "stream": "events",
            "webhook": {"url": "http://127.0.0.1:1/x", "secret": "weir"}}  # fmt: skip
    return {**spec, "connectors": [*spec.get("connectors", []), hook]}


def test_a_store_the_role_may_not_make(
    tmp_path: Path, servers: tuple[EmbeddedPostgres, EmbeddedNats]
) -> None:
    """The store left in the source's database, where the role has no CREATE: the GRANT is
    named, and once it is run as written, `weir run` makes the store."""
    pg, ns = servers
    spec = _a_secret_that_is_a_word(yaml.safe_load(Path(_config(tmp_path, ns)).read_text()))
    del spec["store"]
    config = tmp_path / "no-store.yaml"
    config.write_text(yaml.safe_dump(spec))
    err = _fails(str(config), _env(pg), "run")
    grant = f"GRANT CREATE ON DATABASE app TO {ROLE}"
    assert f"role {ROLE} may not make the store's schema weir in database app" in err, err
    assert grant in err and len(err.splitlines()) == 1, err
    with psycopg.connect(_db(pg, "app"), autocommit=True) as conn:
        conn.execute(grant)
    log = tmp_path / "run.log"
    with log.open("w") as f:
        run = subprocess.Popen([*WEIR, "run", "--config", str(config)], env=_env(pg), stderr=f)
    try:
        wait_for(lambda: "supervising" in log.read_text(), timeout=60, what="the store made")
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(60)
    assert "applying migration 1 " in log.read_text()


def test_a_publication_the_role_may_not_make(
    tmp_path: Path, servers: tuple[EmbeddedPostgres, EmbeddedNats]
) -> None:
    """``create_publication`` left true by a role that does not own the tables: the SQL to
    run as their owner is printed, and it works as printed."""
    pg, ns = servers
    config = _config(tmp_path, ns, create_publication=True, publication="weir_pub2")
    err = _fails(config, _env(pg), "run")
    sql = re.search(r"as the tables' owner run (CREATE PUBLICATION .*?); and set", err)
    assert sql is not None, err
    with psycopg.connect(_db(pg, "app"), autocommit=True) as conn:
        conn.execute("SET ROLE app")
        conn.execute(sql[1])
    assert "weir_pub2" in sql[1]


def test_a_table_the_role_may_not_read(
    tmp_path: Path, servers: tuple[EmbeddedPostgres, EmbeddedNats]
) -> None:
    """A backfill of a table without SELECT: the GRANT is named, and works as printed."""
    pg, ns = servers
    with psycopg.connect(_db(pg, "app"), autocommit=True) as conn:
        conn.execute("CREATE TABLE notes (id int PRIMARY KEY)")
        conn.execute("ALTER TABLE notes OWNER TO app")
    config = _config(tmp_path, ns)
    with (
        pytest.MonkeyPatch.context() as env
    ):  # the store as weir run makes it: backfills run beside
        for k, v in _env(pg).items():
            env.setenv(k, v)
        prepare(load_config(config))
    err = _fails(config, _env(pg), "backfill", "--source", "app-db", "--table", "public.notes")
    grant = re.search(r"as their owner run (GRANT SELECT ON .*)$", err)
    assert grant is not None and f"role {ROLE} may not read public.notes" in err, err
    # Captured, it is named at start with the GRANT, before a backfill stops at it (found by
    # an outside tryout: weir run streamed without a word); a backfill capture asks for waits
    # for the GRANT, unsaid again (it said it again at ERROR, and never retried it).
    with psycopg.connect(_db(pg, "app"), autocommit=True) as conn:
        conn.execute("SET ROLE app")
        conn.execute("ALTER PUBLICATION weir_pub ADD TABLE notes")
    spec = yaml.safe_load(Path(config).read_text())
    spec["sources"][0]["tables"].append("public.notes")
    Path(config).write_text(yaml.safe_dump(spec))
    log = tmp_path / "run.log"
    with log.open("w") as f:
        run = subprocess.Popen([*WEIR, "run", "--config", config], env=_env(pg), stderr=f)
    try:
        wait_for(lambda: "streaming from slot" in log.read_text(), timeout=60, what="capture")
        with psycopg.connect(_db(pg, "app"), autocommit=True) as conn:
            conn.execute("SET ROLE app")
            conn.execute("INSERT INTO notes VALUES (1)")
            conn.execute("ALTER TABLE notes ADD COLUMN body text")  # its records: a backfill
            conn.execute("INSERT INTO notes VALUES (2, 'two')")
        wait_for(lambda: "its records take them by a backfill" in log.read_text(), timeout=60,
                 what="capture to ask for the backfill")  # fmt: skip
        time.sleep(5)  # the backfills asked for are looked at every 2 s
        said = [ln for ln in log.read_text().splitlines() if "may not read" in ln]
        assert len(said) == 1 and " WARNING " in said[0] and grant[1] in said[0], said
        assert f"role {ROLE} may not read public.notes, which a backfill reads" in said[0]
        assert " ERROR " not in log.read_text(), log.read_text()
        with psycopg.connect(_db(pg, "app"), autocommit=True) as conn:
            conn.execute(grant[1])
        wait_for(lambda: "backfill public.notes: 2 rows read" in log.read_text(), timeout=60,
                 what="the backfill once granted")  # fmt: skip
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(60)
    out = subprocess.run([*WEIR, "backfill", "--source", "app-db", "--table", "public.notes",
                          "--config", config], capture_output=True, text=True, env=_env(pg),
                         timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_backfill_of_tables_the_role_may_not_read(
    tmp_path: Path, servers: tuple[EmbeddedPostgres, EmbeddedNats]
) -> None:
    """``backfill: {}`` over tables the role may not read: one line names them and the GRANT, at
    ERROR, and ``weir run`` ends before it reads any table (it warned at start, then said it
    again at ERROR, after backfilling the others)."""
    pg, ns = servers
    with psycopg.connect(_db(pg, "app"), autocommit=True) as conn:
        conn.execute("SET ROLE app")
        for table in ("drafts", "memos"):
            conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY)")
            conn.execute(f"ALTER PUBLICATION weir_pub ADD TABLE {table}")
    try:
        config = _config(tmp_path, ns, backfill={})
        spec = yaml.safe_load(Path(config).read_text())
        spec["sources"][0]["tables"] += ["public.drafts", "public.memos"]
        Path(config).write_text(yaml.safe_dump(spec))
        out = weir("run", "--config", config, code=1, env=_env(pg), timeout=30)
        said = [line for line in out.splitlines() if "may not read" in line]
        assert len(said) == 1 and " ERROR " in said[0], out
        assert (f"role {ROLE} may not read public.drafts, public.memos, which a backfill reads "
                "(capture does not): as their owner run GRANT SELECT ON \"public\".\"drafts\", "
                f'"public"."memos" TO {ROLE}') in said[0], said  # fmt: skip
        assert "backfill public.users" not in out and "Traceback" not in out, out
    finally:
        with psycopg.connect(_db(pg, "app"), autocommit=True) as conn:
            conn.execute("SET ROLE app")
            conn.execute("ALTER PUBLICATION weir_pub DROP TABLE drafts, memos")


def test_a_second_run_on_the_same_api_port(
    tmp_path: Path, servers: tuple[EmbeddedPostgres, EmbeddedNats]
) -> None:
    pg, ns = servers
    config, env = _config(tmp_path, ns), _env(pg)
    spec = _a_secret_that_is_a_word(yaml.safe_load(Path(config).read_text()))
    Path(config).write_text(yaml.safe_dump(spec))
    port = spec["api"]["listen"]
    first = subprocess.Popen([*WEIR, "run", "--config", config], env=env,
                             stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_for(lambda: answers(f"http://{port}/health"), timeout=60,
                 what="the first weir run's API")  # fmt: skip
        err = _fails(config, env, "run", "--single-process")
        # Another config on that port, in worker processes: it ends before capture makes its
        # slot (found by an outside tryout: an abandoned first run left a slot holding WAL).
        spec = yaml.safe_load(Path(config).read_text())
        spec["sources"][0]["slot"] = "second_slot"
        second = tmp_path / "second.yaml"
        second.write_text(yaml.safe_dump(spec))
        again = _fails(str(second), env, "run")
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(60)
    for said in (err, again):
        assert f"cannot listen on {port}: Address already in use; another weir run" in said, said
    with psycopg.connect(_db(pg, "app"), autocommit=True) as conn:
        slots = conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall()
    assert ("second_slot",) not in slots, slots


def test_a_selection_that_matches_nothing(
    tmp_path: Path, servers: tuple[EmbeddedPostgres, EmbeddedNats]
) -> None:
    """A typo'd collection or filter column is said at start, and when a connector is made
    over the API, with the closest name (it would send nothing, for ever)."""
    pg, ns = servers
    config = _config(tmp_path, ns)
    spec = yaml.safe_load(Path(config).read_text())
    spec["connectors"][0] |= {"collections": ["public:odrers"], "stream": "events",
                              "filters": [{"column": "totl", "op": ">", "value": 1}]}  # fmt: skip
    Path(config).write_text(yaml.safe_dump(spec))
    api = f"http://{spec['api']['listen']}"
    log = tmp_path / "run.log"
    with log.open("w") as f:
        run = subprocess.Popen([*WEIR, "run", "--config", config], env=_env(pg), stderr=f)
    try:
        wait_for(lambda: "did you mean 'public:orders'?" in log.read_text(), timeout=60,
                 what="the warning on the file's connector")  # fmt: skip
        wait_for(lambda: answers(f"{api}/health"), timeout=60, what="the API")
        consumer = httpx.post(f"{api}/v1/http-consumers", json={
            "name": "typo", "filters": {"collection_id": "public:ordrs"},
            "group_columns": ["stauts"]}, headers=AUTH)  # fmt: skip
        made = httpx.post(f"{api}/v1/connectors", json={
            "name": "by-api", "type": "nats", "stream": "records", "nats": {"url": ns.url},
            "collections": ["public:users", "publc:*"],
            "filters": [{"column": "nmae", "op": "=", "value": "ann"}],
        }, headers=AUTH)  # fmt: skip
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(60)
    text = log.read_text()
    assert ("connector events-to-nats: collections: 'public:odrers' matches none of its "
            "sources' tables (did you mean 'public:orders'?)") in text  # fmt: skip
    assert ("connector events-to-nats: filters: column 'totl' is in none of the tables it "
            "selects (did you mean 'total'?)") in text  # fmt: skip
    assert consumer.status_code == 201, consumer.text
    assert consumer.json()["warnings"] == [
        "consumer typo: collections: 'public:ordrs' matches none of its sources' tables (did you "
        "mean 'public:orders'?)",
        "consumer typo: group_columns: 'stauts' is in none of the tables it selects",
    ]
    assert made.status_code == 201, made.text
    assert made.json()["warnings"] == [
        "connector by-api: collections: 'publc:*' matches none of its sources' tables (did you "
        "mean 'public:users'?)",
        "connector by-api: filters: column 'nmae' is in none of the tables it selects (did you "
        "mean 'name'?)",
    ]


def test_a_long_poll_when_weir_run_stops(
    tmp_path: Path, servers: tuple[EmbeddedPostgres, EmbeddedNats]
) -> None:
    """SIGTERM while a worker long-polls the Consume API: the poll ends at once with an empty
    batch (it ended with a 500 and a traceback when uvicorn's grace ran out)."""
    pg, ns = servers
    config = _config(tmp_path, ns)
    spec = yaml.safe_load(Path(config).read_text())
    spec["consumers"] = [{"name": "worker", "stream": "events", "deliver_policy": "new"}]
    Path(config).write_text(yaml.safe_dump(spec))
    api = f"http://{spec['api']['listen']}"
    log = tmp_path / "run.log"
    with log.open("w") as f:
        run = subprocess.Popen([*WEIR, "run", "--config", config], env=_env(pg), stderr=f)
    stopper = threading.Timer(1.0, run.send_signal, (signal.SIGTERM,))
    try:
        wait_for(lambda: answers(f"{api}/health"), timeout=60, what="the API")
        with httpx.Client(
            base_url=api, timeout=30, headers={"Authorization": "Bearer a-token-of-24-characters"}
        ) as client:
            polling = client.build_request("GET", "/v1/http-consumers/worker/next",
                                           params={"wait_for": 20_000})  # fmt: skip
            stopper.start()
            started = time.monotonic()
            answer = client.send(polling)
        took = time.monotonic() - started
    finally:
        if not stopper.is_alive() and not stopper.finished.is_set():  # never started
            run.send_signal(signal.SIGTERM)
        run.wait(60)
    assert answer.status_code == 200 and answer.json()["data"] == [], answer.text
    assert took < 5, took
    assert run.returncode == 0 and "Traceback" not in log.read_text(), log.read_text()
    assert " ERROR " not in log.read_text(), log.read_text()


def test_a_role_that_may_not_replicate(
    tmp_path: Path, servers: tuple[EmbeddedPostgres, EmbeddedNats]
) -> None:
    """A source role without REPLICATION: the ALTER ROLE is named (capture retried it for
    ever as a connection failure), also when a slot is there to read. A slot a superuser made
    for it is not the new store's: the fix is named (drop it); and once the role lost
    REPLICATION, the same ALTER ROLE."""
    pg, ns = servers
    with psycopg.connect(_db(pg, "app"), autocommit=True) as conn:
        conn.execute("CREATE ROLE weir_norep LOGIN")
        conn.execute("GRANT SELECT ON public.users, public.orders TO weir_norep")
        conn.execute("CREATE DATABASE weir_norep_store OWNER weir_norep")
    env = os.environ | {"APP_DB_URL": _db(pg, "app", "weir_norep"),
                        "WEIR_STORE_URL": _db(pg, "weir_norep_store", "weir_norep")}  # fmt: skip
    config = _config(tmp_path, ns, slot="norep_slot")
    err = _fails(config, env, "run")
    assert ("role weir_norep may not create replication slot norep_slot (it has no REPLICATION):"
            " as a superuser, ALTER ROLE weir_norep REPLICATION") in err, err  # fmt: skip
    with psycopg.connect(_db(pg, "app"), autocommit=True) as conn:  # made by another
        conn.execute("SELECT pg_create_logical_replication_slot('norep_slot', 'pgoutput')")
    err = _fails(config, env, "run")
    assert ("role weir_norep may not read replication slot norep_slot (it has no REPLICATION):"
            " as a superuser, ALTER ROLE weir_norep REPLICATION") in err, err  # fmt: skip
    with psycopg.connect(_db(pg, "app"), autocommit=True) as conn:
        conn.execute("ALTER ROLE weir_norep REPLICATION")
    err = _fails(config, env, "run")
    assert ("replication slot 'norep_slot' exists, and this store did not make it: another Weir "
            "store (or another program) reads it") in err, err  # fmt: skip
    assert "drop it: SELECT pg_drop_replication_slot('norep_slot')" in err, err
    with psycopg.connect(_db(pg, "app"), autocommit=True) as conn:  # as it says; then the role
        conn.execute("SELECT pg_drop_replication_slot('norep_slot')")  # replicated a while
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            prepare(load_config(config))  # the store, and its slot, made by Weir
        conn.execute("ALTER ROLE weir_norep NOREPLICATION")
    err = _fails(config, env, "run")
    assert ("permission denied to start WAL sender; check that its role may replicate: as a "
            "superuser, ALTER ROLE weir_norep REPLICATION") in err or (
            "role weir_norep may not read replication slot norep_slot (it has no REPLICATION):"
            " as a superuser, ALTER ROLE weir_norep REPLICATION") in err, err  # fmt: skip


def test_a_backfill_before_weir_run_ever_ran(
    tmp_path: Path, servers: tuple[EmbeddedPostgres, EmbeddedNats]
) -> None:
    """Refused with one line: its rows would miss the changes made between its read and the
    slot that the first `weir run` makes (the records stream would keep them stale)."""
    pg, ns = servers
    with psycopg.connect(pg.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE never_run OWNER {ROLE}")
    err = _fails(_config(tmp_path, ns), _env(pg, store="never_run"), "backfill", "--source",
                 "app-db")  # fmt: skip
    assert err == (f"weir backfill: the store at 127.0.0.1:{pg.port} has no schema weir yet: "
                   "`weir run` makes it when it first starts"), err  # fmt: skip


def test_the_store_dropping_the_apis_connections(
    tmp_path: Path, servers: tuple[EmbeddedPostgres, EmbeddedNats]
) -> None:
    """The store's server ends the API's pooled connections (a restart, a failover): a request
    on one answers 503 (try again) and the log says so in one line; the next ones answer."""
    pg, ns = servers
    config = _config(tmp_path, ns)
    api = f"http://{yaml.safe_load(Path(config).read_text())['api']['listen']}"
    auth = {"Authorization": "Bearer a-token-of-24-characters"}
    log = tmp_path / "run.log"
    with log.open("w") as f:
        run = subprocess.Popen([*WEIR, "run", "--config", config], env=_env(pg), stderr=f)
    try:
        wait_for(lambda: answers(f"{api}/health"), timeout=60, what="the API")
        assert httpx.get(f"{api}/v1/connectors", headers=auth).status_code == 200
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                         " WHERE application_name = 'weir:api'")  # fmt: skip
        codes = [httpx.get(f"{api}/v1/connectors", headers=auth).status_code for _ in range(12)]
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(60)
    assert set(codes) <= {200, 503} and codes[-1] == 200, codes
    text = log.read_text()
    assert "Traceback" not in text and " ERROR " not in text, text
    assert text.count("the store did not answer") == codes.count(503), text
