"""Fixtures of the adversarial suite: a database per module, for a Weir that runs through many
generated cases."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devkit.embedded import EmbeddedPostgres
from tests.conftest import fresh_database


@pytest.fixture(scope="module")
def adv_db(pg_server: EmbeddedPostgres) -> Iterator[str]:
    """A fresh database on the shared server for the whole module."""
    with fresh_database(pg_server) as url:
        yield url
