"""The HTTP API of ``weir run`` (DESIGN.md section 8): management of HTTP pull consumers, the
Consume API in its three route families, HTTP ingest for ``kind: http`` sources, and
``/metrics``, ``/health`` and ``/ready``.

FastAPI on uvicorn, in a thread with its own event loop, so request handling does not wait on
the connectors' loop. Every route but the probes (``/health``, ``/ready``) needs a bearer
token from ``api.tokens``, compared in constant time. Errors are JSON ``{"detail": reason}``
with a 4xx status. The hot routes (receive) build their JSON from the stored texts and skip
response-model validation; the models below document them in the OpenAPI schema.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import threading
from typing import Annotated, Any, Literal

import orjson
import psycopg
import uvicorn
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from fastapi import APIRouter, Body, Depends, FastAPI, HTTPException, Path, Query
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, ConfigDict, Field

from core.api import consume
from core.api import refusals as api_refusals
from core.api.consume import MAX_BATCH, MAX_WAIT_MS, ApiError, Consumers, Delivery
from core.config.model import ConsumerConfig, PostgresSource, WeirConfig
from core.failures import postgres_unreachable
from core.runtime.metrics import Metrics
from core.sources.http import Ingest, IngestRecord
from core.store import SESSION, Store

log = logging.getLogger("weir.api")

_dumps = orjson.dumps
Name = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
BatchSize = Annotated[int, Query(ge=1, le=MAX_BATCH)]
WaitFor = Annotated[int, Query(ge=0, le=MAX_WAIT_MS, description="long-poll this many ms")]


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class Info(_Out):
    num_pending: int = Field(description="queued and visible")
    num_ack_pending: int = Field(description="delivered and not yet acknowledged")


class ConsumerOut(ConsumerConfig):
    origin: Literal["api", "config"]
    info: Info | None = Field(None, description="only when one consumer is asked for")


class ConsumerList(_Out):
    data: list[ConsumerOut]


class NextItem(_Out):
    ack_token: str
    record: dict[str, Any]


class NextResponse(_Out):
    data: list[NextItem]
    info: Info


class PullItem(_Out):
    ack_token: str
    record: dict[str, Any]
    changes: dict[str, Any] | None
    action: str


class PullResponse(_Out):
    data: list[PullItem]


class StreamItem(_Out):
    ack_id: str
    data: dict[str, Any]


class StreamResponse(_Out):
    data: list[StreamItem]


class AckTokens(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ack_tokens: list[str] = Field(min_length=1, max_length=10_000)


class AckIds(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ack_ids: list[str] = Field(min_length=1, max_length=10_000)


class StreamReceive(BaseModel):
    model_config = ConfigDict(extra="forbid")
    batch_size: int = Field(10, ge=1, le=MAX_BATCH)
    wait_for: int = Field(0, ge=0, le=MAX_WAIT_MS)


class Settled(_Out):
    success: bool
    count: int = Field(description="tokens that matched a current delivery")


class Deleted(_Out):
    success: bool


class FailedList(_Out):
    data: list[dict[str, Any]]


class IngestBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    records: list[IngestRecord] = Field(min_length=1, max_length=10_000)


class IngestResult(_Out):
    accepted: int = Field(description="changes written to the streams")
    skipped: int = Field(description="records not newer than the stored version")


class Refused(_Out):
    detail: str = Field(description="why")


REFUSALS = [
    (400, "Bad request"),
    (401, "No valid bearer token"),
    (404, "No such consumer or source"),
    (409, "Conflict with what exists"),
    (413, "Request body larger than api.max_body_bytes"),
    (429, "Too many receive calls waiting (max_waiting)"),
]


class Health(_Out):
    status: str


class Ready(_Out):
    status: str
    checks: dict[str, str] = Field(description="'ok' or why not, per dependency")


async def _reachable(url: str, what: str) -> str:
    try:
        conn = await psycopg.AsyncConnection.connect(url, connect_timeout=3, autocommit=True)
    except psycopg.Error as e:
        return str(postgres_unreachable(e, url, what))
    async with conn:
        await conn.execute("SELECT 1")
    return "ok"


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


Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(HTTPBearer(auto_error=False))]


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


def build_app(
    consumers: Consumers, ingest: Ingest, metrics: Metrics, tokens: list[bytes], max_body: int
) -> FastAPI:
    async def authorized(creds: Bearer) -> None:  # async: no hop to a thread pool
        given = creds.credentials.encode() if creds else b""
        ok = False
        for token in tokens:  # every token is compared, each in constant time
            ok |= hmac.compare_digest(given, token)
        if not ok:
            raise HTTPException(
                401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"}
            )

    app = FastAPI(
        title="Weir API",
        version="1",
        description="Consume API, HTTP pull consumer management, HTTP ingest, metrics.",
        openapi_url=None,  # served below, behind the token
        docs_url=None,
        redoc_url=None,
    )
    api = APIRouter(
        dependencies=[Depends(authorized)],
        responses={code: {"model": Refused, "description": text} for code, text in REFUSALS},
    )

    @api.get("/openapi.json", include_in_schema=False)
    async def openapi() -> dict[str, Any]:
        return app.openapi()

    api_refusals.install(app, max_body)

    async def items(name: str, batch_size: int, wait_for: int, item: Any) -> bytes:
        got = await consumers.receive(name, batch_size, wait_for)
        return b'{"data":[' + b",".join([item(d) for d in got]) + b"]"

    # -- management -------------------------------------------------------------------

    @api.post("/v1/http-consumers", status_code=201, response_model=ConsumerOut)
    async def create_consumer(cfg: ConsumerConfig) -> dict[str, Any]:
        await consumers.create(cfg)
        return {**cfg.model_dump(), "origin": "api"}

    @api.get("/v1/http-consumers", response_model=ConsumerList)
    async def list_consumers() -> dict[str, Any]:
        return {"data": [{**c.model_dump(), "origin": o} for c, o in await consumers.listing()]}

    @api.get("/v1/http-consumers/{name}", response_model=ConsumerOut)
    async def get_consumer(name: Name) -> dict[str, Any]:
        found = await consumers.listing(name)
        if not found:
            raise ApiError(404, f"no consumer named {name!r}")
        c, origin = found[0]
        return {**c.model_dump(), "origin": origin, "info": await consumers.info(name)}

    @api.delete("/v1/http-consumers/{name}", response_model=Deleted)
    async def delete_consumer(name: Name) -> dict[str, Any]:
        await consumers.delete(name)
        return {"success": True}

    @api.get("/v1/http-consumers/{name}/failed", response_model=FailedList)
    async def failed(name: Name, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> Any:
        return {"data": await consumers.failed(name, limit)}

    # -- consume: /v1 ---------------------------------------------------------------------

    @api.get("/v1/http-consumers/{name}/next", responses={200: {"model": NextResponse}})
    async def next_(name: Name, batch_size: BatchSize = 10, wait_for: WaitFor = 0) -> Response:
        body = await items(name, batch_size, wait_for, _next_item)
        info = await consumers.info(name)
        return _json(body + b',"info":' + _dumps(info) + b"}")

    # -- consume: http_pull_consumers -----------------------------------------------------

    @api.get("/api/http_pull_consumers/{name}/receive", responses={200: {"model": PullResponse}})
    async def receive_pull(
        name: Name, batch_size: BatchSize = 10, wait_for: WaitFor = 0
    ) -> Response:
        return _json(await items(name, batch_size, wait_for, _pull_item) + b"}")

    # -- consume: sequin_streams ----------------------------------------------------------

    @api.get("/api/sequin_streams/{name}/receive", responses={200: {"model": StreamResponse}})
    async def receive_stream(
        name: Name, batch_size: BatchSize = 10, wait_for: WaitFor = 0
    ) -> Response:
        return _json(await items(name, batch_size, wait_for, _stream_item) + b"}")

    @api.post("/api/sequin_streams/{name}/receive", responses={200: {"model": StreamResponse}})
    async def receive_stream_post(
        name: Name, body: Annotated[StreamReceive | None, Body()] = None
    ) -> Response:
        body = body or StreamReceive()
        return _json(await items(name, body.batch_size, body.wait_for, _stream_item) + b"}")

    _settle_routes(api, consumers)

    # -- ingest ---------------------------------------------------------------------------

    @api.post("/v1/sources/{name}/records", response_model=IngestResult)
    async def ingest_records(name: Name, body: IngestBody) -> Any:
        accepted, skipped = await ingest.write(name, body.records)
        return {"accepted": accepted, "skipped": skipped}

    # -- operating: /health and /ready need no token (probes); /metrics does -------------

    @app.get("/health", response_model=Health)
    async def health() -> dict[str, Any]:
        """The process is up."""
        return {"status": "up"}

    @app.get("/ready", response_model=Ready, responses={503: {"model": Ready}})
    async def ready() -> JSONResponse:
        """The store and every postgres source answer."""
        checks = {"store": await _reachable(consumers.store.url, "the store")}
        for src in consumers.cfg.sources:
            if isinstance(src, PostgresSource):
                what = f"source {src.name}"
                checks[what] = await _reachable(src.url.get_secret_value(), what)
        ok = all(v == "ok" for v in checks.values())
        body = {"status": "ready" if ok else "not ready", "checks": checks}
        return JSONResponse(body, status_code=200 if ok else 503)

    @api.get("/metrics", response_class=Response)
    async def metrics_() -> Response:
        """Prometheus text format."""
        text = await asyncio.to_thread(metrics.render)
        return Response(content=text, media_type=CONTENT_TYPE_LATEST)

    app.include_router(api)
    return app


class ApiServer:
    """The API in a thread of its own: ``start()`` returns once it listens; ``stop()`` drains."""

    def __init__(self, cfg: WeirConfig, store: Store, metrics: Metrics) -> None:
        assert cfg.api is not None
        self.cfg = cfg
        self.store = store
        self.metrics = metrics
        self.host, self.port = cfg.api.host_port
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="api", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # reported to start() or logged
            self._error = e
            if self._ready.is_set():
                log.error("api: stopped: %s", e)
            self._ready.set()

    async def _serve(self) -> None:
        assert self.cfg.api is not None
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            self.store.url,
            min_size=2,
            max_size=10,
            open=False,
            kwargs={"autocommit": True, "application_name": "weir:api", "options": SESSION},
        )
        await pool.open(wait=True, timeout=30)
        consumers = Consumers(self.cfg, self.store, pool)
        ingest = Ingest(self.cfg, self.store, self.metrics)
        sweeper = AsyncIOScheduler()
        try:
            await consumers.start()
            sweeper.add_job(consumers.sweep, "interval", seconds=consume.SWEEP_EVERY,
                            max_instances=1, coalesce=True)  # fmt: skip
            sweeper.start()
            tokens = [t.get_secret_value().encode() for t in self.cfg.api.tokens]
            max_body = self.cfg.api.max_body_bytes
            app = build_app(consumers, ingest, self.metrics, tokens, max_body)
            config = uvicorn.Config(
                app, host=self.host, port=self.port, log_level="warning", access_log=False,
                lifespan="off", timeout_graceful_shutdown=5,
            )  # fmt: skip
            self._server = uvicorn.Server(config)
            serving = asyncio.create_task(self._server.serve())
            while not self._server.started and not serving.done():
                await asyncio.sleep(0.02)
            if serving.done():
                serving.result()
                raise OSError(f"api: cannot listen on {self.cfg.api.listen}")
            log.info("api: listening on http://%s:%d", self.host, self.port)
            self._ready.set()
            await serving
        finally:
            if sweeper.running:
                sweeper.shutdown(wait=False)
            await consumers.stop()
            ingest.close()
            await pool.close()

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
