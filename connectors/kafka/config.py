"""The ``kafka`` connector's settings (docs/configuration.md “Keys”)."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field, SecretStr, field_validator

from core.config.base import ConnectorBase, Duration, Model, TlsFiles
from core.templates import check_template


class _Quiet:
    """A librdkafka logger that drops its lines (a client made only to check properties
    warns that it has no brokers)."""

    def log(self, *line: object) -> None:
        pass


class KafkaSasl(Model):
    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = Field(
        "PLAIN", description="the SASL mechanism"
    )
    username: str = Field(description="the SASL user")
    password: SecretStr = Field(description="the SASL user's password")


class KafkaTls(TlsFiles):
    key_password: SecretStr | None = Field(None, description="the password of an encrypted key")


class KafkaSettings(Model):
    """Where and how to produce. ``topic`` may hold the placeholders {stream}, {sync_id},
    {provider} and {collection}; characters a topic name cannot hold become ``_``.
    """

    bootstrap_servers: str = Field(
        "127.0.0.1:9092", description="brokers to start from: host:port, comma-separated"
    )
    topic: str | None = Field(
        None,
        description="the topic, or a template of topics with placeholders `{stream}`, "
        "`{sync_id}`, `{provider}`, `{collection}` (characters a topic name cannot hold become "
        "`_`); default: `sequin-{stream}`",
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
    def _known(cls, v: dict[str, str | int | float | bool]) -> dict[str, str | int | float | bool]:
        """Properties librdkafka knows, with values it takes: a client made with them says so
        at load (made, not connected: it has no brokers), where the producer would fail at
        each connect, for ever. Made with them all, as some ask for others."""
        if v:
            from confluent_kafka import KafkaException, Producer

            try:
                Producer(dict(v) | {"bootstrap.servers": "", "logger": _Quiet()})
            except KafkaException as e:
                raise ValueError(e.args[0].str()) from None
        return v

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
    kafka: KafkaSettings = Field(KafkaSettings(), description="where and how to produce")

    @property
    def topic(self) -> str:
        return self.kafka.topic or f"sequin-{self.stream}"
