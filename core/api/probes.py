"""Operating routes: ``/health`` and ``/ready`` for probes (no token) and ``/metrics`` (behind
the token), added by ``build_app`` (core/api/app.py)."""

from __future__ import annotations

import asyncio

import psycopg
from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from core.api.models import Health, Ready
from core.config.model import WeirConfig
from core.config.sources import PostgresSource
from core.failures import postgres_unreachable
from core.metrics import Metrics


async def reachable(url: str, what: str) -> str:
    """``ok``, or why the Postgres server at ``url`` does not answer (a readiness check)."""
    try:
        conn = await psycopg.AsyncConnection.connect(url, connect_timeout=3, autocommit=True)
    except psycopg.Error as e:
        return str(postgres_unreachable(e, url, what))
    async with conn:
        await conn.execute("SELECT 1")
    return "ok"


def add_routes(app: FastAPI, api: APIRouter, cfg: WeirConfig, store_url: str,
               metrics: Metrics) -> None:  # fmt: skip
    """The probes on ``app`` itself, ``/metrics`` on the token-guarded ``api``."""

    @app.get("/health", response_model=Health)
    async def health() -> dict[str, str]:
        """The process is up."""
        return {"status": "up"}

    @app.get("/ready", response_model=Ready, responses={503: {"model": Ready}})
    async def ready() -> JSONResponse:
        """The store and every postgres source answer."""
        checks = {"store": await reachable(store_url, "the store")}
        for src in cfg.sources:
            if isinstance(src, PostgresSource):
                what = f"source {src.name}"
                checks[what] = await reachable(src.url.get_secret_value(), what)
        ok = all(v == "ok" for v in checks.values())
        body = {"status": "ready" if ok else "not ready", "checks": checks}
        return JSONResponse(body, status_code=200 if ok else 503)

    @api.get("/metrics", response_class=Response)
    async def metrics_() -> Response:
        """Prometheus text format."""
        text = await asyncio.to_thread(metrics.render)
        return Response(content=text, media_type=CONTENT_TYPE_LATEST)
