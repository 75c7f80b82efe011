"""The ``kafka`` connector's settings (docs/configuration.md “Connector types”)."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field, SecretStr, field_validator

from core.config.base import ConnectorBase, Duration, Model, TlsFiles
from core.templates import check_template


class KafkaSasl(Model):
    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "PLAIN"
    username: str
    password: SecretStr


class KafkaTls(TlsFiles):
    key_password: SecretStr | None = None


class KafkaSettings(Model):
    """Where and how to produce. ``topic`` may hold the placeholders {stream}, {sync_id},
    {provider} and {collection}; characters a topic name cannot hold become ``_``.
    """

    bootstrap_servers: str = "127.0.0.1:9092"
    topic: str | None = None  # default: sequin-records / sequin-events
    partitions: int = Field(6, ge=1)  # for `weir kafka setup`
    replication_factor: int = Field(1, ge=1)
    compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = "lz4"
    linger: Duration = timedelta(milliseconds=5)
    batch_bytes: int = Field(1_000_000, ge=1)
    max_message_bytes: int = Field(1_000_000, ge=1000)
    delivery_timeout: Duration = timedelta(seconds=30)
    auto_create_topics: bool = False
    sasl: KafkaSasl | None = None
    tls: KafkaTls | None = None
    librdkafka: dict[str, str | int | float | bool] = {}  # more client properties, applied last

    @field_validator("topic")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("must not be empty")
        return v if v is None else check_template(v)


class KafkaConnector(ConnectorBase):
    """Produces one stream to a Kafka topic (or a topic per collection), keyed by record."""

    type: Literal["kafka"]
    kafka: KafkaSettings = KafkaSettings()

    @property
    def topic(self) -> str:
        return self.kafka.topic or f"sequin-{self.stream}"
