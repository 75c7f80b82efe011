"""Connections to NATS, for the sink and ``weir nats setup``: options from the settings, and a
connect that is bounded and says in one line why it failed."""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import urlsplit

import nats
from nats.aio.client import Client

from connectors.nats.config import NatsConnector, NatsSettings
from core.failures import Unreachable, network_reason, url_addresses
from core.redact import said


def servers(s: NatsSettings) -> list[str]:
    return [s.url] if isinstance(s.url, str) else list(s.url)


def connect_options(s: NatsSettings, name: str) -> dict[str, Any]:
    """nats-py connect() arguments from the settings; used by the sink and ``weir nats setup``."""
    opts: dict[str, Any] = {
        "servers": servers(s),
        "name": f"weir:{name}",
        "connect_timeout": s.connect_timeout.total_seconds(),
    }
    if s.user is not None and s.password is not None:
        opts |= {"user": s.user, "password": s.password.get_secret_value()}
    if s.token is not None:
        opts["token"] = s.token.get_secret_value()
    if s.nkey_seed_file is not None:
        opts["nkeys_seed"] = str(s.nkey_seed_file)
    if s.creds_file is not None:
        opts["user_credentials"] = str(s.creds_file)
    if (ctx := s.tls_context()) is not None:
        opts["tls"] = ctx
    return opts


def _credentials(s: NatsSettings) -> str:
    """The credentials the settings give, for a refusal's one line to name."""
    for given, key in ((s.user, "nats.user and nats.password"), (s.token, "nats.token"),
                       (s.nkey_seed_file, "nats.nkey_seed_file"),
                       (s.creds_file, "nats.creds_file")):  # fmt: skip
        if given is not None:
            return key
    if any(urlsplit(u).username is not None for u in servers(s)):
        return "the user and password (or token) in nats.url"
    return "nats.user and nats.password, token, nkey_seed_file or creds_file (none is given)"


async def connect(connector: NatsConnector, **callbacks: Any) -> Client:
    """A connection that tries each server twice, each attempt bounded by ``connect_timeout``,
    then raises :class:`Unreachable` with the last reason (nats-py would retry for ever and
    log a traceback for each attempt). It does not reconnect by itself: the sink's user (the
    engine, ``weir nats setup``) starts over when it is lost. ``callbacks``: nats-py's
    ``disconnected_cb`` and such; an ``error_cb`` is called after the failure is noted."""
    s = connector.nats
    failures: list[Exception] = []
    on_error = callbacks.pop("error_cb", None)

    async def failed(e: Exception) -> None:
        failures.append(e)
        if on_error is not None:
            await on_error(e)

    where = url_addresses(servers(s))
    try:
        options = connect_options(s, connector.name) | callbacks | {
            "allow_reconnect": False, "max_reconnect_attempts": 1, "error_cb": failed,
        }  # fmt: skip
        return await nats.connect(**options)
    except (TimeoutError, nats.errors.Error, OSError) as e:
        last = failures[-1] if failures else e
        unread = [f for f in (*failures, e) if isinstance(f, OSError) and f.filename is not None]
        if unread:  # a file gone since the load (nats-py reads a creds file as it signs in)
            raise Unreachable(
                "NATS",
                where,
                said("cannot read %s: %s", unread[0].filename, unread[0].strerror),
                "the files under nats: (creds_file, nkey_seed_file, tls)",
            ) from None
        # nats-py raises a plain Error for the server's -ERR 'Authorization Violation'
        if isinstance(last, nats.errors.AuthorizationError) or "Authorization" in str(last):
            raise Unreachable(
                "NATS", where, "it refused the credentials", _credentials(s), for_good=True
            ) from None
        check = "nats.url and that nats-server runs there"
        if isinstance(last, ssl.SSLError):  # the handshake: its certificates, not the address
            check = "nats.tls and the server's certificate"
        raise Unreachable("NATS", where, network_reason(last), check) from None
