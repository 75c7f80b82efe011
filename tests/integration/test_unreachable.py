"""Servers that do not answer: every command gives up in bounded time with one line naming
what it could not reach (host:port) and what to check, exit 1, no traceback; `weir run`
waits for its store instead, and starts once the store is up.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devkit.embedded import EmbeddedPostgres
from devkit.server import free_port

WEIR = [sys.executable, "-m", "core.cli"]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that takes connections (the kernel completes them) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield int(s.getsockname()[1])


def config(tmp_path: Path, spec: dict[str, Any]) -> str:
    path = tmp_path / "weir.yaml"
    path.write_text(json.dumps(spec))
    return str(path)


def pg_config(tmp_path: Path, port: int) -> str:
    url = f"postgresql://weir@127.0.0.1:{port}/app"
    source = {"name": "app", "kind": "postgres", "url": url, "tables": ["public.t"]}
    return config(tmp_path, {"sources": [source]})


def weir(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, float]:
    """(exit code, stdout + stderr, seconds) of a command, which must end within 60s."""
    started = time.monotonic()
    out = subprocess.run([*WEIR, *args], capture_output=True, text=True, timeout=60,
                         env=os.environ | (env or {}))  # fmt: skip
    return out.returncode, out.stdout + out.stderr, time.monotonic() - started


POSTGRES_DOWN = {  # a command: the line it ends with, before ": <reason>; check <what>"
    "status": "weir status: cannot reach the store (source app's database: no store.url) at "
    "127.0.0.1:{port}",
    "backfill": "weir backfill: cannot reach source app at 127.0.0.1:{port}",
    "seed": "weir seed: cannot reach source app at 127.0.0.1:{port}",
}


@pytest.mark.parametrize("command", list(POSTGRES_DOWN))
def test_postgres_nobody_listens_on(command: str, tmp_path: Path) -> None:
    port = free_port()
    args = {"status": [], "backfill": ["--source", "app"],
            "seed": ["--source", "app", "--table", "public.t"]}[command]  # fmt: skip
    code, out, seconds = weir(command, "--config", pg_config(tmp_path, port), *args)
    head = POSTGRES_DOWN[command].format(port=port)
    assert (code, out) == (1, f"{head}: Connection refused; check that PostgreSQL runs there "
                              "and accepts connections from this host\n")  # fmt: skip
    assert seconds < 20


def test_postgres_that_never_answers_is_given_up_on(tmp_path: Path, silent_port: int) -> None:
    code, out, seconds = weir("status", "--config", pg_config(tmp_path, silent_port))
    assert (code, out) == (1, "weir status: cannot reach the store (source app's database: no "
                              f"store.url) at 127.0.0.1:{silent_port}: "
                              "no answer in time (connect_timeout); check that PostgreSQL runs "
                              "there and accepts connections from this host\n")  # fmt: skip
    assert 9 < seconds < 30  # core.failures.CONNECT_TIMEOUT: 10s


def nats_config(tmp_path: Path, port: int) -> str:
    nats = {"url": f"nats://127.0.0.1:{port}", "connect_timeout": "1s"}
    return config(tmp_path, {"store": {"url": "postgresql://unused@127.0.0.1/x"}, "connectors": [
        {"name": "n", "type": "nats", "stream": "events", "nats": nats}]})  # fmt: skip


def test_nats_setup_nobody_listens_on(tmp_path: Path) -> None:
    port = free_port()
    code, out, seconds = weir("nats", "setup", "--config", nats_config(tmp_path, port))
    assert (code, out) == (1, f"n: cannot reach NATS at 127.0.0.1:{port}: connection refused; "
                              "check nats.url and that nats-server runs there\n")  # fmt: skip
    assert seconds < 20


def test_nats_setup_against_a_server_that_never_answers(tmp_path: Path, silent_port: int) -> None:
    code, out, seconds = weir("nats", "setup", "--config", nats_config(tmp_path, silent_port))
    assert (code, out) == (1, f"n: cannot reach NATS at 127.0.0.1:{silent_port}: no answer in "
                              "time; check nats.url and that nats-server runs there\n")  # fmt: skip
    assert seconds < 20  # two attempts of connect_timeout (1s)


@pytest.mark.parametrize("listening", [False, True], ids=["nobody listens", "never answers"])
def test_kafka_setup(listening: bool, tmp_path: Path, silent_port: int) -> None:
    port = silent_port if listening else free_port()
    path = config(tmp_path, {"store": {"url": "postgresql://unused@127.0.0.1/x"}, "connectors": [
        {"name": "k", "type": "kafka", "stream": "events",
         "kafka": {"bootstrap_servers": f"127.0.0.1:{port}"}}]})  # fmt: skip
    code, out, seconds = weir("kafka", "setup", "--config", path)
    assert code == 1 and len(out.splitlines()) == 1, out
    assert out.startswith(f"k: cannot reach Kafka at 127.0.0.1:{port}: ")
    assert out.endswith("; check kafka.bootstrap_servers\n")
    assert seconds < 30


def test_run_waits_for_its_store_and_starts_when_it_is_up(tmp_path: Path) -> None:
    port = free_port()
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    path = config(tmp_path, {"sources": [
        {"name": "app", "kind": "postgres", "url": url, "schemas": ["public"]}]})  # fmt: skip
    run = subprocess.Popen([*WEIR, "run", "--config", path], stderr=subprocess.PIPE, text=True)
    try:
        assert run.stderr is not None
        first = run.stderr.readline()
        assert first.rstrip().endswith(
            "WARNING weir: cannot reach the store (source app's database: no store.url) at "
            f"127.0.0.1:{port}: Connection refused; "
            "check that PostgreSQL runs there and accepts connections from this host; "
            "retrying until it answers"
        )
        with EmbeddedPostgres(port=port):
            lines = []
            while "streaming from slot" not in (line := run.stderr.readline()):
                assert line, "weir run ended: " + "".join(lines)
                lines.append(line)
            assert "cannot reach" not in "".join(lines)  # said once, while retrying
            assert any("the store answers" in line for line in lines)
            run.send_signal(signal.SIGTERM)
            assert run.wait(60) == 0
        assert "Traceback" not in run.stderr.read()
    finally:
        run.kill()
        run.wait()


def test_run_stopped_while_waiting_for_its_store_exits_0(tmp_path: Path) -> None:
    run = subprocess.Popen([*WEIR, "run", "--config", pg_config(tmp_path, free_port())],
                           stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert run.stderr is not None
        assert "cannot reach the store" in run.stderr.readline()
        run.send_signal(signal.SIGTERM)
        assert run.wait(30) == 0
        assert "Traceback" not in run.stderr.read()
    finally:
        run.kill()
        run.wait()


def test_run_stops_when_its_store_refuses_for_good(tmp_path: Path, db_url: str) -> None:
    """A store database or role that does not exist will not come by itself: `weir run` says
    what to do in one line and exits 1 instead of retrying for ever."""
    base, _, _ = db_url.rpartition("/")
    host = base.rpartition("@")[2]
    cases = {
        f"{base}/weir_store": f"weir run: cannot reach the store at {host}: database "
        '"weir_store" does not exist; check the database name of its url, or create the '
        "database: CREATE DATABASE weir_store (createdb weir_store)",
        f"postgresql://nobody_here@{host}/postgres": f"weir run: cannot reach the store at "
        f'{host}: role "nobody_here" does not exist; check the database and user names',
    }
    source = {"name": "app", "kind": "postgres", "url": db_url, "schemas": ["public"]}
    for store, line in cases.items():
        path = config(tmp_path, {"store": {"url": store}, "sources": [source]})
        code, out, seconds = weir("run", "--config", path)
        assert code == 1 and seconds < 30, out
        assert out.strip().splitlines()[-1].startswith(line), out
        assert "Traceback" not in out


def test_commands_before_the_first_run_say_the_store_is_not_made_yet(
    tmp_path: Path, db_url: str
) -> None:
    host = db_url.rpartition("/")[0].rpartition("@")[2]
    source = {"name": "app", "kind": "postgres", "url": db_url, "schemas": ["public"]}
    path = config(tmp_path, {"sources": [source]})
    for args in (["status"], ["failed", "list", "c"], ["connector", "pause", "c"]):
        code, out, _ = weir(*args, "--config", path)
        assert code == 1, out
        assert out.strip() == (f"weir {args[0]}: the store at {host} has no schema weir yet: "
                               "`weir run` makes it when it first starts")  # fmt: skip
