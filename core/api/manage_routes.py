"""The management routes (docs/operations.md “Management API and CLI”), over core/api/manage.py:
sources, connectors and their shards (state, lag, rate; pause and resume), a connector's last hour,
and the failed lists of connectors and of HTTP pull consumers (page, show, retry, discard). Added to
the API's token-guarded router by ``build_app`` (core/api/app.py); ``weir failed`` and
``weir connector`` do the same from the command line (core/cli_operate.py).
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Body, Path, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator

from core.api.manage import Operations
from core.api.models import Deleted, Name, Out
from core.config.model import Connector
from core.errors import NotFound
from core.redact import said
from core.store.consumers import consumer_key
from core.store.operate import PAGE_MAX

EntryId = Annotated[str, Path(description="SOURCE:SEQ, e.g. app:1042")]


class SourceOut(Out):
    name: str
    kind: str
    state: str = Field(description="streaming, connecting, reconnecting, failed, not running…")
    detail: str = Field(description="why: the reason it reconnects, the error it failed with")
    owner: str | None = Field(description="the instance capturing it")
    last_lsn: str
    slot_lag_bytes: int | None = Field(description="WAL the replication slot holds back")


class ShardOut(Out):
    key: str = Field(description="NAME, or NAME#i/N for a shard of a split connector")
    state: str = Field(description="streaming, retrying, waiting, paused, not running…")
    detail: str
    owner: str | None = Field(description="the instance running it")
    lag_messages: int = Field(description="messages stored and not yet past its cursor")
    lag_seconds: float = Field(description="age of the oldest message not yet past its cursor")
    rate: float | None = Field(description="messages/s past its cursor, over the last sample")


class ConnectorOut(Out):
    name: str
    type: str
    stream: str
    origin: str = Field(description="config: declared in the YAML file (read-only here)")
    paused: bool
    failed: int = Field(description="messages on its failed list")
    shards: list[ShardOut]


class ConsumerStateOut(Out):
    name: str
    stream: str
    origin: str
    pending: int
    ack_pending: int
    failed: int


class SparkQueryOut(Out):
    name: str = Field(description="the query's name option")
    source: str
    stream: str
    seq: int = Field(description="the end of the last micro-batch it completed")
    lag_messages: int = Field(description="messages stored after it")
    lag_seconds: float = Field(description="how long ago the oldest of them was stored")


class ConnectorConfigOut(Out):
    origin: str = Field(description="config: the YAML file's (read-only here); api")
    config: dict[str, Any] = Field(description="as the YAML file gives it; secrets masked")
    warnings: list[str] = Field(
        [],
        description="made or changed: what its selection names that its sources do not have "
        "(a collection pattern or filter column that matches nothing), with the closest name",
    )


class Sample(Out):
    t: float = Field(description="epoch seconds")
    rate: float = Field(description="messages/s since the sample before")
    lag_messages: int
    lag_seconds: float


class FailedEntry(Out):
    id: str = Field(description="SOURCE:SEQ")
    source: str
    seq: int
    idempotency_key: str
    attempts: int = Field(description="attempts (a consumer's: deliveries) before it failed")
    error: str = Field(description="the last error")
    failed_at: str
    retry_requested: bool = Field(description="asked to be retried, not yet sent")


class FailedEntryFull(FailedEntry):
    message: Any = Field(description="the message as it is sent")


class FailedPage(Out):
    data: list[FailedEntry]
    next: str | None = Field(description="pass as `after` for the next page; null at the end")


class Choice(BaseModel):
    """Which entries of a failed list: ``ids``, or ``all``."""

    model_config = ConfigDict(extra="forbid")
    ids: list[str] | None = Field(None, max_length=PAGE_MAX)
    all: bool = False

    @model_validator(mode="after")
    def _one(self) -> Choice:
        if (self.ids is None) == (not self.all):
            raise ValueError('give either "ids": [...] or "all": true')
        return self

    def chosen(self) -> list[str] | None:
        return None if self.all else self.ids


class Count(Out):
    count: int = Field(description="entries it applied to")


def add_routes(api: APIRouter, ops: Operations) -> None:
    @api.get("/v1/sources", response_model=list[SourceOut], tags=["manage"])
    async def sources() -> Any:
        """Every source: state, slot lag, last LSN, owner."""
        return await ops.sources()

    @api.get("/v1/connectors", response_model=list[ConnectorOut], tags=["manage"])
    async def connectors() -> Any:
        """Every connector with its shards: state and why, lag, rate, owner."""
        return await ops.connectors()

    @api.get("/v1/connectors/{name}", response_model=ConnectorOut, tags=["manage"])
    async def connector(name: Name) -> Any:
        return await ops.connector(name)

    @api.post("/v1/connectors/{name}/pause", response_model=ConnectorOut, tags=["manage"])
    async def pause(name: Name) -> Any:
        """Stop it on every instance (drained); its cursors stay. Kept across restarts."""
        return await ops.pause(name, True)

    @api.post("/v1/connectors/{name}/resume", response_model=ConnectorOut, tags=["manage"])
    async def resume(name: Name) -> Any:
        """Run it again from where its cursors stand."""
        return await ops.pause(name, False)

    @api.get("/v1/connectors/{name}/history", response_model=list[Sample], tags=["manage"])
    async def history(name: Name) -> Any:
        """Throughput and lag over the last hour, a sample every few seconds."""
        await ops.connector(name)  # 404 for an unknown one
        return ops.history(name)

    @api.post("/v1/connectors", status_code=201, response_model=ConnectorConfigOut,
              tags=["manage"])  # fmt: skip
    async def create(connector: Annotated[Connector, Body()], request: Request) -> Any:
        """Make a connector (a `connectors:` entry of the YAML file, as JSON): every instance
        runs it within seconds, from its `start_position`."""
        return await ops.put(None, connector, await request.json())

    @api.get("/v1/connectors/{name}/config", response_model=ConnectorConfigOut, tags=["manage"])
    async def config(name: Name) -> Any:
        """A connector's config, secrets masked."""
        return await ops.config_of(name)

    @api.put("/v1/connectors/{name}", response_model=ConnectorConfigOut, tags=["manage"])
    async def change(name: Name, connector: Annotated[Connector, Body()], request: Request) -> Any:
        """Change a connector made over the API (not its type, stream or start position): its
        shards start again with the new config from their cursors."""
        return await ops.put(name, connector, await request.json())

    @api.delete("/v1/connectors/{name}", response_model=Deleted, tags=["manage"])
    async def delete(name: Name) -> Any:
        """Delete a connector made over the API, with its cursors, failed list and pause: it
        answers once the connector's sessions have ended on every instance (409 when one has
        not within 30 s); one made again under its name is another connector."""
        await ops.delete(name)
        return {"success": True}

    @api.get("/v1/consumers", response_model=list[ConsumerStateOut], tags=["manage"])
    async def consumers() -> Any:
        """Every HTTP pull consumer: its queue and failed list."""
        return await ops.consumers()

    @api.get("/v1/spark-queries", response_model=list[SparkQueryOut], tags=["manage"])
    async def spark_queries() -> Any:
        """Every named Spark query of the ``weir`` data source: where it is, and how far
        behind (docs/spark.md)."""
        return await ops.spark_queries()

    for prefix, key in (("/v1/connectors", str), ("/v1/http-consumers", consumer_key)):
        _failed_routes(api, ops, prefix, key)


def _failed_routes(api: APIRouter, ops: Operations, prefix: str, key: Any) -> None:
    """The failed-list routes under ``prefix``/{name}; ``key`` names the list of ``name``."""
    tags: list[str | Enum] = ["failed lists"]

    @api.get(f"{prefix}/{{name}}/failed", response_model=FailedPage, tags=tags)
    async def page(
        name: Name,
        limit: Annotated[int, Query(ge=1, le=PAGE_MAX)] = 50,
        after: Annotated[str | None, Query(description="the `next` of the page before")] = None,
    ) -> Any:
        """A page of the failed list, in stream order (by source, then seq)."""
        return await ops.failed(key(name), limit, after)

    @api.get(f"{prefix}/{{name}}/failed/{{entry}}", response_model=FailedEntryFull, tags=tags)
    async def show(name: Name, entry: EntryId) -> Any:
        """One failed message with its payload and last error."""
        one = await ops.failed_one(key(name), entry)  # its message as the JSON that is sent
        return Response(orjson.dumps(one), media_type="application/json")

    @api.post(f"{prefix}/{{name}}/failed/{{entry}}/retry", response_model=Count, tags=tags)
    async def retry_one(name: Name, entry: EntryId) -> Any:
        """Send it again, in order for its group; it leaves the list once delivered."""
        return {"count": await _one(await ops.retry(key(name), [entry]), entry)}

    @api.delete(f"{prefix}/{{name}}/failed/{{entry}}", response_model=Count, tags=tags)
    async def discard_one(name: Name, entry: EntryId) -> Any:
        """Delete it from the list for good."""
        return {"count": await _one(await ops.discard(key(name), [entry]), entry)}

    @api.post(f"{prefix}/{{name}}/failed/retry", response_model=Count, tags=tags)
    async def retry(name: Name, choice: Choice) -> Any:
        """Send the chosen entries (or all) again."""
        return {"count": await ops.retry(key(name), choice.chosen())}

    @api.post(f"{prefix}/{{name}}/failed/discard", response_model=Count, tags=tags)
    async def discard(name: Name, choice: Choice) -> Any:
        """Delete the chosen entries (or all) for good."""
        return {"count": await ops.discard(key(name), choice.chosen())}


async def _one(count: int, entry: str) -> int:
    if count == 0:
        raise NotFound(said("no failed message %s (retried or discarded already?)", entry))
    return count
