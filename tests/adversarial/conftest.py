"""Fixtures of the adversarial suite: a database per module, for a Weir that runs through many
generated cases."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import psycopg
import pytest

from core.embedded import EmbeddedPostgres

_counter = itertools.count()


@pytest.fixture(scope="module")
def adv_db(pg_server: EmbeddedPostgres) -> Iterator[str]:
    """A fresh database on the shared server for the whole module; dropped afterwards."""
    name = f"adv{os.getpid()}_{next(_counter)}"
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield pg_server.url.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
            "WHERE database = %s AND active_pid IS NOT NULL",
            (name,),
        )
        conn.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE database = %s AND NOT active",
            (name,),
        )
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
