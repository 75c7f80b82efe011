"""The SQS sink: ``SendMessageBatch`` calls of up to 10 entries, several at once.

The engine puts at most one message per group key in flight, so the entries of one batch
belong to different groups and their calls may run concurrently without breaking per-record
order. FIFO queues get ``MessageGroupId`` = the group key (its SHA-256 hex when longer than
128 characters) and ``MessageDeduplicationId`` = SHA-256 hex of the idempotency key
(docs/design.md “Guarantees”), so a resend within the queue's 5-minute window is dropped by SQS. SQS
cannot be read without consuming it, so there is no read-back: across a longer outage a
resend may show twice, and standard queues are at-least-once anyway.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from connectors.sqs.config import SqsConnector
from core.engine.sink import BatchError, FatalError, RetryableError
from core.envelope import Message
from core.redact import said
from core.templates import Unrouted

log = logging.getLogger("weir.sqs")

MAX_ENTRIES = 10  # SendMessageBatch
MISSING_QUEUE = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def group_id(group: str) -> str:
    return group if len(group) <= 128 else _sha256(group)


class SqsSink:
    """One connector's SQS client (see core/engine/sink.py for the contract)."""

    def __init__(self, cfg: SqsConnector) -> None:
        self.cfg = cfg
        self.settings = cfg.sqs
        self.queues = cfg.places()
        self._client: Any = None
        self._pool = ThreadPoolExecutor(cfg.sqs.max_concurrent_requests, f"sqs-{cfg.name}")
        self._max_size: dict[str, int] = {}  # queue URL -> MaximumMessageSize

    async def connect(self) -> None:
        s = self.settings
        timeout = s.request_timeout.total_seconds()
        config = Config(
            region_name=s.region,
            retries={"mode": "standard", "max_attempts": 2},  # the engine retries beyond
            connect_timeout=timeout,
            read_timeout=timeout,
            max_pool_connections=s.max_concurrent_requests,
        )
        creds: dict[str, Any] = {}
        if s.access_key_id is not None and s.secret_access_key is not None:
            creds = {"aws_access_key_id": s.access_key_id,
                     "aws_secret_access_key": s.secret_access_key.get_secret_value()}  # fmt: skip
            if s.session_token is not None:
                creds["aws_session_token"] = s.session_token.get_secret_value()
        self._client = boto3.session.Session().client(
            "sqs", endpoint_url=s.endpoint_url, config=config, **creds
        )
        if self.queues.fixed:  # fail early on a wrong URL or credentials
            await self._queue_limit(self.queues.template)

    async def _call(self, fn: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, lambda: fn(**kwargs))

    async def _queue_limit(self, url: str) -> int:
        size = self._max_size.get(url)
        if size is None:
            attrs = await self._call(self._client.get_queue_attributes, QueueUrl=url,
                                     AttributeNames=["MaximumMessageSize"])  # fmt: skip
            size = self._max_size[url] = int(attrs["Attributes"]["MaximumMessageSize"])
        return size

    async def write_batch(self, batch: Sequence[Message]) -> None:
        failed: dict[int, Exception] = {}
        by_queue: dict[str, list[int]] = {}
        for i, m in enumerate(batch):
            try:
                by_queue.setdefault(self.queues.render(m), []).append(i)
            except Unrouted as e:
                failed[i] = FatalError(str(e))
        calls = []
        for url, indexes in by_queue.items():
            try:
                limit = await self._queue_limit(url)
            except (ClientError, BotoCoreError) as e:
                for i in indexes:
                    failed[i] = _error(e)
                continue
            chunk: list[int] = []
            size = 0
            for i in indexes:
                n = len(batch[i].payload)
                if n > limit:
                    failed[i] = FatalError(
                        said(
                            "message of %s bytes is over the queue's MaximumMessageSize (%s)",
                            n,
                            limit,
                        )
                    )
                    continue
                if chunk and (len(chunk) == MAX_ENTRIES or size + n > limit):
                    calls.append(self._send(url, batch, chunk, failed))
                    chunk, size = [], 0
                chunk.append(i)
                size += n
            if chunk:
                calls.append(self._send(url, batch, chunk, failed))
        await asyncio.gather(*calls)
        if failed:
            raise BatchError(failed)

    async def _send(
        self, url: str, batch: Sequence[Message], chunk: list[int], failed: dict[int, Exception]
    ) -> None:
        fifo = url.endswith(".fifo")
        entries = []
        for i in chunk:
            m = batch[i]
            entry: dict[str, Any] = {"Id": str(i), "MessageBody": m.payload.decode()}
            if fifo:
                group = m.group if m.route is None else m.route.get("group", m.group)
                entry["MessageGroupId"] = group_id(group)
                entry["MessageDeduplicationId"] = _sha256(m.key)
            entries.append(entry)
        try:
            resp = await self._call(self._client.send_message_batch, QueueUrl=url, Entries=entries)
        except (ClientError, BotoCoreError) as e:
            if _code(e) in MISSING_QUEUE:
                self._max_size.pop(url, None)
            for i in chunk:
                failed[i] = _error(e)
            return
        for f in resp.get("Failed", []):
            text = f"SQS {f.get('Code')}: {f.get('Message', '')}"
            failed[int(f["Id"])] = (
                FatalError(text) if f.get("SenderFault") else RetryableError(text)
            )

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._client is not None:
            self._client.close()


def _code(e: Exception) -> str:
    return str(e.response.get("Error", {}).get("Code", "")) if isinstance(e, ClientError) else ""


def _error(e: Exception) -> RetryableError:
    """A call that failed as a whole (throttled, 5xx, no such queue, no network): each of its
    messages is retried after a backoff.
    """
    return RetryableError(said("SQS %s: %s", _code(e) or type(e).__name__, e))


def make_sink(cfg: SqsConnector) -> SqsSink:
    return SqsSink(cfg)
