"""The ``sqs`` connector's settings (docs/configuration.md “Keys”)."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from core.config.base import Duration, Model, check_http_url, check_pair
from core.config.connector import ConnectorBase
from core.config.steps import RouteField, RouteStep
from core.ids import encode_token
from core.redact import said
from core.templates import Template, check_routed, check_template, routed_field

QUEUE_BAD = r"[^A-Za-z0-9_-]"  # what a queue name cannot hold


class SqsSettings(Model):
    """Where to send. ``queue_url`` may hold the placeholders {stream}, {sync_id}, {provider},
    {collection} (a queue per collection) and {route} (a route step's ``queue``); characters a
    queue name cannot hold become ``_``. A name ending in ``.fifo`` is a FIFO queue. Credentials
    come from the standard AWS chain unless given here.
    """

    queue_url: str = Field(
        description="the queue, or a template of queues with placeholders `{stream}`, "
        "`{sync_id}`, `{provider}`, `{collection}` and `{route}` (a route step's `queue`; "
        "characters a queue name cannot hold become `_`); a name ending in `.fifo` is a FIFO "
        "queue"
    )
    region: str = Field("us-east-1", description="the AWS region")
    endpoint_url: str | None = Field(
        None, description="another endpoint than AWS's (LocalStack, a VPC endpoint)"
    )
    access_key_id: str | None = Field(
        None,
        description="with secret_access_key; default: the standard AWS chain",
    )
    secret_access_key: SecretStr | None = Field(None, description="with access_key_id")
    session_token: SecretStr | None = Field(
        None, description="of temporary credentials, with access_key_id"
    )
    request_timeout: Duration = Field(
        timedelta(seconds=10), description="to connect, and to read an answer"
    )
    max_concurrent_requests: int = Field(16, ge=1, le=256, description="requests at once at most")

    @field_validator("queue_url")
    @classmethod
    def _template(cls, v: str) -> str:
        return check_template(check_http_url(v, "https://sqs.REGION.amazonaws.com/ACCOUNT/NAME"))

    @model_validator(mode="after")
    def _key_pair(self) -> SqsSettings:
        check_pair(self, "access_key_id", "secret_access_key")
        return self


def check_group(value: str) -> None:
    """What a route's ``group`` may be: an SQS MessageGroupId (a template's fields are written
    as subject tokens, which are)."""
    if not 0 < len(value) <= 128 or not all(33 <= ord(c) <= 126 for c in value):
        raise ValueError(
            said("%r is no MessageGroupId: 1 to 128 printable ASCII characters", value)
        )


class SqsConnector(ConnectorBase):
    """Sends one stream to an SQS queue: FIFO queues keep per-record order and dedupe."""

    # route: {group: …} is a FIFO queue's MessageGroupId (the record's group key otherwise);
    # {queue: …} fills {route} in sqs.queue_url (a queue per tenant, say)
    ROUTES = {"group": RouteField(encode_token, check_group), "queue": routed_field(QUEUE_BAD)}

    type: Literal["sqs"] = Field(
        description="sends to an SQS queue (or a queue per collection): FIFO queues keep "
        "per-record order and dedupe"
    )
    sqs: SqsSettings = Field(description="where to send")

    def places(self) -> Template:
        return Template(self.sqs.queue_url, self.stream, QUEUE_BAD, "queue")

    @model_validator(mode="after")
    def _groups_on_fifo(self) -> SqsConnector:
        check_routed(self.sqs.queue_url, self.steps, "queue", "sqs.queue_url")
        routed = any(isinstance(s, RouteStep) and "group" in s.route for s in self.steps)
        if routed and not self.sqs.queue_url.endswith(".fifo"):
            raise ValueError(
                "steps: a route's group is a FIFO queue's MessageGroupId; this queue is a "
                "standard one (its name does not end in .fifo)"
            )
        return self
