"""``weir run``: the sources (one thread each, blocking psycopg) and the connectors (one asyncio
loop in its own thread) a config file declares, until ``stop`` is set.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import psycopg

from core.config import PostgresSource, WeirConfig
from core.engine import Forwarder
from core.metrics import Metrics
from core.store import Store
from core.store.reader import Notifier

log = logging.getLogger("weir")


def _store(cfg: WeirConfig) -> Store:
    store = Store(cfg.store_url, cfg.store.schema_)
    store.prepare(cfg.sources)
    return store


def prepare(cfg: WeirConfig) -> Store:
    """Migrate the store, register the sources and create their publications and slots, so
    that every change committed from now on will be captured. ``serve`` does the same in its
    threads; call this first when writes follow at once (the demo, tests).
    """
    from core.pg.setup import prepare as prepare_source

    store = _store(cfg)
    for src in cfg.sources:
        if isinstance(src, PostgresSource):
            with psycopg.connect(src.url.get_secret_value(), autocommit=True) as conn:
                prepare_source(conn, src)
    return store


def serve(cfg: WeirConfig, stop: threading.Event, grace: float = 30.0) -> int:
    """Run until ``stop`` is set, then drain. Returns 1 when a source failed for good, else 0."""
    from core import jobs
    from core.api import ApiServer
    from core.pg.capture import PostgresCapture

    store = _store(cfg)
    metrics = Metrics()
    metrics.watch_store(cfg, store)
    failures: list[BaseException] = []

    def supervise(capture: PostgresCapture) -> None:
        try:
            capture.run(stop)
        except Exception as e:
            log.error("source %s: %s", capture.src.name, e)
            failures.append(e)
            stop.set()

    threads = [
        threading.Thread(target=supervise, args=(PostgresCapture(s, store, metrics),), name=s.name)
        for s in cfg.sources
        if isinstance(s, PostgresSource)
    ]
    if cfg.connectors:
        threads.append(
            threading.Thread(
                target=lambda: asyncio.run(_connectors(cfg, store, metrics, stop, grace)),
                name="connectors",
            )
        )
    api = ApiServer(cfg, store, metrics) if cfg.api is not None else None
    if api is not None:
        try:
            api.start()
        except BaseException as e:
            log.error("api: cannot start: %s", e)
            return 1
    for t in threads:
        t.start()
    scheduler = jobs.start(cfg, store)
    log.info(
        "weir: running %d sources, %d connectors and %d consumers",
        len(cfg.sources), len(cfg.connectors), len(cfg.consumers),
    )  # fmt: skip
    while any(t.is_alive() for t in threads) or (api is not None and not stop.is_set()):
        stop.wait(0.5)
    for t in threads:
        t.join()
    scheduler.shutdown(wait=False)
    if api is not None:
        api.stop()
    log.info("weir: stopped")
    return 1 if failures else 0


async def _connectors(
    cfg: WeirConfig, store: Store, metrics: Metrics, stop: threading.Event, grace: float
) -> None:
    notifier = Notifier(store)
    halt = asyncio.Event()
    forwarders = [Forwarder(c, cfg.sources_of(c), store, notifier, metrics)
                  for c in cfg.connectors]  # fmt: skip
    tasks = [asyncio.create_task(f.run(halt), name=f.name) for f in forwarders]
    await notifier.start()
    while not stop.is_set() and not all(t.done() for t in tasks):
        await asyncio.sleep(0.2)
    halt.set()
    _, late = await asyncio.wait(tasks, timeout=grace)
    for t in late:
        log.warning("connector %s: did not drain within %.0fs", t.get_name(), grace)
        t.cancel()
    await notifier.stop()
