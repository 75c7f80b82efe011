"""Session-scoped real servers on loopback. A server that cannot start fails the tests using it."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright.sync_api import BrowserContext

from core.steps import functions
from devkit.browser import chromium
from devkit.embedded import EmbeddedPostgres
from tests.connectors import Kit, kits
from tests.helpers.brokers import Harness

_counter = itertools.count()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[EmbeddedPostgres]:
    with EmbeddedPostgres() as server:
        yield server


def _served(kit: Kit) -> Any:
    """The kit's server as a session fixture named ``kit.fixture``."""

    def serve() -> Iterator[Any]:
        with kit.server() as server:
            yield server

    serve.__doc__ = f"The session's {kit.fixture} (its connector's kit)."
    return pytest.fixture(scope="session", name=kit.fixture)(serve)


for _kit in kits().values():  # nats_server, kafka_server, sqs_server, webhook_receiver, ...
    globals()[_kit.fixture] = _served(_kit)


@pytest.fixture(params=list(kits()))
def broker(request: pytest.FixtureRequest) -> Harness:
    """Each registered connector in turn, through its kit's harness (tests/connectors/)."""
    kit = kits()[request.param]
    harness: Harness = kit.harness(request.getfixturevalue(kit.fixture))
    return harness


@contextmanager
def fresh_database(server: EmbeddedPostgres) -> Iterator[str]:
    """A new database on ``server``; its replication slots and itself are dropped after."""
    name = f"t{os.getpid()}_{next(_counter)}"
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield server.url.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(  # and wait (10 s at most) for each to end: its slot is active until then
            "SELECT pg_terminate_backend(active_pid, 10000) FROM pg_replication_slots "
            "WHERE database = %s AND active_pid IS NOT NULL",
            (name,),
        )
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE database = %s AND NOT active",
            (name,),
        )
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture
def db_url(pg_server: EmbeddedPostgres) -> Iterator[str]:
    """A fresh database on the shared server, for one test."""
    with fresh_database(pg_server) as url:
        yield url


@pytest.fixture
def table(db_url: str) -> str:
    """A database holding ``t (id int primary key, body text)``; rows go in by insert_t."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, body text NOT NULL)")
    return db_url


@pytest.fixture
def browser() -> Iterator[BrowserContext]:
    """Headless Chromium with a fresh profile (devkit/browser.py); one that cannot start fails
    the test."""
    with chromium() as context:
        yield context


@pytest.fixture
def functions_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory of step functions, as ``functions.dir`` names it."""
    where = tmp_path / "functions"
    where.mkdir()
    functions.use_dir(where)
    yield where
    functions.use_dir(None)
