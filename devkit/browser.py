"""Headless Chromium for the console's browser tests and its screenshot: Debian's ``chromium``
(``./dev setup`` installs it) driven by Playwright, never a browser Playwright downloads.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from playwright.sync_api import BrowserContext, Page, sync_playwright

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",  # root in a container has no user namespaces for the sandbox
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",  # nothing but the pages asked for leaves the browser
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 15_000  # launching, and each action or wait of a page unless it says otherwise


@contextmanager
def chromium() -> Iterator[BrowserContext]:
    """A fresh headless browser with a throwaway profile (so no cookie outlives it); raises if
    it cannot start."""
    with tempfile.TemporaryDirectory(prefix="weir-chromium-") as profile, sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=ARGS, timeout=TIMEOUT_MS
        )
        context.set_default_timeout(TIMEOUT_MS)
        try:
            yield context
        finally:
            context.close()


def log_in(page: Page, base_url: str, token: str) -> None:
    """Through the console's login form, as a person would; ends on the overview."""
    page.goto(f"{base_url}/console/login")
    page.fill("#token", token)
    page.click("form.login button")
    page.wait_for_url(f"{base_url}/console")
