"""No secret in anything Weir prints (docs/design.md “Guarantees”): every error path that may name a
URL or a credential runs with a known secret, against real servers that refuse it or ports
nobody listens on, and its whole output (stdout, stderr with debug logs and tracebacks, API
bodies) is searched for the secret, raw or encoded.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest

from devkit.embedded import EmbeddedKafka, EmbeddedNats, EmbeddedPostgres
from devkit.server import free_port
from tests.connectors.kafka.front import KafkaFront
from tests.helpers import cli
from tests.helpers.capture import wait_for
from tests.helpers.cli import WEIR, answers

SECRET = "S3cr3t-canary-%-x"  # with a stray %, as users write it into URLs
IN_URL = quote(SECRET, safe="")  # as it must be written in a URL's user info
ROLE = "weir_probe"  # a Postgres role that logs in with a password (the others: trust)


def assert_clean(text: str) -> None:
    """Neither the secret nor any spelling of it: each keeps its first word."""
    assert "S3cr3t" not in text and "canary" not in text, text


def weir(*args: str, code: int = 1) -> str:
    """Output of a `weir -v` command (debug logs, tracebacks), which ends with ``code``."""
    return cli.weir("-v", *args, code=code, env=os.environ | {"CANARY_ENV": SECRET}, timeout=90)


def write(tmp_path: Path, spec: dict[str, Any] | str) -> str:
    path = tmp_path / "weir.yaml"
    path.write_text(spec if isinstance(spec, str) else json.dumps(spec))
    return str(path)


@pytest.fixture(scope="module")
def probe_url(pg_server: EmbeddedPostgres) -> Iterator[str]:
    """A URL of the shared server for a role that needs a password, with the wrong one."""
    hba = pg_server.data / "pg_hba.conf"
    before = hba.read_text()
    hba.write_text(f"host all {ROLE} 127.0.0.1/32 scram-sha-256\n" + before)
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {ROLE} LOGIN REPLICATION PASSWORD 'the-right-one-42'")
        conn.execute("SELECT pg_reload_conf()")
    yield f"postgresql://{ROLE}:{IN_URL}@127.0.0.1:{pg_server.port}/postgres"
    hba.write_text(before)
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute("SELECT pg_reload_conf()")
        conn.execute(f"DROP ROLE {ROLE}")


def source(url: str, name: str = "app") -> dict[str, Any]:
    return {"name": name, "kind": "postgres", "url": url, "tables": ["public.t"]}


def test_config_validate_with_bad_urls(tmp_path: Path) -> None:
    raw = f"postgresql://weir:{SECRET}@127.0.0.1:5432/app"  # the stray % is an error
    spec = {
        "store": {"url": raw},
        "api": {"tokens": [SECRET]},
        "sources": [
            source(f"host=127.0.0.1 password={SECRET} oops"),
            source("${CANARY_ENV}", "env"),
            {**source(f"postgresql://weir:{IN_URL}@h/db", "ok"), "slot": "Bad-Slot"},
        ],
        "connectors": [
            {"name": "n1", "type": "nats", "stream": "events",
             "nats": {"url": f"nats:/u:{SECRET}@h:4222"}},
            {"name": "n2", "type": "nats", "stream": "events",
             "nats": {"url": [f"nast://u:{IN_URL}@h:4222"], "token": SECRET, "user": "u"}},
            {"name": "k", "type": "kafka", "stream": "events",
             "kafka": {"bootstrap_servers": f"u:{SECRET}@h:9092",
                       "sasl": {"mechanism": "BOGUS", "username": "u", "password": SECRET}}},
            {"name": "s", "type": "sqs", "stream": "events",
             "sqs": {"queue_url": f"htps://u:{SECRET}@sqs/1/q", "secret_access_key": SECRET,
                     "endpoint_url": f"http://u:{SECRET}@127.0.0.1:1"}},
            {"name": "w", "type": "webhook", "stream": "events",
             "webhook": {"url": f"hxxps://u:{SECRET}@hooks/x", "headers": {"X-Key": SECRET},
                         "secret": SECRET, "bogus": SECRET}},
        ],
    }  # fmt: skip
    out = weir("config", "validate", write(tmp_path, spec), code=2)
    assert out.count("weir.yaml:") >= 9, out  # every mistake is named
    assert_clean(out)


def test_postgres_with_the_wrong_password(tmp_path: Path, probe_url: str) -> None:
    path = write(tmp_path, {"sources": [source(probe_url)]})
    for args in (["status"], ["backfill", "--source", "app"],
                 ["seed", "--source", "app", "--table", "public.t"]):  # fmt: skip
        out = weir(*args, "--config", path)
        assert f'password authentication failed for user "{ROLE}"' in out, out
        assert_clean(out)


def test_postgres_nobody_listens_on(tmp_path: Path) -> None:
    url = f"postgresql://weir:{IN_URL}@127.0.0.1:{free_port()}/app"
    path = write(tmp_path, {"sources": [source(url)]})
    for args in (["status"], ["backfill", "--source", "app"]):
        out = weir(*args, "--config", path)
        assert "Connection refused" in out
        assert_clean(out)


def test_a_password_with_an_unencoded_at_and_colon(tmp_path: Path) -> None:
    """A URL parser splits such a password at its '@' and ':' and reports pieces of it as a
    host or a port: no piece of it is printed either."""
    url = f"postgresql://weir:Zq9@S3cr3tpw:canary99@127.0.0.1:{free_port()}/app"
    path = write(tmp_path, {"sources": [source(url)]})
    out = weir("config", "validate", path, code=2)
    assert "its user info holds an '@' (in a password it is written %40)" in out
    for args in (["status"], ["backfill", "--source", "app"]):
        assert_clean(weir(*args, "--config", path, code=2))


def test_run_and_its_api(tmp_path: Path, db_url: str) -> None:
    """`weir run -v` with a source nobody listens on (capture retries and logs), an
    unreachable webhook (credentials in its user info and in a query parameter), an SQS
    endpoint with credentials nobody listens on, and the API answering errors: nothing shows
    the secret, nor does `weir status` while they retry."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    port = free_port()
    refusing = f"postgresql://{ROLE}:{IN_URL}@127.0.0.1:{free_port()}/postgres"
    token = "a-token-of-24-characters"
    spec = {
        "api": {"listen": f"127.0.0.1:{port}", "tokens": [token]},
        "store": {"url": db_url},
        "sources": [source(db_url), source(refusing, "bad")],
        "connectors": [{"name": "w", "type": "webhook", "stream": "events",
                        "webhook": {"url": f"http://u:{IN_URL}@127.0.0.1:{free_port()}/x",
                                    "secret": SECRET}},
                       {"name": "wq", "type": "webhook", "stream": "events",
                        "webhook": {"url": f"http://127.0.0.1:{free_port()}/x?api_key={IN_URL}"}},
                       {"name": "s", "type": "sqs", "stream": "events",
                        "sqs": {"queue_url": "http://127.0.0.1:1/123456789012/q.fifo",
                                "endpoint_url": f"http://akid:{IN_URL}@127.0.0.1:{free_port()}",
                                "access_key_id": "akid", "secret_access_key": "not-the-one"}}],
    }  # fmt: skip
    log = tmp_path / "run.log"
    with log.open("w") as f:
        run = subprocess.Popen([*WEIR, "-v", "run", "--config", write(tmp_path, spec)],
                               stdout=f, stderr=subprocess.STDOUT)  # fmt: skip
    bodies = []
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            wait_for(lambda: answers(f"http://127.0.0.1:{port}/health"), timeout=60,
                     what="the API")  # fmt: skip
            ready = client.get("/ready")
            assert ready.status_code == 503 and "Connection refused" in ready.text
            auth = {"Authorization": f"Bearer {token}"}
            for r in (
                ready,
                client.get("/v1/http-consumers", headers={"Authorization": f"Bearer {SECRET}"}),
                client.post("/v1/http-consumers", headers=auth, json={"name": SECRET}),
                client.post(f"/v1/sources/{IN_URL}/records", headers=auth, json={}),
                client.post("/v1/sources/app/records", headers=auth, content=SECRET),
                client.post("/v1/http-consumers", headers=auth, json={"name": "c",
                            "filters": {"collection_id": SECRET, "bogus": SECRET}}),
            ):  # fmt: skip
                assert r.status_code >= 400, r.text
                bodies.append(r.text)
        with psycopg.connect(db_url, autocommit=True) as conn:
            conn.execute("INSERT INTO t VALUES (1)")  # for the webhook to fail to deliver
        for retried in ("source bad: connection failed", "connector w:", "connector s:"):
            wait_for(lambda r=retried: log.read_text().count(r) >= 2, timeout=60, what=retried)
        status = weir("status", "--config", str(tmp_path / "weir.yaml"), "--interval", "0.1",
                      code=0)  # fmt: skip
        assert "reconnecting" in status or "connecting" in status, status
        bodies.append(status)
    finally:
        run.send_signal(signal.SIGTERM)
        run.wait(60)
    out = log.read_text()
    assert run.returncode == 0, out
    assert_clean(out + "\n".join(bodies))


def test_nats_setup_with_the_wrong_password(tmp_path: Path) -> None:
    with EmbeddedNats(args=["--user", "u", "--pass", "the-right-one-42"]) as nats:
        for settings in (
            {"url": nats.url, "user": "u", "password": SECRET},
            {"url": f"nats://u:{IN_URL}@127.0.0.1:{nats.port}"},
            {"url": f"nats://127.0.0.1:{nats.port}", "token": SECRET},
        ):
            connector = {"name": "n", "type": "nats", "stream": "events", "nats": settings}
            path = write(tmp_path, {"store": {"url": "postgresql://x@127.0.0.1/x"},
                                    "connectors": [connector]})  # fmt: skip
            out = weir("nats", "setup", "--config", path)
            assert "n: cannot reach NATS at 127.0.0.1:" in out and "refused the credentials" in out
            assert_clean(out)


def test_kafka_setup_with_the_wrong_password(tmp_path: Path, kafka_server: EmbeddedKafka) -> None:
    with KafkaFront(users={"weir": "the-right-one-42"}) as front:
        front.backend_port = kafka_server.port
        sasl = {"mechanism": "SCRAM-SHA-512", "username": "weir", "password": SECRET}
        path = write(tmp_path, {"store": {"url": "postgresql://x@127.0.0.1/x"}, "connectors": [
            {"name": "k", "type": "kafka", "stream": "events",
             "kafka": {"bootstrap_servers": front.bootstrap, "sasl": sasl}}]})  # fmt: skip
        out = weir("kafka", "setup", "--config", path)
        assert "k: cannot reach Kafka at" in out and "Authentication failed" in out, out
        assert_clean(out)
