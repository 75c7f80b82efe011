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

    url: SecretStr | None = Field(
        None,
        description="the store's database (a URL or conninfo string); default: the first "
        "postgres source's",
    )
    schema_: str = Field(
        "weir", alias="schema", description="the schema of the store's tables (lower-case)"
    )
    events_retention: Duration = Field(
        timedelta(days=7),
        description="how long the events stream keeps events; the records stream keeps every "
        "record's newest version for ever",
    )

    _url = field_validator("url")(check_postgres_url)

    @field_validator("schema_")
    @classmethod
    def _schema_name(cls, v: str) -> str:
        if not _IDENT.match(v):
            raise ValueError("must be a lower-case SQL identifier")
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

    kind: Literal["http"] = Field(
        description="records pushed over HTTP by an API sync (POST /v1/sources/{name}/records); "
        "needs api"
    )
    provider: str = Field(
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="the provider its messages name (metadata, NATS subjects, `{provider}`)",
    )


Source = Annotated[PostgresSource | HttpSource, Field(discriminator="kind")]


class ApiConfig(Model):
    """The HTTP server of ``weir run``: Consume API, management, ingest. Every route but the
    probes (``/health``, ``/ready``) needs ``Authorization: Bearer <one of tokens>``.
    """

    listen: str = Field(
        "127.0.0.1:7376",
        pattern=r"^\[?[0-9A-Za-z.:-]+\]?:\d{1,5}$",
        description="host:port to serve on (an IPv6 address in brackets)",
    )
    tokens: list[SecretStr] = Field(
        min_length=1,
        description="bearer tokens, each of 16 characters or more: the API (all but /health and "
        "/ready) and the console's login take any of them",
    )
    max_body_bytes: ByteSize = Field(
        ByteSize(16 * 1024 * 1024), ge=1024, description="larger request bodies get 413"
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

    collection_id: Text = Field(
        "*", min_length=1, max_length=256, description="pattern of the collection ids it gets"
    )
    resource_id: Text = Field(
        "*", min_length=1, max_length=256, description="pattern of the record ids it gets"
    )


class ConsumerConfig(Model):
    """An HTTP pull consumer (docs/consume-api.md “Consumers”), from YAML or ``POST
    /v1/http-consumers``."""

    name: str = Field(
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="its name in the API's paths: letters, digits, `_` and `-`, up to 64",
    )
    stream: Literal["records", "events"] = Field(
        "events", description="records: each record's newest version; events: every change"
    )
    sources: list[str] | None = Field(None, description="the sources it reads; default: all")
    ack_wait_ms: int = Field(
        30_000,
        ge=100,
        le=12 * 3600 * 1000,
        description="visibility timeout, in ms: a received message not acked by then is "
        "delivered again",
    )
    max_deliver: int = Field(  # le: the store's integer
        -1, ge=-1, le=2**31 - 1, description="deliveries before the failed list; -1: no limit"
    )
    deliver_policy: Literal["all", "new"] = Field(
        "all",
        description="all: every retained message (records: every current record); new: only "
        "messages stored after its creation",
    )
    max_ack_pending: int = Field(
        10_000,
        ge=1,
        le=1_000_000,
        description="messages delivered and neither acked nor nacked at most (a hard cap)",
    )
    max_waiting: int = Field(
        20, ge=1, le=10_000, description="receive calls waiting at once; one more gets 429"
    )
    filters: ConsumerFilters = Field(
        ConsumerFilters(),
        description="which messages it gets, by patterns (`*` any text) of their ids",
    )
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
    store: StoreConfig = Field(
        default_factory=lambda: StoreConfig.model_validate({}),
        description="where the streams are kept: a schema in a Postgres database",
    )
    api: ApiConfig | None = Field(
        None,
        description="the HTTP API inside weir run (Consume API, management, ingest, console); "
        "consumers and http sources need it",
    )
    workers: WorkersConfig = Field(
        default_factory=lambda: WorkersConfig.model_validate({}),
        description="the worker processes weir run spreads its work over",
    )
    sources: list[Source] = Field(
        [], description="the databases captured and the HTTP syncs pushed in, told apart by kind"
    )
    connectors: list[Connector] = Field(
        [],
        description="each forwards one stream to a destination, whose kind its type names",
    )
    consumers: list[ConsumerConfig] = Field(
        [], description="HTTP pull consumers of the Consume API; more can be made over the API"
    )

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
