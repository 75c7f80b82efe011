"""The HTTP API of ``weir run`` (docs/consume-api.md “Consume API”): one app factory over the route
modules, and the server that runs it.

- core/api/consume_routes.py: management of HTTP pull consumers, the Consume API in its three
  route families (engine: core/api/consume.py);
- core/api/manage_routes.py: sources, connectors, failed lists: what an operator reads and does
  (engine: core/api/manage.py), which the console shows too;
- core/api/ingest_routes.py: HTTP ingest for ``kind: http`` sources;
- core/api/probes.py: ``/health``, ``/ready`` and ``/metrics``;
- core/api/console/: the web console at ``/console``, behind a login with the same tokens;
- core/api/models.py: the shapes of requests and answers; core/api/refusals.py: error bodies
  and the HTTP status of each refusal (core/errors.py).

FastAPI on uvicorn, in a thread with its own event loop, so request handling does not wait on
the connectors' loop. Every route but the probes (``/health``, ``/ready``) needs a bearer
token from ``api.tokens``, compared in constant time. Errors are JSON ``{"detail": reason}``
with a 4xx status.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import threading
from typing import Annotated, Any

import orjson
import uvicorn
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from psycopg_pool import AsyncConnectionPool

from core.api import consume, consume_routes, ingest_routes, manage_routes, probes, refusals
from core.api.console import routes as console
from core.api.console.sessions import token_ok
from core.api.consume import Consumers
from core.api.listen import listen
from core.api.manage import Operations
from core.api.models import Refused
from core.config.model import WeirConfig
from core.failures import scheduled
from core.metrics import Metrics
from core.redact import said
from core.sources.http import Ingest
from core.store import SESSION, Store

log = logging.getLogger("weir.api")

Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(HTTPBearer(auto_error=False))]


def _number(text: str) -> float:
    v = float(text)
    digits = text.lower().partition("e")[0]
    if not math.isfinite(v) or (v == 0 and any(c in "123456789" for c in digits)):  # 1e-400
        raise ValueError(said("%s is beyond a double's range: send such numbers as strings", text))
    return v


def _integer(text: str) -> int:
    v = int(text)
    if not -(2**63) <= v < 2**64:
        raise ValueError(said("%s is beyond 64 bits: send such numbers as strings", text))
    return v


def _constant(name: str) -> Any:
    raise ValueError(said("%s is not JSON: send it as a string", name))


_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")  # the escape of half a UTF-16 pair


class _JsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            raw = await self.body()
            try:
                body = raw.decode()
            except UnicodeDecodeError as e:
                why = f"byte {raw[e.start]:#04x} is not UTF-8"
                raise json.JSONDecodeError(why, "", e.start) from None
            try:
                self._json = json.loads(
                    body, parse_float=_number, parse_int=_integer, parse_constant=_constant
                )
                if _SURROGATE.search(body):  # orjson refuses a lone one (text is Unicode)
                    orjson.loads(body)
            except json.JSONDecodeError:  # orjson's too: FastAPI answers it with a 422
                raise
            except (ValueError, RecursionError) as e:
                raise json.JSONDecodeError(str(e), body, 0) from None
        return self._json


class JsonRoute(APIRoute):
    """Request bodies read as JSON every parser reads: bytes that are not UTF-8, ``NaN``,
    ``Infinity``, numbers beyond a double's range (``1e400``, ``1e-400``), integers beyond 64
    bits and lone surrogates are refused (422, ``json_invalid`` and why) instead of read as
    other values or failing later (a 500)."""

    def get_route_handler(self) -> Any:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            return await handler(_JsonRequest(request.scope, request.receive))

        return route


def build_app(
    consumers: Consumers,
    ops: Operations,
    ingest: Ingest,
    metrics: Metrics,
    tokens: list[bytes],
    max_body: int,
) -> FastAPI:
    """The API over a started consume engine, management and ingest; called once by
    :class:`ApiServer`."""

    async def authorized(creds: Bearer) -> None:  # async: no hop to a thread pool
        if not token_ok(creds.credentials.encode() if creds else b"", tokens):
            raise HTTPException(
                401, "a valid bearer token is required", headers={"WWW-Authenticate": "Bearer"}
            )

    app = FastAPI(
        title="Weir API",
        version="1",
        description="Consume API, HTTP pull consumers, management (sources, connectors, failed"
        " lists), HTTP ingest, metrics.",
        openapi_url=None,  # served below, behind the token
        docs_url=None,
        redoc_url=None,
    )
    api = APIRouter(
        route_class=JsonRoute,
        dependencies=[Depends(authorized)],
        responses={code: {"model": Refused, "description": text}
                   for code, text in refusals.REFUSALS},
    )  # fmt: skip

    @api.get("/openapi.json", include_in_schema=False)
    async def openapi() -> dict[str, Any]:
        return app.openapi()

    refusals.install(app, max_body)
    app.state.ops = ops  # the console reads and acts through it too
    consume_routes.add_routes(api, consumers)
    manage_routes.add_routes(api, ops)
    ingest_routes.add_routes(api, ingest)
    probes.add_routes(app, api, consumers.cfg, consumers.store.url, metrics)
    app.include_router(api)
    console.add_routes(app, tokens)
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
        self._consumers: Consumers | None = None
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
        sock = listen(self.host, self.port)  # before anything else: a port in use is said at once
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            self.store.url,
            min_size=2,
            max_size=10,
            open=False,
            kwargs={"autocommit": True, "application_name": "weir:api", "options": SESSION},
        )
        await pool.open(wait=True, timeout=30)
        consumers = self._consumers = Consumers(self.cfg, self.store, pool)
        ops = Operations(self.cfg, self.store, pool, consumers)
        ingest = Ingest(self.cfg, self.store, self.metrics)
        sweeper = AsyncIOScheduler()
        try:
            await consumers.start()
            await ops.start()
            sweeper.add_job(scheduled("consumers' sweep", consumers.sweep), "interval",
                            seconds=consume.SWEEP_EVERY,
                            max_instances=1, coalesce=True)  # fmt: skip
            sweeper.start()
            tokens = [t.get_secret_value().encode() for t in self.cfg.api.tokens]
            max_body = self.cfg.api.max_body_bytes
            app = build_app(consumers, ops, ingest, self.metrics, tokens, max_body)
            config = uvicorn.Config(
                app, host=self.host, port=self.port, log_level="warning", access_log=False,
                lifespan="off", timeout_graceful_shutdown=5,
            )  # fmt: skip
            self._server = uvicorn.Server(config)
            serving = asyncio.create_task(self._server.serve(sockets=[sock]))
            while not self._server.started and not serving.done():
                await asyncio.sleep(0.02)
            if serving.done():
                serving.result()
                raise OSError(said("cannot serve on %s", self.cfg.api.listen))
            log.info("api: listening on http://%s:%d", self.host, self.port)
            self._ready.set()
            await serving
        finally:
            if sweeper.running:
                sweeper.shutdown(wait=False)
            await ops.stop()
            await consumers.stop()
            ingest.close()
            await pool.close()

    def stop(self) -> None:
        if self._consumers is not None:  # a long poll ends with an empty batch, not a 500
            self._consumers.closing = True
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=30)
