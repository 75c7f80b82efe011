"""The picture of the console in docs/operations.md “Console” under load: ``.venv/bin/python -m
devkit.console_shot``.

Runs Weir on an embedded Postgres and nats-server with a few connectors (one sharded, one
paused by an operator so its lag grows, one webhook whose receiver is gone so its messages
land on the failed list) and an HTTP pull consumer, writes rows at a varying rate for
``--seconds`` (bounded), then logs in to the console in headless Chromium and saves the
overview as ``docs/console.png``. The API token is made up here and never printed.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import secrets
import sys
import threading
import time
from pathlib import Path

import httpx
import psycopg

from connectors.nats.config import NatsConnector
from connectors.nats.setup import ensure_streams
from core.config.model import WeirConfig
from core.runtime.service import prepare, serve
from devkit.browser import chromium, log_in
from devkit.embedded import EmbeddedNats, EmbeddedPostgres
from devkit.server import free_port

OUT = Path(__file__).resolve().parent.parent / "docs" / "console.png"


def config(pg: str, nats_url: str, port: int, token: str) -> WeirConfig:
    nats = {"url": nats_url}
    gone = f"http://127.0.0.1:{free_port()}/hook"  # nothing listens there
    return WeirConfig.model_validate({
        "api": {"listen": f"127.0.0.1:{port}", "tokens": [token]},
        "sources": [{"name": "app-db", "kind": "postgres", "url": pg,
                     "tables": ["public.orders", "public.users"]}],
        "connectors": [
            {"name": "orders-to-nats", "type": "nats", "stream": "events", "nats": nats,
             "collections": ["public:orders"], "shards": 2},
            {"name": "users-records", "type": "nats", "stream": "records", "nats": nats,
             "collections": ["public:users"]},
            {"name": "billing-audit", "type": "nats", "stream": "events", "nats": nats},
            {"name": "crm-webhook", "type": "webhook", "stream": "events",
             "collections": ["public:users"],
             "webhook": {"url": gone, "timeout": "1s"},
             "retry": {"initial": "50ms", "max": "200ms", "max_attempts": 2}},
        ],
        "consumers": [{"name": "search-indexer", "stream": "records"}],
    })  # fmt: skip


def write(pg: str, seconds: float, stop: threading.Event) -> None:
    """Orders at a rate that rises and falls, and now and then a user changes."""
    start = time.monotonic()
    n = 0
    with psycopg.connect(pg, autocommit=True) as conn:
        while not stop.is_set() and (t := time.monotonic() - start) < seconds:
            per_tick = int(20 + 18 * math.sin(t / 12))  # ~0-40 rows every 0.1 s
            with conn.transaction():
                for _ in range(per_tick):
                    n += 1
                    conn.execute("INSERT INTO orders (id, user_id, total) VALUES (%s, %s, %s)",
                                 (n, n % 50, n % 997 / 10))  # fmt: skip
                if n % 7 == 0:
                    conn.execute("UPDATE users SET visits = visits + 1 WHERE id = %s", (n % 50,))
            time.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120, help="of load (at least 30)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.seconds = max(args.seconds, 30)
    token = secrets.token_urlsafe(24)
    port = free_port()
    with EmbeddedPostgres() as pg, EmbeddedNats() as ns:
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE users (id int PRIMARY KEY, visits int NOT NULL DEFAULT 0)")
            conn.execute("INSERT INTO users (id) SELECT generate_series(0, 49)")
            conn.execute("CREATE TABLE orders (id int PRIMARY KEY, user_id int, total numeric)")
        cfg = config(pg.url, ns.url, port, token)
        prepare(cfg)
        for c in cfg.connectors:
            if isinstance(c, NatsConnector):
                asyncio.run(ensure_streams(c))
        stop = threading.Event()
        weir = threading.Thread(target=serve, args=(cfg, stop), daemon=True)
        writer = threading.Thread(target=write, args=(pg.url, args.seconds, stop), daemon=True)
        weir.start()
        writer.start()
        base = f"http://127.0.0.1:{port}"
        try:
            api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"})
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if api.get("/v1/connectors").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            time.sleep(args.seconds * 0.6)
            api.post("/v1/connectors/billing-audit/pause").raise_for_status()
            time.sleep(args.seconds * 0.4 - 10)  # the picture is taken under load
            with chromium() as browser:
                page = browser.new_page()
                page.set_viewport_size({"width": 1280, "height": 900})
                log_in(page, base, token)
                page.wait_for_selector("figure.chart svg.rate polyline")
                page.wait_for_timeout(1500)
                args.out.parent.mkdir(exist_ok=True)
                page.screenshot(path=str(args.out), full_page=True)
            print(f"console_shot: wrote {args.out}")
        finally:
            stop.set()
            writer.join(30)
            weir.join(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
