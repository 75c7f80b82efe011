"""The HTTP ingest route of ``kind: http`` sources (core/sources/http.py), added to the API's
token-guarded router by ``build_app`` (core/api/app.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from core.api.models import IngestBody, IngestResult, Name
from core.sources.http import Ingest


def add_routes(api: APIRouter, ingest: Ingest) -> None:
    """``POST /v1/sources/{name}/records``, on ``api``."""

    @api.post("/v1/sources/{name}/records", response_model=IngestResult)
    async def ingest_records(name: Name, body: IngestBody) -> Any:
        accepted, skipped = await ingest.write(name, body.records)
        return {"accepted": accepted, "skipped": skipped}
