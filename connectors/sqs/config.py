"""The ``sqs`` connector's settings (docs/configuration.md “Connector types”)."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from core.config.base import ConnectorBase, Duration, Model, check_http_url, check_pair
from core.templates import check_template


class SqsSettings(Model):
    """Where to send. ``queue_url`` may hold the placeholders {stream}, {sync_id}, {provider}
    and {collection} (a queue per collection); characters a queue name cannot hold become
    ``_``. A name ending in ``.fifo`` is a FIFO queue. Credentials come from the standard AWS
    chain unless given here.
    """

    queue_url: str
    region: str = "us-east-1"
    endpoint_url: str | None = None
    access_key_id: str | None = None
    secret_access_key: SecretStr | None = None
    session_token: SecretStr | None = None
    request_timeout: Duration = timedelta(seconds=10)
    max_concurrent_requests: int = Field(16, ge=1, le=256)

    @field_validator("queue_url")
    @classmethod
    def _template(cls, v: str) -> str:
        return check_template(check_http_url(v, "https://sqs.REGION.amazonaws.com/ACCOUNT/NAME"))

    @model_validator(mode="after")
    def _key_pair(self) -> SqsSettings:
        check_pair(self, "access_key_id", "secret_access_key")
        return self


class SqsConnector(ConnectorBase):
    """Sends one stream to an SQS queue: FIFO queues keep per-record order and dedupe."""

    type: Literal["sqs"]
    sqs: SqsSettings
