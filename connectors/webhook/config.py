"""The ``webhook`` connector's settings (docs/configuration.md “Keys”;
docs/design.md “Webhook requests”)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Literal
from urllib.parse import quote

from pydantic import AfterValidator, Field, SecretStr, field_validator

from core.config.base import Duration, Model, check_http_url
from core.config.connector import BatchPolicy, ConnectorBase
from core.config.steps import RouteField
from core.redact import said


def _one_line(v: SecretStr) -> SecretStr:
    """What no request can carry is refused here, named by its key, instead of by the HTTP
    client at every request: a line break (YAML's ``|`` adds one), a character beyond ASCII."""
    text = v.get_secret_value()
    if set(text) & {"\r", "\n"}:
        raise ValueError("a header value cannot hold a line break (YAML's | adds one: use |-)")
    if not text.isascii():
        raise ValueError(
            "a header value is sent as ASCII and this one holds other characters: "
            "encode them as the receiver expects (percent-encoding, base64)"
        )
    return v


class WebhookSettings(Model):
    """Where to POST. With ``secret`` each request carries ``webhook-signature: sha256=<hex>``,
    the HMAC-SHA256 of ``{webhook-timestamp}.{body}`` keyed with the secret. ``headers`` are
    sent with every request (their values are secrets: an API key, a bearer token).
    """

    url: str = Field(description="where to POST: an http:// or https:// URL")
    secret: SecretStr | None = Field(
        None,
        description="signs each request: `webhook-signature: sha256=<hex>`, the HMAC-SHA256 of "
        "`{webhook-timestamp}.{body}`",
    )
    headers: dict[str, Annotated[SecretStr, AfterValidator(_one_line)]] = Field(
        {},
        description="sent with every request; their values are secrets, ASCII, and hold no line "
        "break (YAML's `|` adds one, `|-` does not)",
    )
    timeout: Duration = Field(
        timedelta(seconds=10), description="a request not answered within it is retried"
    )
    max_connections: int = Field(16, ge=1, le=256, description="connections at once at most")

    @field_validator("url")
    @classmethod
    def _http(cls, v: str) -> str:
        return check_http_url(v, "https://hooks.example.com/weir")


def check_path(value: str) -> None:
    """What a route's ``path`` may be: a relative path put after the URL (a template's fields
    are percent-encoded)."""
    if not value or value.startswith("/") or any(c in value for c in "?#\\") or any(
        c.isspace() or ord(c) < 32 for c in value
    ) or ".." in value.split("/"):  # fmt: skip
        raise ValueError(
            said(
                "%r is no path to put after the URL: relative, without ?, #, \\, .. or white space",
                value,
            )
        )


def _segment(value: str) -> str:
    """A field's value as one path segment: percent-encoded, its dots too (``.`` and ``..``
    would climb out of the path: found by an outside tryout)."""
    return quote(value, safe="").replace(".", "%2E")


class WebhookConnector(ConnectorBase):
    """POSTs batches of one stream's messages as ``{"data": [message, ...], "idempotency_keys":
    [key, ...]}`` (each message's key at its place, whatever steps made of it): a 2xx answer
    acknowledges them; anything else, or no answer within ``timeout``, is retried with the
    connector's backoff (``retry``), and after ``retry.max_attempts`` the message goes to the
    failed list.
    """

    type: Literal["webhook"] = Field(
        description='POSTs batches as `{"data": [message, ...], "idempotency_keys": [key, ...]}`'
        " (each message's idempotency key at its place, whatever steps made of the message);"
        " a 2xx answer acknowledges them"
    )
    batch: BatchPolicy = Field(
        BatchPolicy(max_messages=100, max_bytes=1024 * 1024),
        description="the messages of one request",
    )
    webhook: WebhookSettings = Field(description="where to POST")

    # route: {path: …} is put after the URL (a path of the receiver's per message)
    ROUTES = {"path": RouteField(_segment, check_path)}
