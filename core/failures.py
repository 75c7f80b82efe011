"""What Weir says when a server it needs does not answer or turns it away: one line naming the
server (host:port, never credentials), why, and what to check. And the one place that decides
what an error is: a refusal for good (:func:`for_good`: retrying cannot help, Weir ends with its
line) or a server away (:func:`away`: retry with backoff, saying so).

Every connection attempt is bounded: ``CONNECT_TIMEOUT`` for Postgres (``weir`` sets it as
``PGCONNECT_TIMEOUT`` unless the environment or the URL sets one), ``connect_timeout`` for
NATS, and the admin requests' timeouts for Kafka.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from core.redact import Said, first_line, redact, said
from core.sources.pg.encoding import UnreadableDatabase, connect
from core.store import StoreError

if TYPE_CHECKING:
    from core.config.model import WeirConfig

CONNECT_TIMEOUT = 10  # seconds
# What a server that is down, restarting or failing over raises (a refusal at connect is told
# apart by postgres_unreachable).
AWAY = (psycopg.OperationalError, psycopg.InterfaceError)


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
        # ``what`` and ``check`` are Weir's words (a server's role, a config key to look at);
        # ``where`` and ``reason`` (a server's answer) are masked on their own
        super().__init__(
            said("cannot reach %s at %s: %s; check %s", Said(what), where, reason, Said(check))
        )
        self.for_good = for_good


BAD_URL = "connection is bad: "  # psycopg's words for a conninfo libpq did not accept
# What a Postgres server refuses a connection for until someone changes something.
REFUSED_FOR_GOOD = ("authentication failed", "does not exist", "no pg_hba.conf entry",
                    "permission denied for database", "does not support SSL",
                    "permission denied to start WAL sender")  # fmt: skip


def for_good(e: BaseException) -> str | None:
    """The one line to end with when retrying cannot help ``e``, only the user can: a server's
    refusal at connect (a wrong password, a database, role or privilege that is missing), a
    database no UTF-8 client can read (MULE_INTERNAL), a store that cannot be used as it is.
    None for anything else."""
    refused = isinstance(e, Unreachable) and e.for_good
    return first_line(e) if refused or isinstance(e, (UnreadableDatabase, StoreError)) else None


def away(e: BaseException) -> bool:
    """Whether ``e`` says a server is away (down, restarting, failing over, no answer yet): try
    again with backoff, saying so."""
    return isinstance(e, AWAY) or (isinstance(e, Unreachable) and not e.for_good)


def postgres_address(url: str) -> str:
    """``host:port`` of a Postgres URL or conninfo string (the defaults when left out)."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error:
        return "?"
    host = str(params.get("host") or params.get("hostaddr") or "the local socket")
    return f"{host}:{params.get('port') or 5432}"


def _user_of(url: str) -> str:
    try:
        return str(conninfo_to_dict(url).get("user") or "ROLE")
    except psycopg.Error:
        return "ROLE"


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
    barred = re.search(r'permission denied for database "(.+)"', text)
    if "password" in text or "authentication" in text:
        check = "the user and password of its url"
    elif "WAL sender" in text:
        check = said("that its role may replicate: as a superuser, ALTER ROLE %s REPLICATION",
                     _user_of(url))  # fmt: skip
    elif missing and what.startswith("the store"):  # a source's is a typo, or the wrong server
        check = said("the database name of its url, or create the database: CREATE DATABASE "
                     "%s (createdb %s)", missing[1], missing[1])  # fmt: skip
    elif "does not exist" in text:
        check = "the database and user names of its url"
    elif barred:
        check = said("that its role may connect: as the database's owner, GRANT CONNECT ON "
                     "DATABASE %s TO %s", barred[1], _user_of(url))  # fmt: skip
    elif "does not support SSL" in text:
        check = (
            "the sslmode of its url: the server offers no TLS (turn ssl on in the "
            "server, or ask for sslmode=prefer)"
        )
    else:
        check = "that PostgreSQL runs there and accepts connections from this host"
    for_good = bool(lines) and any(r in text for r in REFUSED_FOR_GOOD)
    if text.startswith(BAD_URL):  # libpq refused the url itself, before trying any server
        text, check, for_good = text.removeprefix(BAD_URL), "its url", True
    return Unreachable(what, postgres_address(url), text, check, for_good)


def reach_postgres(url: str, what: str) -> None:
    """Connect once to ``url`` (``what``: "the store", "source app"), or raise
    :class:`Unreachable`: what a command checks before it starts its work."""
    with reached(url, what):
        pass


@contextlib.contextmanager
def reached(
    url: str, what: str, open_: Callable[[str], psycopg.Connection[Any]] | None = None
) -> Iterator[psycopg.Connection[Any]]:
    """A connection to ``url`` made by ``open_`` (by default as Weir's connections to a source
    are made: in UTF-8, a MULE_INTERNAL database refused saying why, core/sources/pg/encoding.py),
    or :class:`Unreachable` as :func:`reach_postgres` says; errors of its use are its user's."""
    try:
        conn = (open_ or _plain)(url)
    except psycopg.OperationalError as e:
        raise postgres_unreachable(e, url, what) from None
    except psycopg.ProgrammingError as e:  # a value psycopg reads itself (connect_timeout=abc)
        raise Unreachable(what, postgres_address(url), str(e), "its url", for_good=True) from None
    with conn:
        yield conn


def _plain(url: str) -> psycopg.Connection[Any]:
    return connect(url, autocommit=True, application_name="weir")


STORE_RETRY_FIRST, STORE_RETRY_MAX = 1.0, 25.0  # seconds between attempts to reach the store
SAY_AGAIN = 25.0  # seconds: a wait is said again this often (within 30 s), for the same reason too


def wait_for_store(
    cfg: WeirConfig, stop: threading.Event, on_wait: Callable[[str], None] | None = None
) -> bool:
    """Wait until the store answers, or ``stop`` is set (then False). A service often starts
    before its database (systemd, compose): say what it waits for, then retry with backoff,
    saying it again when the reason changes and at least every ``SAY_AGAIN``. A refusal for
    good (a wrong password, a database that does not exist) raises :class:`Unreachable`:
    ``weir run`` exits 1 with its line. ``on_wait(why)`` is told each failed attempt's why.
    """
    log = logging.getLogger("weir")
    said, said_at, delay = "", 0.0, STORE_RETRY_FIRST
    while not stop.is_set():
        try:
            reach_postgres(cfg.store_url, cfg.store_named)
        except Unreachable as e:
            if not away(e):
                raise
            if on_wait is not None:
                on_wait(str(e))
            if str(e) != said or time.monotonic() - said_at >= SAY_AGAIN:
                log.warning("%s; retrying until it answers", e)
                said, said_at = str(e), time.monotonic()
            stop.wait(min(delay, max(0.0, said_at + SAY_AGAIN - time.monotonic())))
            delay = min(delay * 2, STORE_RETRY_MAX)
            continue
        if said:
            log.info("the store answers")
        return True
    return False


def sources_let_in(cfg: WeirConfig) -> None:
    """Connect once to each postgres source: one that refuses for good (credentials, a
    database or role that does not exist) raises :class:`Unreachable`, so that ``weir run``
    stops with its one line before it starts any work; one that does not answer yet is
    capture's to wait for."""
    for src in cfg.sources:
        if src.kind == "postgres":
            try:
                reach_postgres(src.url.get_secret_value(), f"source {src.name}")
            except Unreachable as e:
                if not away(e):
                    raise


def url_addresses(urls: list[str]) -> str:
    """``host:port, ...`` of broker URLs, without their user info."""
    out = []
    for u in urls:
        parts = urlsplit(u)
        port = f":{parts.port}" if parts.port is not None else ""
        out.append(f"{parts.hostname}{port}" if parts.hostname else redact(u))
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


def scheduled(what: str, job: Callable[..., Any]) -> Callable[..., Any]:
    """``job`` (a function or a coroutine function) for a scheduler: a database that does not
    answer for a while (restarting, failing over) is a one-line WARNING, not apscheduler's
    ERROR with a traceback; the next run tries again."""

    def skipped(e: BaseException) -> None:
        logging.getLogger("weir.jobs").warning(
            "%s: the database did not answer (%s); the next run tries again", what, first_line(e)
        )

    if inspect.iscoroutinefunction(job):

        @functools.wraps(job)
        async def run_async(*args: Any) -> Any:
            try:
                return await job(*args)
            except AWAY as e:
                skipped(e)
                return None

        return run_async

    @functools.wraps(job)
    def run(*args: Any) -> Any:
        try:
            return job(*args)
        except AWAY as e:
            skipped(e)
            return None

    return run
