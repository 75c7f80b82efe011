"""How the HTTP API refuses a request (docs/consume-api.md “Consumers”;
docs/design.md “Guarantees”): always JSON
``{"detail": ...}``, never with a secret in it, and 413 for a body beyond
``api.max_body_bytes`` before that body is read into memory. The one place where the domain's
refusals (core/errors.py) become HTTP statuses.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core.config.load import error_text, without_tags
from core.config.model import WeirConfig
from core.errors import Busy, Conflict, Invalid, InvalidField, NotFound, Refusal
from core.failures import AWAY
from core.redact import first_line, forms_of, masked, raw_secrets, redact

log = logging.getLogger("weir.api")

# The HTTP status of each kind of refusal.
STATUS: dict[type[Refusal], int] = {
    Invalid: 400,
    NotFound: 404,
    Conflict: 409,
    InvalidField: 422,
    Busy: 429,
}
# What the token-guarded routes may answer besides their own (the OpenAPI document's).
REFUSALS = [
    (400, "Bad request"),
    (401, "No valid bearer token"),
    (404, "No such consumer or source"),
    (409, "Conflict with what exists"),
    (413, "Request body larger than api.max_body_bytes"),
    (429, "Too many receive calls waiting (max_waiting)"),
]


def redacted(value: Any, also: list[str] | None = None) -> Any:
    """``value`` (JSON-like) with every string redacted, and ``also``'s forms masked
    (core/redact.py ``forms_of``)."""
    if isinstance(value, str):
        return redact(masked(value, also) if also else value)
    if isinstance(value, dict):
        return {k: redacted(v, also) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redacted(v, also) for v in value]
    return value


class BodyLimit:
    """ASGI middleware: a request whose Content-Length is beyond ``max_bytes`` is answered 413
    at once, unread; a body without one (chunked) is counted as the route reads it, and the
    read fails with 413 as soon as the count passes ``max_bytes``. So at most ``max_bytes``
    of a body are ever held in memory.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.detail = f"the request body is larger than api.max_body_bytes ({max_bytes} bytes)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            await JSONResponse({"detail": self.detail}, 413)(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:  # FastAPI passes an HTTPException from a body read on
                raise HTTPException(413, self.detail)
            return message

        await self.app(scope, counted, send)


def install(app: FastAPI, max_body_bytes: int) -> None:
    """The body limit, and error bodies without secrets, on every route of ``app``."""
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)

    @app.exception_handler(Refusal)
    async def _refused(_: Request, e: Refusal) -> JSONResponse:
        if isinstance(e, InvalidField):  # the shape of FastAPI's validation errors
            detail: Any = [{"loc": list(e.loc), "msg": e.reason, "type": "value_error"}]
            return JSONResponse({"detail": redacted(detail)}, status_code=STATUS[InvalidField])
        return JSONResponse({"detail": redact(e.reason)}, status_code=STATUS[type(e)])

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        # what was wrong and where, not the input again (it can be large or nested deep); the
        # secrets of a body that did not validate are hidden too (a message may quote one), in
        # this answer only: kept for the process, what clients send would grow without bound
        secrets = forms_of(raw_secrets(e.body, WeirConfig))
        errors = [{k: v for k, v in err.items() if k not in ("input", "msg", "ctx")}
                  for err in e.errors()]  # fmt: skip
        errors = [{**err, "loc": without_tags(tuple(err["loc"]))} for err in errors]
        detail = redacted(jsonable_encoder(errors), secrets)
        for out, err in zip(detail, e.errors(), strict=True):  # the message as Weir says it,
            # and the body's own secrets nowhere in it (the process does not know them)
            out["msg"] = masked(redact(error_text(err, secrets)), secrets)
        return JSONResponse({"detail": detail}, status_code=422)

    async def _store_away(request: Request, e: Exception) -> JSONResponse:
        # The store restarted or dropped a pooled connection (the pool replaces it): the
        # request may be tried again, and the log says so in one line, not a traceback.
        log.warning("api: %s %s: the store did not answer (%s); answered 503", request.method,
                    request.url.path, redact(first_line(e)))  # fmt: skip
        return JSONResponse({"detail": "the store did not answer; try again"}, status_code=503,
                            headers={"Retry-After": "1"})  # fmt: skip

    for away in AWAY:
        app.add_exception_handler(away, _store_away)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, e: HTTPException) -> JSONResponse:
        return JSONResponse(
            {"detail": redacted(e.detail)}, status_code=e.status_code, headers=e.headers
        )
