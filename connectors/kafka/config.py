"""The ``kafka`` connector's settings (docs/configuration.md “Keys”)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any, Literal, Self

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from core.config.base import Duration, Model, TlsFiles
from core.config.connector import ConnectorBase
from core.config.steps import RouteField
from core.templates import Template, check_routed, check_template, routed_field


class _Quiet:
    """A librdkafka logger that drops its lines (a client made only to check properties
    warns that it has no brokers)."""

    def log(self, *line: object) -> None:
        pass


def _refusal(properties: dict[str, Any]) -> str | None:
    """Why librdkafka makes no producer with ``properties`` (and no brokers), in one line, or
    None when it makes one."""
    from confluent_kafka import KafkaException, Producer

    try:
        Producer(properties | {"bootstrap.servers": "", "logger": _Quiet()})
    except KafkaException as e:
        return " ".join(e.args[0].str().split())
    return None


# librdkafka's other names of its properties (its CONFIGURATION.md, "Alias for"): its errors
# name a property by the name on the right, whichever the config wrote.
_ALIASES = {
    "bootstrap.servers": "metadata.broker.list",
    "max.in.flight": "max.in.flight.requests.per.connection",
    "sasl.mechanism": "sasl.mechanisms",
    "sasl.oauthbearer.client.credentials.client.id": "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.client.credentials.client.secret": "sasl.oauthbearer.client.secret",
    "linger.ms": "queue.buffering.max.ms",
    "retries": "message.send.max.retries",
    "compression.type": "compression.codec",
    "acks": "request.required.acks",
    "delivery.timeout.ms": "message.timeout.ms",
}


def _property(key: str) -> str:
    """The property a librdkafka key sets, by librdkafka's own name for it (a topic's property
    may be written with ``topic.`` before it; none of the global ``topic.*`` ones is a topic
    property's name without it)."""
    name = key.removeprefix("topic.")
    return _ALIASES.get(name, name)


# The producer properties Weir's keys set (by librdkafka's own name), and the key of kafka:
# that sets each; librdkafka: may set them too, applied last, but for those of _WEIRS.
_KEYS = {
    "metadata.broker.list": "bootstrap_servers",
    "compression.codec": "compression",
    "queue.buffering.max.ms": "linger",
    "batch.size": "batch_bytes",
    "message.max.bytes": "max_message_bytes",
    "message.timeout.ms": "delivery_timeout",
    "allow.auto.create.topics": "auto_create_topics",
    "sasl.mechanisms": "sasl.mechanism",
    "sasl.username": "sasl.username",
    "sasl.password": "sasl.password",
    "ssl.ca.location": "tls.ca_file",
    "ssl.certificate.location": "tls.cert_file",
    "ssl.key.location": "tls.key_file",
    "ssl.key.password": "tls.key_password",
}
# Properties librdkafka: may not set (by librdkafka's own name), and what to give instead.
_WEIRS = {
    "metadata.broker.list": "give it as kafka.bootstrap_servers",
    "sasl.username": "give it in kafka.sasl",
    "sasl.password": "give it in kafka.sasl",
    "enable.idempotence": "Weir's producer is idempotent: a message goes once into Kafka",
    "request.required.acks": "Weir's producer waits for every in-sync replica (acks=all): "
    "nothing is lost",
}
_NAMED = re.compile(r"[A-Za-z][\w-]*(?:\.[\w-]+)+")  # what may be a property in librdkafka's text


def _invalid(problems: list[tuple[tuple[str, ...], str]]) -> ValidationError:
    """Problems of KafkaSettings, each where it is (a path under kafka:), as pydantic says
    them: raised in a validator, their paths go on from its own."""
    return ValidationError.from_exception_data("KafkaSettings", [
        InitErrorDetails(type=PydanticCustomError("value_error", "{reason}", {"reason": why}),
                         loc=where, input=None)
        for where, why in problems])  # fmt: skip


class KafkaSasl(Model):
    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "PLAIN", description="the SASL mechanism"
    )
    username: str = Field(description="the SASL user")
    password: SecretStr = Field(description="the SASL user's password")


class KafkaTls(TlsFiles):
    key_password: SecretStr | None = Field(None, description="the password of an encrypted key")


TOPIC_BAD = r"[^A-Za-z0-9._-]"  # what a topic name cannot hold


class KafkaSettings(Model):
    """Where and how to produce. ``topic`` may hold the placeholders {stream}, {sync_id},
    {provider}, {collection} and {route}; characters a topic name cannot hold become ``_``.
    """

    bootstrap_servers: str = Field(
        "127.0.0.1:9092", description="brokers to start from: host:port, comma-separated"
    )
    topic: str | None = Field(
        None,
        description="the topic, or a template of topics with placeholders `{stream}`, "
        "`{sync_id}`, `{provider}`, `{collection}` and `{route}` (a route step's `topic`; "
        "characters a topic name cannot hold become `_`); default: `sequin-{stream}`",
    )
    partitions: int = Field(6, ge=1, description="partitions of the topic weir kafka setup makes")
    replication_factor: int = Field(
        1, ge=1, description="replicas of the topic weir kafka setup makes"
    )
    compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = Field(
        "lz4", description="the producer's compression (compression.type)"
    )
    linger: Duration = Field(
        timedelta(milliseconds=5),
        description="how long the producer waits to fill a batch (linger.ms)",
    )
    batch_bytes: int = Field(
        1_000_000, ge=1, description="bytes of one partition's batch at most (batch.size)"
    )
    max_message_bytes: int = Field(
        1_000_000,
        ge=1000,
        description="a larger message goes to the failed list at once (message.max.bytes)",
    )
    delivery_timeout: Duration = Field(
        timedelta(seconds=30),
        description="how long the producer tries a message before it fails and is retried "
        "(message.timeout.ms)",
    )
    auto_create_topics: bool = Field(
        False,
        description="let the broker create a missing topic on first use, when it allows that "
        "(allow.auto.create.topics)",
    )
    sasl: KafkaSasl | None = Field(None, description="SASL authentication")
    tls: KafkaTls | None = Field(
        None, description="TLS: a CA to trust and, for mutual TLS, a client certificate and key"
    )
    librdkafka: dict[str, str | int | float | bool] = Field(
        {},
        description="any other librdkafka client property, applied last (one named `*password`, "
        "`*secret`, `*token` or `*.pem` is a secret)",
    )

    @field_validator("librdkafka")
    @classmethod
    def _not_weirs(
        cls, v: dict[str, str | int | float | bool]
    ) -> dict[str, str | int | float | bool]:
        """Properties that Weir's keys or guarantees set are not taken here, by any of their
        names: one given here replaced them without a word (bootstrap.servers, found by an
        outside tryout); nor one property under two of its names (the last would win)."""
        problems: list[tuple[tuple[str, ...], str]] = []
        seen: dict[str, str] = {}
        for key in v:
            prop = _property(key)
            if (instead := _WEIRS.get(prop)) is not None:
                problems.append(((key,), instead))
            elif prop in seen:
                problems.append(((key,), f"the same property as {seen[prop]}: give it once"))
            seen.setdefault(prop, key)
        if problems:
            raise _invalid(problems)
        return v

    @model_validator(mode="after")
    def _takes(self) -> Self:
        """The producer's properties (Weir's, from sasl: and tls:, and librdkafka:) are ones
        librdkafka takes together, and its files ones it can load: a producer made with them
        says so at load (made, not connected: it has no brokers), where it would be refused at
        each connect, for ever (found by an outside tryout). librdkafka's reason names each
        property by the key that gives it, as written."""
        reason = _refusal(self.producer_properties("check"))
        if reason is None:
            return self
        keys = self.where_given()
        named = {keys[p] for p in map(_property, _NAMED.findall(reason)) if p in keys}
        # Said at the one key it names, else at kafka:, naming each key from there.
        where = next(iter(named)) if len(named) == 1 else ()
        start = len(where) - 1 if where else 0

        def key(m: re.Match[str]) -> str:
            path = keys.get(_property(m[0]))
            return m[0] if path is None else ".".join(path[start:])

        raise _invalid([(where, _NAMED.sub(key, reason))])

    def where_given(self) -> dict[str, tuple[str, ...]]:
        """Where each producer property is given, by librdkafka's own name for it: the path
        of its key under kafka:, as written (librdkafka:'s, applied last, else Weir's)."""
        given = {prop: tuple(key.split(".")) for prop, key in _KEYS.items()}
        return given | {_property(key): ("librdkafka", key) for key in self.librdkafka}

    def key_of(self, prop: str) -> str:
        """The key that gives librdkafka's property ``prop``, for a line to name (kafka.…)."""
        return ".".join(("kafka", *self.where_given()[_property(prop)]))

    def client_properties(self, name: str) -> dict[str, Any]:
        """Connection properties shared by the producer, the read-back consumer and the admin
        of connector ``name``."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap_servers,
                                "client.id": f"weir-{name}"}  # fmt: skip
        if self.sasl is not None:
            conf |= {"sasl.mechanism": self.sasl.mechanism, "sasl.username": self.sasl.username,
                     "sasl.password": self.sasl.password.get_secret_value()}  # fmt: skip
        if self.tls is not None:
            for key, path in (("ssl.ca.location", self.tls.ca_file),
                              ("ssl.certificate.location", self.tls.cert_file),
                              ("ssl.key.location", self.tls.key_file)):  # fmt: skip
                if path is not None:
                    conf[key] = str(path)
            if self.tls.key_password is not None:
                conf["ssl.key.password"] = self.tls.key_password.get_secret_value()
        tls, sasl = self.tls is not None, self.sasl is not None
        conf["security.protocol"] = {(False, False): "PLAINTEXT", (True, False): "SSL",
                                     (False, True): "SASL_PLAINTEXT", (True, True): "SASL_SSL"}[
            (tls, sasl)]  # fmt: skip
        return conf

    def producer_properties(self, name: str) -> dict[str, Any]:
        return (
            self.client_properties(name)
            | {
                "enable.idempotence": True,
                "acks": "all",
                "compression.type": self.compression,
                "linger.ms": self.linger.total_seconds() * 1000,
                "batch.size": self.batch_bytes,
                "message.max.bytes": self.max_message_bytes,
                "message.timeout.ms": int(self.delivery_timeout.total_seconds() * 1000),
                "allow.auto.create.topics": self.auto_create_topics,
            }
            | dict(self.librdkafka)
        )

    @field_validator("topic")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must not be empty")
        return v if v is None else check_template(v)


class KafkaConnector(ConnectorBase):
    """Produces one stream to a Kafka topic (or a topic per collection), keyed by record."""

    type: Literal["kafka"] = Field(
        description="produces to a Kafka topic (or a topic per collection), keyed by record"
    )
    kafka: KafkaSettings = Field(
        default_factory=KafkaSettings, description="where and how to produce"
    )

    # route: {key: …} is the message key (the record's group key otherwise): its partition;
    # {topic: …} fills {route} in kafka.topic (a topic per tenant, say)
    ROUTES = {"key": RouteField(str, lambda v: None), "topic": routed_field(TOPIC_BAD)}

    def places(self) -> Template:
        return Template(self.topic, self.stream, TOPIC_BAD, "topic")

    @model_validator(mode="after")
    def _routed_topic(self) -> Self:
        check_routed(self.topic, self.steps, "topic", "kafka.topic")
        return self

    @property
    def topic(self) -> str:
        return self.kafka.topic or f"sequin-{self.stream}"
