"""The ``kafka`` connector's settings (docs/configuration.md “Keys”)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal, Self

from pydantic import Field, SecretStr, field_validator, model_validator

from core.config.base import ConnectorBase, Duration, Model, TlsFiles
from core.templates import check_template


class _Quiet:
    """A librdkafka logger that drops its lines (a client made only to check properties
    warns that it has no brokers)."""

    def log(self, *line: object) -> None:
        pass


def _made_with(properties: dict[str, Any]) -> None:
    """A producer made with ``properties`` and no brokers, or ValueError with librdkafka's
    reason in one line."""
    from confluent_kafka import KafkaException, Producer

    try:
        Producer(properties | {"bootstrap.servers": "", "logger": _Quiet()})
    except KafkaException as e:
        raise ValueError(" ".join(e.args[0].str().split())) from None


# librdkafka properties Weir sets itself, and what to give instead.
_WEIRS = {
    "bootstrap.servers": "give it as kafka.bootstrap_servers",
    "sasl.username": "give it in kafka.sasl",
    "sasl.password": "give it in kafka.sasl",
    "enable.idempotence": "Weir's producer is idempotent: a message goes once into Kafka",
    "acks": "Weir's producer waits for every in-sync replica (acks=all): nothing is lost",
    "request.required.acks": "Weir's producer waits for every in-sync replica (acks=all)",
}


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
    def _not_weirs(
        cls, v: dict[str, str | int | float | bool]
    ) -> dict[str, str | int | float | bool]:
        """Properties that Weir's keys or guarantees set are not taken here: one given here
        replaced them without a word (bootstrap.servers, found by an outside tryout)."""
        for key in v:
            if (owner := _WEIRS.get(key)) is not None:
                raise ValueError(f"{key}: {owner}")
        if v:  # named here when they alone are wrong; the producer's whole set is _takes's
            _made_with(dict(v))
        return v

    @model_validator(mode="after")
    def _takes(self) -> Self:
        """The producer's properties (Weir's, from sasl: and tls:, and librdkafka:) are ones
        librdkafka takes together, and its files ones it can load: a producer made with them
        says so at load (made, not connected: it has no brokers), where it would be refused at
        each connect, for ever (found by an outside tryout)."""
        _made_with(self.producer_properties("check"))
        return self

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

    @property
    def topic(self) -> str:
        return self.kafka.topic or f"sequin-{self.stream}"
