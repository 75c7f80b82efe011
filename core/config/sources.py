"""The config file's sources (docs/configuration.md “The config file”): a Postgres database
to capture, or records pushed over HTTP by an API sync; and the check of a Postgres URL that
the store's config shares."""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import Annotated, Literal

import psycopg
from psycopg.conninfo import conninfo_to_dict
from pydantic import ByteSize, Field, SecretStr, field_validator, model_validator

from core.config.base import Duration, Model, TableName
from core.ids import sync_id_for
from core.redact import Said, said

IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def check_postgres_url(v: SecretStr | None) -> SecretStr | None:
    """A config validator: a URL (or conninfo string) libpq can parse. Its error quotes the
    part it cannot parse, often the password: the quoted text is left out. A password with an
    unencoded delimiter is named as such first (libpq would report a piece of it)."""
    if v is None:
        return v
    if not v.get_secret_value().strip():
        raise ValueError("is empty (an environment variable set to nothing?)")
    text = v.get_secret_value().strip()
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        # KEY='...' in a file for podman's or docker's --env-file, which keep the quotes
        raise ValueError(
            "not a valid PostgreSQL URL: the value is wrapped in quotes: remove them "
            "(podman/docker --env-file takes values literally)"
        )
    authority = re.split("[/?#]", v.get_secret_value().partition("://")[2])[0]
    if authority.count("@") > 1:  # libpq would read a piece of the password as the host
        raise ValueError(
            "not a valid PostgreSQL URL: its user info holds an '@' (in a password it is "
            "written %40)"
        )
    ports = [re.sub(r"^\[.*\]", "", h).partition(":")[2] for h in authority.split(",")]
    if "@" not in authority and any(not p.isdigit() for p in ports if p):
        # user:pa/ss@host: libpq reads "user" as the host and "pa" as its port
        raise ValueError(
            "not a valid PostgreSQL URL: its password seems to hold a '/', '?' or '#' "
            "(in a password they are written %2F, %3F and %23)"
        )
    hosts = authority.rpartition("@")[2].split(",")
    bad = [p for p in (re.sub(r"^\[.*\]", "", h).partition(":")[2] for h in hosts) if p]
    if "@" in authority and (words := [p for p in bad if not p.isdigit()]):
        raise ValueError(said("not a valid PostgreSQL URL: port %r is not a number", words[0]))
    if any(p.isdigit() and not 0 < int(p) < 65536 for p in ports):
        raise ValueError("not a valid PostgreSQL URL: a port is not in 1-65535")
    try:
        conninfo_to_dict(v.get_secret_value())
    except psycopg.Error as e:
        # A quoted piece that may hold the password is left out: any of a conninfo string
        # (key=value words) but its keys (``invalid connection option "hots"``), else one that
        # overlaps what stands before a URL's last '@'. Not core/redact.py's rule: libpq
        # quotes fragments of a password that match neither its shapes nor a whole secret,
        # and the config is not remembered yet.
        text = v.get_secret_value()
        conninfo = "=" in text and "://" not in text
        secret = text.rpartition("@")[0].partition("://")[2] or text.rpartition("@")[0]
        keys = set(re.findall(r"(?:^|\s)([A-Za-z_]\w*)\s*=", text)) if conninfo else set()
        values = re.sub(r"(?:^|\s)[A-Za-z_]\w*\s*=", " ", text)  # what is no key

        def shown(m: re.Match[str]) -> str:
            quoted = m.group(1)
            key = quoted in keys and quoted not in values
            hides = (conninfo and not key) or (secret and (quoted in secret or secret in quoted))
            return '"***"' if hides else m.group(0)

        reason = re.sub(r'"([^"]*)"', shown, str(e).strip().splitlines()[0])
        hint = Said(" (a % in a password is written %25)" if "percent" in reason else "")
        raise ValueError(said("not a valid PostgreSQL URL: %s%s", reason, hint)) from None
    return v


class SourceBase(Model):
    name: str = Field(
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="named by connectors, consumers and commands: letters, digits, `_` and `-`, "
        "up to 64",
    )
    id: uuid.UUID | None = Field(
        None,
        description="the sync id its messages carry (metadata, NATS subjects); default: one "
        "made from the name",
    )

    @property
    def sync_id(self) -> uuid.UUID:
        return self.id or sync_id_for(self.name)


class BackfillConfig(Model):
    """Tables ``weir run`` backfills into the records stream, once each, beside live capture."""

    tables: list[TableName] = Field([], description="the tables; default: every captured table")
    page_size: int = Field(
        5000,
        ge=1,
        le=100_000,
        description="rows read at a time (also by weir backfill and by the backfills capture "
        "asks for)",
    )
    sort_columns: dict[TableName, str] = Field(
        {}, description="per table, a NOT NULL column to page by before the key"
    )


class PostgresSource(SourceBase):
    """A database captured by logical replication (pgoutput)."""

    kind: Literal["postgres"] = Field(
        description="a database captured by logical replication (pgoutput)"
    )
    url: SecretStr = Field(description="the database (a URL or conninfo string)")
    publication: str = Field("weir_pub", description="the publication capture reads (lower-case)")
    slot: str = Field(
        "weir_slot",
        description="the replication slot (lower-case), made when missing; a slot is one store's",
    )
    tables: list[TableName] = Field([], description="tables to capture")
    schemas: list[str] = Field(
        [], description="schemas whose tables are captured, also those created later (followed)"
    )
    key_columns: dict[TableName, list[str]] = Field(
        {},
        description="the key columns of a table without a primary key (it needs REPLICA "
        "IDENTITY FULL)",
    )
    create_publication: bool = Field(
        True,
        description="create the publication when missing and keep the tables in it; false: "
        "it is made for the source by someone else, and a table missing from it is captured "
        "(and backfilled) once added",
    )
    on_unstorable: Literal["stop", "fail"] = Field(
        "stop",
        description="a change the store cannot hold (a record whose JSON is over 255 MiB): stop "
        "naming it, or put it on the source's failed list (weir.source_failures) and go on",
    )
    on_slot_loss: Literal["stop", "backfill"] = Field(
        "stop",
        description="when the slot was dropped, invalidated or moved by another program: stop "
        "with an error naming the lost changes, or go on and backfill every table",
    )
    heartbeat_interval: Duration = Field(
        timedelta(seconds=30),
        description="after this long without a transaction, a heartbeat goes through the "
        "source's WAL, so that the slot moves on",
    )
    status_interval: Duration = Field(
        timedelta(seconds=10),
        description="how often capture tells Postgres its position when no store write has "
        "a new one to confirm",
    )
    max_batch: int = Field(5000, ge=1, le=100_000, description="changes in one store write at most")
    max_batch_wait: Duration = Field(
        timedelta(milliseconds=50),
        description="the longest a batch gathers changes before its store write",
    )
    slot_lag_warning: ByteSize = Field(
        ByteSize(1 << 30), description="warn when the slot holds back more WAL (e.g. 512MiB)"
    )
    backfill: BackfillConfig | None = Field(
        None,
        description="tables weir run backfills into the records stream, once each, beside live "
        "capture; also the settings of weir backfill and of the backfills capture asks for",
    )

    _url = field_validator("url")(check_postgres_url)

    @property
    def provider(self) -> str:
        return "postgres"

    def backfills(self, table: str) -> bool:
        """Whether ``weir run`` backfills ``table`` (``schema.table`` as written) by this
        source's ``backfill:``."""
        return self.backfill is not None and (not self.backfill.tables
                                              or table in self.backfill.tables)  # fmt: skip

    @field_validator("publication", "slot")
    @classmethod
    def _ident(cls, v: str) -> str:
        if not IDENT.match(v):
            raise ValueError("must be a lower-case identifier: letters, digits and _")
        return v

    @model_validator(mode="after")
    def _some_tables(self) -> PostgresSource:
        if not self.tables and not self.schemas:
            raise ValueError("give tables: [schema.table, ...] or schemas: [name, ...]")
        return self


class HttpSource(SourceBase):
    """Records pushed over HTTP by an API sync."""

    kind: Literal["http"] = Field(
        description="records pushed over HTTP by an API sync (POST /v1/sources/{name}/records); "
        "needs api"
    )
    provider: str = Field(
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="the provider its messages name (metadata, NATS subjects, `{provider}`)",
    )


Source = Annotated[PostgresSource | HttpSource, Field(discriminator="kind")]
