"""The webhook sink: POSTs ``{"data": [message, ...]}`` to one URL.

The engine puts at most one message per group key in flight, so the messages of one request
belong to different records and several requests may be out at once. A 2xx answer
acknowledges the whole request. When a request of several messages fails, each of them is
sent again on its own at once, so that one message the receiver refuses does not hold back
the others; a single message's failure goes back to the engine, which retries it with backoff
and jitter and, after ``max_attempts``, moves it to the failed list. A message the receiver
answers 413 (too large) alone fails at once. A receiver cannot be read back, so after a crash
of Weir a message may come twice: receivers drop repeats by ``metadata.idempotency_key``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections.abc import Sequence

import httpx
import orjson

from connectors.webhook.config import WebhookConnector
from core.engine.sink import BatchError, FatalError, RetryableError
from core.envelope import Message
from core.failures import url_addresses
from core.redact import first_line, redact, said


def signature(secret: bytes, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>`` of ``{timestamp}.{body}``: what a receiver recomputes to verify."""
    mac = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


class WebhookSink:
    """One connector's HTTP client (see core/engine/sink.py for the contract)."""

    def __init__(self, cfg: WebhookConnector) -> None:
        self.cfg = cfg
        self.settings = cfg.webhook
        self._client: httpx.AsyncClient | None = None

    async def connect(self) -> None:
        s = self.settings
        headers = {k: v.get_secret_value() for k, v in s.headers.items()}
        headers["content-type"] = "application/json"
        limits = httpx.Limits(max_connections=s.max_connections)
        self._client = httpx.AsyncClient(
            headers=headers, timeout=s.timeout.total_seconds(), limits=limits
        )

    def url(self, m: Message) -> str:
        """The URL, with the path its steps' route gave the message after it."""
        if m.route is not None and "path" in m.route:
            return f"{self.settings.url.rstrip('/')}/{m.route['path']}"
        return self.settings.url

    async def write_batch(self, batch: Sequence[Message]) -> None:
        by_url: dict[str, list[int]] = {}
        for i, m in enumerate(batch):
            by_url.setdefault(self.url(m), []).append(i)
        done = await asyncio.gather(*(self._write(url, [batch[i] for i in places])
                                      for url, places in by_url.items()))  # fmt: skip
        failed = {places[j]: e for places, fails in zip(by_url.values(), done, strict=True)
                  for j, e in fails.items()}  # fmt: skip
        if failed:
            raise BatchError(failed)

    async def _write(self, url: str, batch: list[Message]) -> dict[int, Exception]:
        """One request of ``batch``; when it fails, each message alone: what failed, by place."""
        error = await self._post(url, batch)
        if error is None:
            return {}
        if len(batch) == 1:
            return {0: error}
        alone = await asyncio.gather(*(self._post(url, [m]) for m in batch))
        return {i: e for i, e in enumerate(alone) if e is not None}

    async def _post(self, url: str, batch: Sequence[Message]) -> Exception | None:
        """None when the receiver took the messages, else why not."""
        assert self._client is not None, "write_batch() before connect()"
        # Each message's idempotency key beside it, also when steps made a payload without it
        body = b'{"data":[%b],"idempotency_keys":%b}' % (
            b",".join([m.payload for m in batch]),
            orjson.dumps([m.key for m in batch]),
        )
        headers = {}
        if self.settings.secret is not None:
            ts = str(int(time.time()))
            headers["webhook-timestamp"] = ts
            headers["webhook-signature"] = signature(
                self.settings.secret.get_secret_value().encode(), ts, body
            )
        try:
            resp = await self._client.post(url, content=body, headers=headers)
        except httpx.TimeoutException:
            return RetryableError(
                said(
                    "no answer within %ss (timeout)",
                    format(self.settings.timeout.total_seconds(), "g"),
                )
            )
        except httpx.HTTPError as e:
            return RetryableError(self._unanswered(url, e))
        if resp.is_success:
            return None
        # A receiver may echo what it was sent (a token in a header): redacted whole, then cut.
        text = (said("HTTP %s: %s", resp.status_code, redact(resp.text)[:200]) if resp.content
                else said("HTTP %s", resp.status_code))  # fmt: skip
        if resp.status_code == 413 and len(batch) == 1:
            return FatalError(text)
        return RetryableError(text)

    def _unanswered(self, url: str, e: httpx.HTTPError) -> str:
        """One line for a post that got no answer: what became of it, where, what to check
        (httpx said ``ConnectError: [Errno -2] Name or service not known``, or ``ReadError: ``
        for a reset connection; found by an outside tryout)."""
        where = url_addresses([url])
        told = first_line(e) if str(e).strip() else ""
        if isinstance(e, httpx.ConnectError):
            return said("cannot connect to the receiver at %s: %s; check webhook.url", where,
                        told or said("refused"))  # fmt: skip
        what = (said("closed the connection before it answered") if isinstance(e, httpx.ReadError)
                else said("did not answer (%s)", type(e).__name__))  # fmt: skip
        return said("the receiver at %s %s: %s", where, what, told) if told else said(
            "the receiver at %s %s", where, what)  # fmt: skip

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()


def make_sink(cfg: WebhookConnector) -> WebhookSink:
    return WebhookSink(cfg)
