"""The config file's models (docs/configuration.md “The config file”): store, sources, API,
consumers, and the connectors of the registry. Reading the file is core/config/load.py."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import (
    ByteSize,
    Field,
    SecretStr,
    TypeAdapter,
    field_validator,
    model_validator,
)

from core.config.base import Duration, Model, Text
from core.config.connector import ConnectorBase
from core.config.sources import IDENT, HttpSource, PostgresSource, Source, check_postgres_url
from core.config.steps import FunctionsConfig, Step, check_steps
from core.redact import Said, said
from core.registry import connector_specs
from core.shards import Shard, split

log = logging.getLogger("weir.config")


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
    readers_hold: Duration = Field(
        timedelta(days=30),
        description="how long events a Spark query (docs/spark.md) has not read yet are kept "
        "past events_retention, also while it is stopped; older ones go, and the query then "
        "fails naming them",
    )

    _url = field_validator("url")(check_postgres_url)

    @field_validator("schema_")
    @classmethod
    def _schema_name(cls, v: str) -> str:
        if not IDENT.match(v):
            raise ValueError("must be a lower-case SQL identifier")
        return v


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
    steps: list[Step] = Field(
        [],
        description="filter, transform and enrich, in order, on each message when it is "
        "received (docs/transforms.md); no route: a consumer's messages have one place",
    )

    @field_validator("max_deliver")
    @classmethod
    def _max_deliver(cls, v: int) -> int:
        if v == 0:
            raise ValueError("must be -1 (no limit) or at least 1")
        return v

    @model_validator(mode="after")
    def _steps(self) -> ConsumerConfig:
        check_steps(self.steps, {}, "an HTTP pull consumer")
        return self


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
    functions: FunctionsConfig = Field(
        default_factory=lambda: FunctionsConfig.model_validate({}),
        description="the Python functions connectors' steps call (docs/transforms.md)",
    )

    @model_validator(mode="after")
    def _checks(self) -> WeirConfig:
        for kind, items in (("source", self.sources), ("connector", self.connectors),
                            ("consumer", self.consumers)):  # fmt: skip
            names = [i.name for i in items]
            dupes = sorted({n for n in names if names.count(n) > 1})
            if dupes:
                raise ValueError(said("%s names must be unique: %s", Said(kind), ", ".join(dupes)))
        for kind, users in (("connector", self.connectors), ("consumer", self.consumers)):
            for c in users:
                try:
                    self.sources_of(c)
                except UnknownSourceError as e:
                    raise ValueError(said("%s %r: %s", Said(kind), c.name, e)) from None
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
            raise UnknownSourceError(said("no source named %s", ", ".join(unknown)))
        return [s for s in self.sources if names is None or s.name in names]

    def with_stored(self, stored: list[tuple[int, dict[str, Any], Any, Any]]) -> WeirConfig:
        """This config with the connectors made over the API (core/store/connectors.py: each
        one's id and config) after the file's. One that no longer fits the file (the file now
        declares its name, or no longer a source it reads) is left out, with a warning."""
        extra = []
        names = {c.name for c in self.connectors}
        for incarnation, raw, heads, added in stored:
            try:
                c = CONNECTOR.validate_python(raw).made(incarnation, heads, added)
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
            said("no source named %r (have: %s)", name, ", ".join(s.name for s in self.sources))
        )

    def postgres_source(self, name: str) -> PostgresSource:
        """The postgres source ``name``; KeyError (its message in ``args[0]``) otherwise."""
        src = self.source(name)
        if not isinstance(src, PostgresSource):
            raise KeyError(said("source %r is a %s source, not a postgres one", name, src.kind))
        return src


class UnknownSourceError(ValueError):
    """A connector or consumer names a source the file does not declare."""
