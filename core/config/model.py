"""The config file's models (docs/configuration.md “The config file”): store, sources, API,
consumers, and the connectors of the registry. Reading the file is core/config/load.py."""

from __future__ import annotations

import logging
import re
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

import psycopg
from psycopg.conninfo import conninfo_to_dict
from pydantic import (
    ByteSize,
    Field,
    SecretStr,
    TypeAdapter,
    field_validator,
    model_validator,
)

from core.config.base import ConnectorBase, Duration, Model, TableName, Text
from core.ids import sync_id_for
from core.registry import connector_specs
from core.shards import Shard, split

log = logging.getLogger("weir.config")

_IDENT = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def check_postgres_url(v: SecretStr | None) -> SecretStr | None:
    """A config validator: a URL (or conninfo string) libpq can parse. Its error quotes the
    part it cannot parse, often the password: the quoted text is left out. A password with an
    unencoded delimiter is named as such first (libpq would report a piece of it)."""
    if v is None:
        return v
    if not v.get_secret_value().strip():
        raise ValueError("is empty (an environment variable set to nothing?)")
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
        raise ValueError(f"not a valid PostgreSQL URL: port {words[0]!r} is not a number")
    if any(p.isdigit() and not 0 < int(p) < 65536 for p in ports):
        raise ValueError("not a valid PostgreSQL URL: a port is not in 1-65535")
    try:
        conninfo_to_dict(v.get_secret_value())
    except psycopg.Error as e:
        # A quoted piece that may hold the password is left out: any of a conninfo string
        # (key=value words), else one that overlaps what stands before a URL's last '@'.
        # Not core/redact.py's rule: libpq quotes fragments of a password that match neither
        # its shapes nor a whole secret, and the config is not remembered yet.
        text = v.get_secret_value()
        conninfo = "=" in text and "://" not in text
        secret = text.rpartition("@")[0].partition("://")[2] or text.rpartition("@")[0]

        def shown(m: re.Match[str]) -> str:
            quoted = m.group(1)
            hides = conninfo or (secret and (quoted in secret or secret in quoted))
            return '"***"' if hides else m.group(0)

        reason = re.sub(r'"([^"]*)"', shown, str(e).strip().splitlines()[0])
        hint = " (a % in a password is written %25)" if "percent" in reason else ""
        raise ValueError(f"not a valid PostgreSQL URL: {reason}{hint}") from None
    return v


class StoreConfig(Model):
    """Where the streams are kept. ``url`` defaults to the first postgres source's url."""

    url: SecretStr | None = None
    schema_: str = Field("weir", alias="schema")
    events_retention: Duration = timedelta(days=7)

    _url = field_validator("url")(check_postgres_url)

    @field_validator("schema_")
    @classmethod
    def _schema_name(cls, v: str) -> str:
        if not _IDENT.match(v):
            raise ValueError("must be a lower-case SQL identifier")
        return v


class SourceBase(Model):
    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    id: uuid.UUID | None = None

    @property
    def sync_id(self) -> uuid.UUID:
        return self.id or sync_id_for(self.name)


class BackfillConfig(Model):
    """Tables ``weir run`` backfills into the records stream, once each, beside live capture."""

    tables: list[TableName] = Field([], description="schema.table entries; default: every table")
    page_size: int = Field(5000, ge=1, le=100_000)
    sort_columns: dict[TableName, str] = Field(
        {}, description="schema.table: a NOT NULL column to page by before the key"
    )


class PostgresSource(SourceBase):
    """A database captured by logical replication (pgoutput)."""

    kind: Literal["postgres"]
    url: SecretStr
    publication: str = "weir_pub"
    slot: str = "weir_slot"
    tables: list[TableName] = []
    schemas: list[str] = []
    key_columns: dict[TableName, list[str]] = {}
    create_publication: bool = True
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
    heartbeat_interval: Duration = timedelta(seconds=30)
    status_interval: Duration = timedelta(seconds=10)
    max_batch: int = Field(5000, ge=1, le=100_000)
    max_batch_wait: Duration = timedelta(milliseconds=50)
    slot_lag_warning: ByteSize = Field(
        ByteSize(1 << 30), description="warn when the slot holds back more WAL (e.g. 512MiB)"
    )
    backfill: BackfillConfig | None = None

    _url = field_validator("url")(check_postgres_url)

    @property
    def provider(self) -> str:
        return "postgres"

    @field_validator("publication", "slot")
    @classmethod
    def _ident(cls, v: str) -> str:
        if not _IDENT.match(v):
            raise ValueError("must be a lower-case identifier: letters, digits and _")
        return v

    @model_validator(mode="after")
    def _some_tables(self) -> PostgresSource:
        if not self.tables and not self.schemas:
            raise ValueError("give tables: [schema.table, ...] or schemas: [name, ...]")
        return self


class HttpSource(SourceBase):
    """Records pushed over HTTP by an API sync."""

    kind: Literal["http"]
    provider: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")


Source = Annotated[PostgresSource | HttpSource, Field(discriminator="kind")]


class ApiConfig(Model):
    """The HTTP server of ``weir run``: Consume API, management, ingest. Every route needs
    ``Authorization: Bearer <one of tokens>``.
    """

    listen: str = Field("127.0.0.1:7376", pattern=r"^\[?[0-9A-Za-z.:-]+\]?:\d{1,5}$")
    tokens: list[SecretStr] = Field(min_length=1)
    max_body_bytes: ByteSize = Field(
        ByteSize(16 * 1024 * 1024), ge=1024, description="larger request bodies get 413 (16MiB)"
    )

    @field_validator("tokens")
    @classmethod
    def _no_empty_token(cls, v: list[SecretStr]) -> list[SecretStr]:
        if any(len(t.get_secret_value()) < 16 for t in v):
            raise ValueError("every token needs at least 16 characters")
        return v

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host.strip("[]"), int(port)


class ConsumerFilters(Model):
    """Which messages a consumer gets: ``*`` wildcards on collection and record ids."""

    collection_id: Text = Field("*", min_length=1, max_length=256)
    resource_id: Text = Field("*", min_length=1, max_length=256)


class ConsumerConfig(Model):
    """An HTTP pull consumer (docs/consume-api.md “Consumers”), from YAML or ``POST
    /v1/http-consumers``."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    stream: Literal["records", "events"] = "events"
    sources: list[str] | None = Field(None, description="source names; default all")
    ack_wait_ms: int = Field(30_000, ge=100, le=12 * 3600 * 1000, description="visibility timeout")
    max_deliver: int = Field(  # le: the store's integer
        -1, ge=-1, le=2**31 - 1, description="deliveries before the failed list; -1: no limit"
    )
    deliver_policy: Literal["all", "new"] = "all"
    max_ack_pending: int = Field(10_000, ge=1, le=1_000_000)
    max_waiting: int = Field(20, ge=1, le=10_000)
    filters: ConsumerFilters = ConsumerFilters()
    group_columns: list[Text] | None = Field(
        None, description="record fields that group messages; default: the record id"
    )

    @field_validator("max_deliver")
    @classmethod
    def _max_deliver(cls, v: int) -> int:
        if v == 0:
            raise ValueError("must be -1 (no limit) or at least 1")
        return v


if TYPE_CHECKING:
    Connector = ConnectorBase
else:  # the union of the registry's config models, told apart by ``type:``
    Connector = Annotated[
        Union[tuple(s.config for s in connector_specs())],  # noqa: UP007
        Field(discriminator="type"),
    ]


CONNECTOR: TypeAdapter[Connector] = TypeAdapter(Connector)  # a connector as YAML gives it


class WorkersConfig(Model):
    """The worker processes ``weir run`` supervises (core/runtime/supervisor.py): each runs
    the works of one role that its index selects, under the same leases as instances do."""

    sources: int = Field(
        1,
        ge=1,
        le=64,
        description="processes capturing the postgres sources "
        "(and their backfills); source k of the file runs in process k mod N",
    )
    connectors: int = Field(
        1,
        ge=1,
        le=64,
        description="processes forwarding the connectors; connector shard k of the file "
        "(their shards in order; one per connector without shards:) runs in process k mod N",
    )


class WeirConfig(Model):
    store: StoreConfig = Field(default_factory=lambda: StoreConfig.model_validate({}))
    api: ApiConfig | None = None
    workers: WorkersConfig = Field(default_factory=lambda: WorkersConfig.model_validate({}))
    sources: list[Source] = []
    connectors: list[Connector] = []
    consumers: list[ConsumerConfig] = []

    @model_validator(mode="after")
    def _checks(self) -> WeirConfig:
        for kind, items in (("source", self.sources), ("connector", self.connectors),
                            ("consumer", self.consumers)):  # fmt: skip
            names = [i.name for i in items]
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(f"{kind} names must be unique: {', '.join(dupes)}")
        for kind, users in (("connector", self.connectors), ("consumer", self.consumers)):
            for c in users:
                try:
                    self.sources_of(c)
                except UnknownSourceError as e:
                    raise ValueError(f"{kind} {c.name!r}: {e}") from None
        if self.api is None and (
            self.consumers or any(isinstance(s, HttpSource) for s in self.sources)
        ):
            raise ValueError("consumers and http sources are served by the API: add api:")
        if self.store.url is None and not any(isinstance(s, PostgresSource) for s in self.sources):
            raise ValueError("store.url is required when no postgres source is declared")
        return self

    @property
    def store_url(self) -> str:
        if self.store.url is not None:
            return self.store.url.get_secret_value()
        pg = next(s for s in self.sources if isinstance(s, PostgresSource))
        return pg.url.get_secret_value()

    @property
    def store_named(self) -> str:
        """The store as messages name it: without ``store.url``, it is a source's database."""
        if self.store.url is not None:
            return "the store"
        pg = next(s for s in self.sources if isinstance(s, PostgresSource))
        return f"the store (source {pg.name}'s database: no store.url)"

    def sources_of(
        self, connector: Connector | ConsumerConfig
    ) -> list[PostgresSource | HttpSource]:
        """The sources a connector or consumer reads: those it names, else all."""
        names = connector.sources
        known = {s.name for s in self.sources}
        unknown = [n for n in names or [] if n not in known]
        if unknown:
            raise UnknownSourceError(f"no source named {', '.join(unknown)}")
        return [s for s in self.sources if names is None or s.name in names]

    def with_stored(self, stored: list[tuple[int, dict[str, Any]]]) -> WeirConfig:
        """This config with the connectors made over the API (core/store/connectors.py: each
        one's id and config) after the file's. One that no longer fits the file (the file now
        declares its name, or no longer a source it reads) is left out, with a warning."""
        extra = []
        names = {c.name for c in self.connectors}
        for incarnation, raw in stored:
            try:
                c = CONNECTOR.validate_python(raw).made(incarnation)
                if c.name in names:
                    raise ValueError("the config file declares a connector of that name")
                self.sources_of(c)
            except ValueError as e:  # ValidationError included
                log.warning("connector %s made over the API is left out: %s",
                            raw.get("name"), " ".join(str(e).split()))  # fmt: skip
                continue
            extra.append(c)
        return self.model_copy(update={"connectors": [*self.connectors, *extra]})

    def connector_shards(self) -> list[tuple[Connector, Shard]]:
        """Every connector's units of work, in the file's order: its shards (core/shards.py)."""
        return [(c, shard) for c in self.connectors for shard in split(c.shards)]

    def source(self, name: str) -> PostgresSource | HttpSource:
        for s in self.sources:
            if s.name == name:
                return s
        raise KeyError(
            f"no source named {name!r} (have: {', '.join(s.name for s in self.sources)})"
        )

    def postgres_source(self, name: str) -> PostgresSource:
        """The postgres source ``name``; KeyError (its message in ``args[0]``) otherwise."""
        src = self.source(name)
        if not isinstance(src, PostgresSource):
            raise KeyError(f"source {name!r} is a {src.kind} source, not a postgres one")
        return src


class UnknownSourceError(ValueError):
    """A connector or consumer names a source the file does not declare."""
