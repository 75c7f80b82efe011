"""The web console (docs/operations.md “Console”) through a real `weir run`: its security over plain
HTTP, and what a person does with it in a real headless Chromium (devkit/browser.py)."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from playwright.sync_api import BrowserContext, Page, expect

from devkit.browser import log_in
from tests.connectors.webhook.harness import WebhookHarness
from tests.connectors.webhook.receiver import Receiver
from tests.helpers.api import TOKEN, api_serving
from tests.helpers.capture import wait_for
from tests.helpers.weir import cursor_of, failed_messages, insert_t

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@contextmanager
def console(
    table: str, receiver: Receiver, **connector: Any
) -> Iterator[tuple[httpx.Client, dict[str, Any], WebhookHarness]]:
    """`weir run` with the API and a webhook connector ``hooks`` to ``receiver``; yields the
    API client (bearer token), the connector and its harness."""
    harness = WebhookHarness(receiver)
    c = harness.connector("hooks", "events", **connector)
    harness.prepare(c)
    with api_serving(table, connectors=[c]) as api:
        yield api, c, harness


@contextmanager
def logged_in(api: httpx.Client) -> Iterator[tuple[httpx.Client, str]]:
    """A cookie-holding client logged in through the form, and its session's CSRF token."""
    with httpx.Client(base_url=api.base_url, timeout=30) as client:
        r = client.post("/console/login", data={"token": TOKEN})
        assert r.status_code == 303 and r.headers["location"] == "/console"
        page = client.get("/console")
        assert page.status_code == 200, page.text
        found = CSRF.search(page.text)
        assert found
        yield client, found.group(1)


def paused(api: httpx.Client) -> bool:
    return bool(api.get("/v1/connectors/hooks").json()["paused"])


def test_without_a_session_pages_go_to_the_login_form_and_json_is_refused(
    table: str, webhook_receiver: Receiver
) -> None:
    with (
        console(table, webhook_receiver) as (api, _, _),
        httpx.Client(base_url=api.base_url, timeout=30) as anon,
    ):
        for path in ("/console", "/console/connectors/hooks", "/console/failed/hooks"):
            r = anon.get(path)
            assert (r.status_code, r.headers["location"]) == (303, "/console/login"), path
        assert anon.get("/console/connectors/hooks/history.json").status_code == 401
        r = anon.post("/console/connectors/hooks/pause", data={"csrf": "x"})
        assert (r.status_code, r.headers["location"]) == (303, "/console/login")
        api.headers.pop("Authorization")  # the bearer token is not a console session either
        assert api.get("/console").status_code == 303
        api.headers["Authorization"] = f"Bearer {TOKEN}"
        assert not paused(api)


def test_a_wrong_token_is_refused_and_no_cookie_set(table: str, webhook_receiver: Receiver) -> None:
    with (
        console(table, webhook_receiver) as (api, _, _),
        httpx.Client(base_url=api.base_url, timeout=30) as client,
    ):
        login = client.get("/console/login")
        assert login.status_code == 200 and 'name="token"' in login.text
        for wrong in ("", "nope", TOKEN + "x", TOKEN[:-1]):
            r = client.post("/console/login", data={"token": wrong})
            assert r.status_code == 401
            assert "set-cookie" not in r.headers
            assert "not one of the API tokens" in r.text
        assert client.get("/console").status_code == 303


def test_the_session_cookie_is_httponly_strict_and_only_for_the_console(
    table: str, webhook_receiver: Receiver
) -> None:
    with (
        console(table, webhook_receiver) as (api, _, _),
        httpx.Client(base_url=api.base_url, timeout=30) as client,
    ):
        r = client.post("/console/login", data={"token": TOKEN})
        cookie = r.headers["set-cookie"]
        flags = {f.strip().split("=")[0].lower(): f.strip() for f in cookie.split(";")}
        assert "httponly" in flags
        assert flags["samesite"].lower() == "samesite=strict"
        assert flags["path"] == "Path=/console"
        assert "secure" not in flags  # plain http here; over https it is set
        sid = cookie.split(";")[0].split("=", 1)[1]
        assert len(sid) >= 40 and TOKEN not in sid
        page = client.get("/console")
        assert page.status_code == 200
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        assert page.headers["cache-control"] == "no-store"
        r = client.post("/console/logout", data={"csrf": CSRF.findall(page.text)[0]})
        assert (r.status_code, r.headers["location"]) == (303, "/console/login")
        client.cookies.set("weir_console", sid, path="/console")  # the old id is dead now
        assert client.get("/console").status_code == 303


def test_an_action_without_the_sessions_csrf_token_is_refused_and_changes_nothing(
    table: str, webhook_receiver: Receiver
) -> None:
    with console(table, webhook_receiver) as (api, _, _), logged_in(api) as (client, csrf):
        for form in ({}, {"csrf": ""}, {"csrf": csrf[:-1] + "x"}, {"token": TOKEN}):
            r = client.post("/console/connectors/hooks/pause", data=form)
            assert r.status_code == 403, form
        r = client.post("/console/failed/hooks/discard", data={"all": "1"})
        assert r.status_code == 403
        r = client.post("/console/logout", data={"csrf": "wrong"})
        assert r.status_code == 403
        assert not paused(api)
        assert client.get("/console").status_code == 200  # still logged in
        r = client.post("/console/connectors/hooks/pause", data={"csrf": csrf})
        assert r.status_code == 303
        assert paused(api)


def test_log_in_and_watch_a_paused_connectors_lag_grow_and_drain(
    table: str, webhook_receiver: Receiver, browser: BrowserContext
) -> None:
    with console(table, webhook_receiver) as (api, c, harness):
        insert_t(table, range(5))
        wait_for(lambda: cursor_of(table, "hooks")[0] == 5, what="the first rows delivered")
        page = browser.new_page()
        urls: list[str] = []
        page.on("request", lambda r: urls.append(r.url))
        log_in(page, str(api.base_url), TOKEN)
        row = page.locator('tr[data-connector="hooks"]')
        expect(row.locator("[data-field=state]")).to_have_text(re.compile("."))
        expect(page.locator('tr[data-source="app"]')).to_be_visible()
        lag = row.locator("[data-field=lag_messages]")
        expect(lag).to_have_attribute("data-value", "0")
        heads = page.locator("table:has(tr[data-connector]) th").all_inner_texts()
        assert {"Behind", "Behind by"} <= set(heads), heads  # as weir status names them

        row.locator("a").first.click()  # to the connector's page, and pause it there
        page.click("button:text('Pause')")
        expect(page.locator("h1 [data-field=state]")).to_have_text("paused")
        page.click("header nav a")
        expect(row.locator("td.owner")).to_have_text("\u2013")  # drained, and run by nobody
        insert_t(table, range(5, 30))
        expect(lag).to_have_attribute("data-value", "25", timeout=30_000)  # the page refreshes
        expect(row.locator("[data-field=state]")).to_have_text("paused")

        row.locator("a").first.click()
        page.click("button:text('Resume')")
        page.click("header nav a")
        expect(lag).to_have_attribute("data-value", "0", timeout=30_000)
        assert len(harness.read(c)) == 30
        expect(page.locator("figure.chart svg.rate polyline")).to_have_count(1, timeout=30_000)
        html = page.content()
        assert TOKEN not in html
        assert not [u for u in urls if TOKEN in u or "weir_console" in u]


def test_retry_a_failed_message_and_see_it_leave_the_list(
    table: str, webhook_receiver: Receiver, browser: BrowserContext
) -> None:
    retry = {"initial": "10ms", "max_attempts": 1}
    with console(table, webhook_receiver, retry=retry) as (api, c, harness):
        hook = harness.hook(c)
        hook.only = []  # the receiver refuses everything (422) for now
        insert_t(table, range(2))
        wait_for(lambda: len(failed_messages(table, "hooks")) == 2, what="two failed messages")
        page: Page = browser.new_page()
        log_in(page, str(api.base_url), TOKEN)
        failed = page.locator('tr[data-connector="hooks"] a.alert')
        expect(failed).to_have_text("2")
        failed.click()
        rows = page.locator("tr[data-failed]")
        expect(rows).to_have_count(2)
        expect(rows.first.locator("td.error")).to_contain_text("HTTP 422")

        hook.only = None  # it accepts from now on
        rows.first.locator("button:text('Retry')").click()
        expect(page.locator(".flash")).to_have_text("1 message will be retried.")
        expect(rows).to_have_count(1, timeout=30_000)  # delivered: the page refreshes itself
        assert len(harness.read(c)) == 1

        asked: list[str] = []
        page.once("dialog", lambda d: (asked.append(d.message), d.dismiss()))
        page.click("button:text('Discard all shown')")  # asks first: dismissed, nothing gone
        expect(rows).to_have_count(1)
        assert asked == ["Discard the 1 messages shown for good?"]
        page.once("dialog", lambda d: d.accept())
        page.click("button:text('Discard all shown')")
        expect(page.locator("p.empty")).to_be_visible()
        assert failed_messages(table, "hooks") == []
        assert TOKEN not in page.content()


def test_a_connectors_page_and_the_api_show_its_steps(
    table: str, webhook_receiver: Receiver
) -> None:
    steps = [{"filter": 'action != "delete" and record.id > 1'},
             {"transform": {"drop": ["body"], "add": {"t": "{metadata.table_name}"}}},
             {"route": {"path": "{record.id}"}}]  # fmt: skip
    with console(table, webhook_receiver, steps=steps) as (api, _, _), logged_in(api) as (
        client, _):  # fmt: skip
        shown = api.get("/v1/connectors/hooks").json()["steps"]
        assert shown[0] == steps[0] and shown[2] == steps[2]
        assert shown[1]["transform"]["drop"] == ["body"]
        page = client.get("/console/connectors/hooks").text
        assert [html.unescape(s) for s in re.findall(r"<li><code>(.*?)</code></li>", page)] == [
            'filter: action != "delete" and record.id > 1',
            'transform: drop: ["body"], add: {"t":"{metadata.table_name}"}',
            'route: path: "{record.id}"']  # fmt: skip
