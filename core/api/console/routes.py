"""The console's routes, added by ``build_app`` (core/api/app.py) beside the API's.

Pages are GETs that change nothing; every action is a POST carrying the session's CSRF token,
answered by a redirect back to the page it came from (so a reload does not repeat it). Without
a live session a page redirects to the login form and the JSON route answers 401. No token or
session id is ever put in a URL, and every answer forbids framing, caching and inline scripts.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import parse_qs

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, PackageLoader, select_autoescape

from core.api.console import present
from core.api.console.sessions import Session, Sessions, csrf_ok
from core.api.manage import Operations

COOKIE = "weir_console"
LOGIN = "/console/login"
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

templates = Environment(
    loader=PackageLoader("core.api.console"), autoescape=select_autoescape(), trim_blocks=True
)
templates.filters.update(present.FILTERS)


class LoginNeeded(Exception):
    """No live session: a page goes to the login form, a JSON route answers 401."""


async def session(request: Request) -> Session:
    """The request's live session. Async, as every dependency here: the sessions are only ever
    touched from the API's event loop, never from a thread pool."""
    sessions: Sessions = request.app.state.console_sessions
    found = sessions.get(request.cookies.get(COOKIE))
    if found is None:
        raise LoginNeeded
    return found


Live = Annotated[Session, Depends(session)]


async def acted(request: Request, s: Live) -> dict[str, list[str]]:
    """The form of an action, once its CSRF token is the session's; else 403."""
    form = await read_form(request)
    if not csrf_ok(s, (form.get("csrf") or [""])[0]):
        raise HTTPException(403, "the form is stale or not the console's: reload the page")
    return form


Form = Annotated[dict[str, list[str]], Depends(acted)]


async def ops(request: Request) -> Operations:
    found: Operations = request.app.state.ops  # build_app puts it there
    return found


Ops = Annotated[Operations, Depends(ops)]


def add_routes(app: FastAPI, tokens: list[bytes]) -> None:
    sessions = app.state.console_sessions = Sessions(tokens)

    @app.exception_handler(LoginNeeded)
    async def _login_needed(request: Request, _: LoginNeeded) -> Response:
        if request.url.path.endswith(".json"):
            return JSONResponse({"detail": "log in to the console"}, 401, headers=HEADERS)
        return RedirectResponse(LOGIN, 303, headers=HEADERS)

    app.mount(
        "/console/static",
        StaticFiles(directory=Path(__file__).with_name("static")),
        name="console-static",
    )

    @app.get(LOGIN, include_in_schema=False)
    async def login_form() -> Response:
        return page("login.html", None)

    @app.post(LOGIN, include_in_schema=False)
    async def login(request: Request) -> Response:
        token = (await read_form(request)).get("token") or [""]
        if not sessions.valid_token(token[0]):
            return page("login.html", None, error="That is not one of the API tokens.", status=401)
        sid, _ = sessions.open()
        done = RedirectResponse("/console", 303, headers=HEADERS)
        done.set_cookie(COOKIE, sid, path="/console", httponly=True, samesite="strict",
                        secure=request.url.scheme == "https")  # fmt: skip
        return done

    @app.post("/console/logout", include_in_schema=False)
    async def logout(request: Request, _: Form) -> Response:
        sessions.close(request.cookies.get(COOKIE, ""))
        done = RedirectResponse(LOGIN, 303, headers=HEADERS)
        done.delete_cookie(COOKIE, path="/console", httponly=True, samesite="strict")
        return done

    @app.get("/console", include_in_schema=False)
    async def overview(s: Live, o: Ops) -> Response:
        sources, connectors, consumers, spark = await asyncio.gather(
            o.sources(), o.connectors(), o.consumers(), o.spark_queries()
        )
        return page("overview.html", s, sources=sources, connectors=connectors,
                    consumers=consumers, spark=spark)  # fmt: skip

    @app.get("/console/connectors/{name}", include_in_schema=False)
    async def connector(name: str, s: Live, o: Ops) -> Response:
        return page("connector.html", s, c=await o.connector(name))

    @app.get("/console/connectors/{name}/history.json", include_in_schema=False)
    async def history(name: str, _: Live, o: Ops) -> Response:
        return JSONResponse(o.history(name), headers=HEADERS)

    @app.get("/console/failed/{list_name}", include_in_schema=False)
    async def failed(list_name: str, s: Live, o: Ops, after: str | None = None) -> Response:
        found = await o.failed(list_name, limit=50, after=after)
        return page("failed.html", s, list_name=list_name, entries=found["data"],
                    next=found["next"])  # fmt: skip

    @app.post("/console/connectors/{name}/{verb}", include_in_schema=False)
    async def pause_resume(name: str, verb: str, s: Live, o: Ops, form: Form) -> Response:
        if verb not in ("pause", "resume"):
            raise HTTPException(404, "no such action")
        await o.pause(name, verb == "pause")
        s.flash = f"{name}: {verb}d."
        return back(form)

    @app.post("/console/failed/{list_name}/{verb}", include_in_schema=False)
    async def retry_discard(list_name: str, verb: str, s: Live, o: Ops, form: Form) -> Response:
        if verb not in ("retry", "discard"):
            raise HTTPException(404, "no such action")
        ids = None if form.get("all") else form.get("id", [])
        act = o.retry if verb == "retry" else o.discard
        n = await act(list_name, ids)
        s.flash = f"{n} message{'' if n == 1 else 's'} " + (
            "will be retried." if verb == "retry" else "discarded."
        )
        return back(form)


async def read_form(request: Request) -> dict[str, list[str]]:
    """An urlencoded form body (the API's body limit applies to it); anything else is empty."""
    if request.headers.get("content-type", "").split(";")[0] != "application/x-www-form-urlencoded":
        return {}
    return parse_qs((await request.body()).decode(errors="replace"))


def back(form: dict[str, list[str]]) -> Response:
    """To the console page the form names (``back``), never elsewhere."""
    to = (form.get("back") or ["/console"])[0]
    if not to.startswith("/console"):
        to = "/console"
    return RedirectResponse(to, 303, headers=HEADERS)


def page(name: str, s: Session | None, status: int = 200, **context: Any) -> Response:
    """A page; its session's one-time message (``flash``) shown once."""
    flash, csrf = (s.flash, s.csrf) if s is not None else (None, "")
    if s is not None:
        s.flash = None
    html = templates.get_template(name).render(csrf=csrf, flash=flash, **context)
    return HTMLResponse(html, status, headers=HEADERS)
