"""The routes of HTTP pull consumers (docs/consume-api.md “Consume API”): their management, and the
Consume API in its three route families over one engine (core/api/consume.py).

Added to the API's token-guarded router by ``build_app`` (core/api/app.py). The receive routes
build their JSON from the stored texts, without a response model's validation.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Body, Depends, Query
from fastapi.responses import Response

from core.api.consume import BATCH, MAX_BATCH, MAX_WAIT_MS, Consumers
from core.api.models import (
    AckIds,
    AckTokens,
    ConsumerList,
    ConsumerOut,
    Deleted,
    Name,
    NextResponse,
    PullResponse,
    Settled,
    StreamReceive,
    StreamResponse,
)
from core.config.model import ConsumerConfig
from core.config.steps import STORED
from core.errors import Invalid, NotFound
from core.redact import said
from core.sources.pg.selected import selection_problems
from core.store.consumers import Delivery

log = logging.getLogger("weir.api")

_dumps = orjson.dumps
WaitFor = Annotated[int, Query(ge=0, le=MAX_WAIT_MS, description="long-poll this many ms")]


def batch_size_of(batch_size: int | None, max_batch_size: int | None) -> int:
    """The batch size a receive asks for, by either name (``max_batch_size`` is Sequin's
    current one); :class:`Invalid` when both are given and differ."""
    if batch_size is not None and max_batch_size is not None and batch_size != max_batch_size:
        raise Invalid(
            said(
                "batch_size (%s) and max_batch_size (%s) differ; give one of them",
                batch_size,
                max_batch_size,
            )
        )
    return batch_size or max_batch_size or BATCH


def _batch_query(
    batch_size: Annotated[
        int | None, Query(ge=1, le=MAX_BATCH, description=f"messages at most (default {BATCH})")
    ] = None,
    max_batch_size: Annotated[
        int | None, Query(ge=1, le=MAX_BATCH, description="Sequin's current name for batch_size")
    ] = None,
) -> int:
    return batch_size_of(batch_size, max_batch_size)


BatchSize = Annotated[int, Depends(_batch_query)]


def _out(cfg: ConsumerConfig, **more: Any) -> ConsumerOut:
    """A consumer as the API shows it, without checking its steps' functions again: a stored
    one's may be gone since (its messages then fail saying so)."""
    return ConsumerOut.model_validate({**cfg.model_dump(), **more}, context=STORED)


def _json(body: bytes) -> Response:
    return Response(content=body, media_type="application/json")


def _next_item(d: Delivery) -> bytes:
    m = d.message
    parts = [
        b'{"ack_token":"', d.token.encode(), b'","record":{"id":', _dumps(m.key),
        b',"collection_id":', _dumps(m.collection_id), b',"resource_id":', _dumps(d.record_id),
        b',"data":', d.record.encode(), b',"deleted":', b"true" if d.deleted else b"false",
        b',"sync_id":"', m.sync_id.encode(), b'","provider":', _dumps(d.provider),
        b',"upstream_updated_at":', _dumps(d.ts), b',"seq":', str(m.seq).encode(),
    ]  # fmt: skip
    if m.action is not None:
        parts += [b',"action":"', d.action.encode(), b'","changes":',
                  (d.changes or "null").encode()]  # fmt: skip
    parts.append(b"}}")
    return b"".join(parts)


def _pull_item(d: Delivery) -> bytes:
    return b"".join((
        b'{"ack_token":"', d.token.encode(), b'","record":', d.record.encode(),
        b',"changes":', (d.changes or "null").encode(), b',"action":"', d.action.encode(), b'"}',
    ))  # fmt: skip


def _stream_item(d: Delivery) -> bytes:
    return b'{"ack_id":"' + d.token.encode() + b'","data":' + d.message.payload + b"}"


def _settle_routes(api: APIRouter, consumers: Consumers) -> None:
    """``POST …/ack`` and ``…/nack`` of the three route families: ``ack_tokens`` for two,
    ``ack_ids`` for sequin_streams.
    """

    def handlers(ack: bool) -> tuple[Any, Any]:
        async def tokens(name: Name, body: AckTokens) -> Any:
            count = await consumers.settle(name, body.ack_tokens, ack, "ack_tokens")
            return {"success": True, "count": count}

        async def ids(name: Name, body: AckIds) -> Any:
            count = await consumers.settle(name, body.ack_ids, ack, "ack_ids")
            return {"success": True, "count": count}

        return tokens, ids

    for verb, ack in (("ack", True), ("nack", False)):
        tokens, ids = handlers(ack)
        for family, handler in (("v1/http-consumers", tokens),
                                ("api/http_pull_consumers", tokens),
                                ("api/sequin_streams", ids)):  # fmt: skip
            api.add_api_route(
                f"/{family}/{{name}}/{verb}", handler, methods=["POST"], response_model=Settled,
                name=f"{verb}_{family.replace('/', '_').replace('-', '_')}",
            )  # fmt: skip


def add_routes(api: APIRouter, consumers: Consumers) -> None:
    """Consumer management, receive, ack and nack routes, on ``api``."""

    async def items(name: str, batch_size: int, wait_for: int, item: Any) -> bytes:
        got = await consumers.receive(name, batch_size, wait_for)
        return b'{"data":[' + b",".join([item(d) for d in got]) + b"]"

    # -- management -------------------------------------------------------------------

    @api.post("/v1/http-consumers", status_code=201, response_model=ConsumerOut)
    async def create_consumer(cfg: ConsumerConfig) -> ConsumerOut:
        await consumers.create(cfg)
        unmatched = await asyncio.to_thread(selection_problems, consumers.cfg, [cfg])
        for problem in unmatched:
            log.warning("%s", problem)
        return _out(cfg, origin="api", warnings=unmatched)

    @api.get("/v1/http-consumers", response_model=ConsumerList)
    async def list_consumers() -> ConsumerList:
        return ConsumerList(data=[_out(c, origin=o) for c, o in await consumers.listing()])

    @api.get("/v1/http-consumers/{name}", response_model=ConsumerOut)
    async def get_consumer(name: Name) -> ConsumerOut:
        found = await consumers.listing(name)
        if not found:
            raise NotFound(said("no consumer named %r", name))
        c, origin = found[0]
        return _out(c, origin=origin, info=await consumers.info(name))

    @api.delete("/v1/http-consumers/{name}", response_model=Deleted)
    async def delete_consumer(name: Name) -> dict[str, Any]:
        await consumers.delete(name)
        return {"success": True}

    # -- consume: /v1 ---------------------------------------------------------------------

    @api.get("/v1/http-consumers/{name}/next", responses={200: {"model": NextResponse}})
    async def next_(name: Name, batch_size: BatchSize, wait_for: WaitFor = 0) -> Response:
        body = await items(name, batch_size, wait_for, _next_item)
        info = await consumers.info(name)
        return _json(body + b',"info":' + _dumps(info) + b"}")

    # -- consume: http_pull_consumers -----------------------------------------------------

    @api.get("/api/http_pull_consumers/{name}/receive", responses={200: {"model": PullResponse}})
    async def receive_pull(name: Name, batch_size: BatchSize, wait_for: WaitFor = 0) -> Response:
        return _json(await items(name, batch_size, wait_for, _pull_item) + b"}")

    # -- consume: sequin_streams ----------------------------------------------------------

    @api.get("/api/sequin_streams/{name}/receive", responses={200: {"model": StreamResponse}})
    async def receive_stream(name: Name, batch_size: BatchSize, wait_for: WaitFor = 0) -> Response:
        return _json(await items(name, batch_size, wait_for, _stream_item) + b"}")

    @api.post("/api/sequin_streams/{name}/receive", responses={200: {"model": StreamResponse}})
    async def receive_stream_post(
        name: Name, body: Annotated[StreamReceive | None, Body()] = None
    ) -> Response:
        body = body or StreamReceive()
        n = batch_size_of(body.batch_size, body.max_batch_size)
        return _json(await items(name, n, body.wait_for, _stream_item) + b"}")

    _settle_routes(api, consumers)
