"""What Weir says when a server it needs does not answer or turns it away: one line naming the
server (host:port, never credentials), why, and what to check.

Every connection attempt is bounded: ``CONNECT_TIMEOUT`` for Postgres (``weir`` sets it as
``PGCONNECT_TIMEOUT`` unless the environment or the URL sets one), ``connect_timeout`` for
NATS, and the admin requests' timeouts for Kafka.
"""

from __future__ import annotations

import os
import re
import socket
from urllib.parse import urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from core.redact import first_line, redact
from core.sources.pg.encoding import connect

CONNECT_TIMEOUT = 10  # seconds


def bound_postgres_connects() -> None:
    """Every Postgres connection of this process gives up after ``CONNECT_TIMEOUT`` (psycopg
    and libpq read ``PGCONNECT_TIMEOUT``), unless the environment or the URL
    (``connect_timeout=``) says otherwise."""
    os.environ.setdefault("PGCONNECT_TIMEOUT", str(CONNECT_TIMEOUT))


class Unreachable(Exception):
    """A server could not be reached or refused the credentials; ``str()`` is the one line
    to print: ``cannot reach WHAT at HOST:PORT: REASON; check CHECK``. ``for_good``: the
    server answered and refused (a wrong password, a database or role that does not exist, a
    host pg_hba.conf does not let in): trying again will not help until someone fixes it."""

    def __init__(
        self, what: str, where: str, reason: str, check: str, for_good: bool = False
    ) -> None:
        super().__init__(redact(f"cannot reach {what} at {where}: {reason}; check {check}"))
        self.for_good = for_good


# What a Postgres server refuses a connection for until someone changes something.
REFUSED_FOR_GOOD = ("authentication failed", "does not exist", "no pg_hba.conf entry",
                    "permission denied for database")  # fmt: skip


def postgres_address(url: str) -> str:
    """``host:port`` of a Postgres URL or conninfo string (the defaults when left out)."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error:
        return "?"
    host = str(params.get("host") or params.get("hostaddr") or "the local socket")
    return f"{host}:{params.get('port') or 5432}"


def postgres_unreachable(e: psycopg.Error, url: str, what: str) -> Unreachable:
    """``e``, raised while connecting to ``url``, as the line to print."""
    # libpq: 'connection to server at "h", port p failed: FATAL:  the reason', one such line
    # per address tried (a host name may have several), then hints.
    lines = [line for line in str(e).splitlines() if " failed: " in line]
    text = redact(lines[-1]) if lines else first_line(e)
    if "timeout expired" in text:
        text = "no answer in time (connect_timeout)"
    else:
        text = text.rsplit(" failed: ", 1)[-1].removeprefix("FATAL:").strip()
    missing = re.search(r'database "(.+)" does not exist', text)
    if "password" in text or "authentication" in text:
        check = "the user and password of its url"
    elif missing:
        check = (f"the database name of its url, or create the database: CREATE DATABASE "
                 f"{missing[1]} (createdb {missing[1]})")  # fmt: skip
    elif "does not exist" in text:
        check = "the database and user names of its url"
    else:
        check = "that PostgreSQL runs there and accepts connections from this host"
    for_good = bool(lines) and any(r in text for r in REFUSED_FOR_GOOD)
    return Unreachable(what, postgres_address(url), text, check, for_good)


def reach_postgres(url: str, what: str) -> None:
    """Connect once to ``url`` (``what``: "the store", "source app"), or raise
    :class:`Unreachable`: what a command checks before it starts its work."""
    try:
        # As Weir's connections to a source are made: in UTF-8 (a MULE_INTERNAL database is
        # refused saying why, core/sources/pg/encoding.py).
        with connect(url, autocommit=True, application_name="weir"):
            pass
    except psycopg.OperationalError as e:
        raise postgres_unreachable(e, url, what) from None


def url_addresses(urls: list[str]) -> str:
    """``host:port, ...`` of broker URLs, without their user info."""
    out = []
    for u in urls:
        parts = urlsplit(u)
        out.append(f"{parts.hostname}:{parts.port}" if parts.hostname else redact(u))
    return ", ".join(out)


def network_reason(e: BaseException) -> str:
    """Why a connection attempt failed, in a few words."""
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, socket.gaierror):
        return "unknown host"
    if isinstance(e, TimeoutError):
        return "no answer in time"
    return first_line(e)
