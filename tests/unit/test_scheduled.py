"""A scheduled job (retention, slot checks, the Consume API's sweep) while the database does
not answer: one WARNING line that says the next run tries again, no traceback."""

import asyncio
import logging

import psycopg
import pytest

from core.failures import scheduled
from devkit.server import free_port


def _connect() -> None:
    psycopg.connect(f"postgresql://weir@127.0.0.1:{free_port()}/weir", connect_timeout=2)


async def _aconnect() -> None:
    await psycopg.AsyncConnection.connect(f"postgresql://weir@127.0.0.1:{free_port()}/weir")


def test_a_job_whose_database_is_away(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        assert scheduled("retention", _connect)() is None
        assert asyncio.run(scheduled("consumers' sweep", _aconnect)()) is None
    said = [(r.levelname, r.getMessage(), r.exc_info) for r in caplog.records]
    assert [(level, msg.split(" (")[0], exc) for level, msg, exc in said] == [
        ("WARNING", "retention: the database did not answer", None),
        ("WARNING", "consumers' sweep: the database did not answer", None),
    ]
    assert all("the next run tries again" in msg and "\n" not in msg for _, msg, _ in said)


def test_other_errors_are_not_hidden() -> None:
    def broken() -> None:
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        scheduled("retention", broken)()
