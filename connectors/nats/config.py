"""The ``nats`` connector's settings (docs/design.md “Guarantees”;
docs/configuration.md “Connector types”)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from core.config.base import ConnectorBase, Duration, Model, TlsFiles, check_pair
from core.redact import redact_urls


class StreamLimits(Model):
    """A JetStream stream ``weir nats setup`` creates when it is missing."""

    name: str
    subjects: list[str]
    max_msgs_per_subject: int = -1
    max_age: Duration = timedelta(0)
    discard: Literal["old", "new"] = "old"
    duplicate_window: Duration = timedelta(minutes=2)
    storage: Literal["file", "memory"] = "file"
    replicas: int = Field(1, ge=1, le=5)


def _records_stream() -> StreamLimits:
    return StreamLimits(
        name="SEQUIN-RECORDS", subjects=["sequin-records.>"], max_msgs_per_subject=1
    )


def _events_stream() -> StreamLimits:
    return StreamLimits(
        name="SEQUIN-EVENTS",
        subjects=["sequin-events.>"],
        max_msgs_per_subject=100,
        max_age=timedelta(days=7),
    )


class NatsSettings(Model):
    """Where and how to connect. Auth: user/password, token, nkey seed file or creds file."""

    url: str | list[str] = "nats://127.0.0.1:4222"
    namespace: str = Field("default", pattern=r"^[A-Za-z0-9_-]+$")
    user: str | None = None
    password: SecretStr | None = None
    token: SecretStr | None = None
    nkey_seed_file: Path | None = None
    creds_file: Path | None = None
    tls: TlsFiles | None = None
    ack_timeout: Duration = timedelta(seconds=5)
    connect_timeout: Duration = timedelta(seconds=5)
    records_stream: StreamLimits = Field(default_factory=_records_stream)
    events_stream: StreamLimits = Field(default_factory=_events_stream)

    @field_validator("url")
    @classmethod
    def _urls(cls, v: str | list[str]) -> str | list[str]:
        for u in [v] if isinstance(v, str) else v:
            if not u.startswith(("nats://", "tls://", "ws://", "wss://")):
                raise ValueError(
                    f"{redact_urls(u)!r}: expected nats://host:port (or tls://, ws://, wss://)"
                )
            try:
                urlsplit(u).port  # noqa: B018 (it raises when the URL's parts are not there)
            except ValueError:
                raise ValueError(
                    f"{redact_urls(u)!r}: its port is not a number (in a password, '/', '?', "
                    "'#' and '@' are written %2F, %3F, %23 and %40)"
                ) from None
        return v

    @model_validator(mode="after")
    def _one_auth(self) -> NatsSettings:
        given = [
            name
            for name, v in (
                ("user/password", self.user),
                ("token", self.token),
                ("nkey_seed_file", self.nkey_seed_file),
                ("creds_file", self.creds_file),
            )
            if v is not None
        ]
        if len(given) > 1:
            raise ValueError(f"give one way to authenticate, not {' and '.join(given)}")
        check_pair(self, "user", "password")
        return self


class NatsConnector(ConnectorBase):
    """Forwards one stream to JetStream subjects ``sequin-records.…`` / ``sequin-events.…``."""

    type: Literal["nats"]
    nats: NatsSettings = NatsSettings()
