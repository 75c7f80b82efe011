"""How the HTTP API refuses a request (DESIGN.md section 7.7): always JSON
``{"detail": ...}``, never with a secret in it.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from core.consume import ApiError
from core.redact import redact


def redacted(value: Any) -> Any:
    """``value`` (JSON-like) with every string redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {k: redacted(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redacted(v) for v in value]
    return value


def install(app: FastAPI) -> None:
    """Error bodies without secrets, on every route of ``app``."""

    @app.exception_handler(ApiError)
    async def _refused(_: Request, e: ApiError) -> JSONResponse:
        if e.status == 422:  # the shape of FastAPI's validation errors
            detail: Any = [{"loc": list(e.loc), "msg": e.reason, "type": "value_error"}]
            return JSONResponse({"detail": redacted(detail)}, status_code=422)
        return JSONResponse({"detail": redact(e.reason)}, status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        detail = redacted(jsonable_encoder(e.errors()))
        return JSONResponse({"detail": detail}, status_code=422)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, e: HTTPException) -> JSONResponse:
        return JSONResponse(
            {"detail": redacted(e.detail)}, status_code=e.status_code, headers=e.headers
        )
