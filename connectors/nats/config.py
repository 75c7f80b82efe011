"""The ``nats`` connector's settings (docs/design.md “Guarantees”;
docs/configuration.md “Keys”)."""

from __future__ import annotations

import ssl
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import nkeys
from pydantic import ConfigDict, Field, SecretStr, ValidationInfo, field_validator, model_validator

from core.config.base import Duration, Model, ReadableFile, TlsFiles, check_pair
from core.config.connector import ConnectorBase
from core.config.steps import RouteField
from core.ids import encode_token
from core.redact import redact_urls, said


def _none_required(schema: dict[str, Any]) -> None:
    schema.pop("required", None)


class StreamLimits(Model):
    """A JetStream stream ``weir nats setup`` creates when it is missing."""

    # A config may leave any key out, the name and subjects too: NatsSettings fills in each
    # stream's own defaults (_stream_defaults), so the JSON Schema requires none.
    model_config = ConfigDict(json_schema_extra=_none_required)

    name: str = Field(description="the stream's name")
    subjects: list[str] = Field(description="the subjects it takes")
    max_msgs_per_subject: int = Field(-1, description="messages kept per subject; -1: no limit")
    max_age: Duration = Field(timedelta(0), description="how long messages are kept; 0: for ever")
    discard: Literal["old", "new"] = Field(
        "old", description="when full, drop the oldest messages (old) or refuse new ones (new)"
    )
    duplicate_window: Duration = Field(
        timedelta(minutes=2), description="how long JetStream keeps message ids to drop repeats"
    )
    storage: Literal["file", "memory"] = Field("file", description="where messages are kept")
    replicas: int = Field(1, ge=1, le=5, description="copies of each message in a cluster")


# The streams' defaults: a key given in the config replaces its default alone.
_RECORDS_STREAM = {"name": "SEQUIN-RECORDS", "subjects": ["sequin-records.>"],
                   "max_msgs_per_subject": 1}  # fmt: skip
_EVENTS_STREAM = {"name": "SEQUIN-EVENTS", "subjects": ["sequin-events.>"],
                  "max_msgs_per_subject": 100, "max_age": "7d"}  # fmt: skip


def _records_stream() -> StreamLimits:
    return StreamLimits.model_validate(_RECORDS_STREAM)


def _events_stream() -> StreamLimits:
    return StreamLimits.model_validate(_EVENTS_STREAM)


class NatsSettings(Model):
    """Where and how to connect. Auth: user/password, token, nkey seed file or creds file."""

    url: str | list[str] = Field(
        "nats://127.0.0.1:4222",
        description="the server, or a list of a cluster's (nats://, tls://, ws://, wss://)",
    )
    namespace: str = Field(
        "default",
        pattern=r"^[A-Za-z0-9_-]+$",
        description="the subjects' second token: `sequin-{stream}.{namespace}.…`",
    )
    user: str | None = Field(None, description="user, with password")
    password: SecretStr | None = Field(None, description="the user's password")
    token: SecretStr | None = Field(None, description="an auth token")
    nkey_seed_file: ReadableFile | None = Field(None, description="a file holding an NKey seed")
    creds_file: ReadableFile | None = Field(
        None, description="a credentials file (JWT and NKey seed)"
    )
    tls: TlsFiles | None = Field(
        None, description="TLS: a CA to trust and, for mutual TLS, a client certificate and key"
    )
    ack_timeout: Duration = Field(
        timedelta(seconds=5),
        description="how long a batch waits for JetStream's acks before the connection counts "
        "as lost",
    )
    connect_timeout: Duration = Field(
        timedelta(seconds=5),
        description="the bound of each connection attempt (each server is tried twice)",
    )
    records_stream: StreamLimits = Field(
        default_factory=_records_stream,
        description="the JetStream stream weir nats setup makes, or checks, for the records stream",
    )
    events_stream: StreamLimits = Field(
        default_factory=_events_stream,
        description="the JetStream stream weir nats setup makes, or checks, for the events stream",
    )

    @field_validator("nkey_seed_file")
    @classmethod
    def _seed(cls, v: ReadableFile | None) -> ReadableFile | None:
        """The file holds an NKey seed (as ``nsc`` writes one: ``SU…``): checked at load, as
        nats-py reads it at each connect, where a bad one would be retried for ever."""
        if v is not None:
            seed = bytearray(Path(v).read_bytes().strip())
            try:
                nkeys.from_seed(seed).wipe()
            except Exception as e:  # nkeys' errors name what is wrong, never the seed
                raise ValueError(said("%s holds no NKey seed: %s", str(v), e)) from None
            finally:
                seed[:] = bytes(len(seed))
        return v

    @field_validator("url")
    @classmethod
    def _urls(cls, v: str | list[str]) -> str | list[str]:
        if not v:
            raise ValueError("give a server's URL (nats://host:port), or a list of them")
        for u in [v] if isinstance(v, str) else v:
            if not u.startswith(("nats://", "tls://", "ws://", "wss://")):
                raise ValueError(
                    said("%r: expected nats://host:port (or tls://, ws://, wss://)", redact_urls(u))
                )
            try:
                urlsplit(u).port  # noqa: B018 (it raises when the URL's parts are not there)
            except ValueError:
                raise ValueError(
                    said(
                        "%r: its port is not a number (in a password, '/', '?', '#' and "
                        "'@' are written %%2F, %%3F, %%23 and %%40)",
                        redact_urls(u),
                    )
                ) from None
            if not urlsplit(u).hostname:
                raise ValueError(said("%r: the URL has no host (nats://host:port)", redact_urls(u)))
        return v

    @field_validator("records_stream", "events_stream", mode="before")
    @classmethod
    def _stream_defaults(cls, v: Any, info: ValidationInfo) -> Any:
        """The keys of a stream the config leaves out keep their defaults (its name too)."""
        if isinstance(v, dict):
            return {**(_RECORDS_STREAM if info.field_name == "records_stream" else _EVENTS_STREAM),
                    **v}  # fmt: skip
        return v

    def tls_context(self) -> ssl.SSLContext | None:
        """The TLS context of ``tls:`` (None without it), its files loaded: made at load to say
        what is wrong with them, and by each connect."""
        if self.tls is None:
            return None
        ca = self.tls.ca_file
        ctx = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
        if self.tls.cert_file is not None and self.tls.key_file is not None:
            ctx.load_cert_chain(str(self.tls.cert_file), str(self.tls.key_file))
        return ctx

    @model_validator(mode="after")
    def _tls_loads(self) -> NatsSettings:
        """A CA, certificate or key that is no PEM is said at load: it passed, and each connect
        then failed naming nats.url, for ever (found by an outside tryout)."""
        try:
            self.tls_context()
        except (ssl.SSLError, OSError) as e:
            assert self.tls is not None
            try:  # which of them: the CA alone, on this path only
                ssl.create_default_context(cafile=str(self.tls.ca_file or "") or None)
                which = said("cert_file and key_file: no certificate and its key")
            except (ssl.SSLError, OSError):
                which = said("ca_file %s: no CA certificates", self.tls.ca_file)
            raise ValueError(said("tls.%s in PEM (%s)", which, e)) from None
        return self

    @model_validator(mode="after")
    def _one_auth(self) -> NatsSettings:
        urls = [self.url] if isinstance(self.url, str) else self.url
        given = [
            name
            for name, v in (
                ("user/password", self.user),
                ("token", self.token),
                ("nkey_seed_file", self.nkey_seed_file),
                ("creds_file", self.creds_file),
                ("credentials in url", next((u for u in urls if urlsplit(u).username), None)),
            )
            if v is not None
        ]
        if len(given) > 1:
            raise ValueError(said("give one way to authenticate, not %s", " and ".join(given)))
        check_pair(self, "user", "password")
        return self


def check_subject_tail(value: str) -> None:
    """What a route's ``subject`` may be: tokens of a subject after ``sequin-{stream}.{ns}.``,
    none empty, with no wildcard or white space (a template's fields are written as tokens)."""
    tokens = value.split(".")
    if not value or any(not t or t in ("*", ">") or any(c.isspace() for c in t) or "*" in t
                        or ">" in t for t in tokens):  # fmt: skip
        raise ValueError(
            said(
                "%r is no subject: dot-separated tokens, none empty, without *, > or white space",
                value,
            )
        )
    if len(value) > 1024:
        raise ValueError(said("a subject of %s characters is too long (at most 1024)", len(value)))


class NatsConnector(ConnectorBase):
    """Forwards one stream to JetStream subjects ``sequin-records.…`` / ``sequin-events.…``."""

    # route: {subject: …} replaces what follows sequin-{stream}.{namespace}.
    ROUTES = {"subject": RouteField(encode_token, check_subject_tail)}

    type: Literal["nats"] = Field(
        description="publishes to NATS JetStream subjects `sequin-{stream}.{namespace}.…`"
    )
    nats: NatsSettings = Field(
        NatsSettings(),
        description="where and how to connect; one way to authenticate at most: user and "
        "password, token, nkey_seed_file or creds_file",
    )
