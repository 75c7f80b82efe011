"""``serve``: the sources, connectors and HTTP API of a config file, or those of one worker
process of ``weir run`` (core/runtime/supervisor.py says which process runs what), until ``stop``.

What runs where, in a process that ``serve`` starts and stops (a worker has only its role's):

==========================  ==================================================================
main thread                 the lease loop: takes and renews leases (runtime/leases.py), starts
                            and stops each source's and connector's work as its lease comes
                            and goes, reports their state for ``weir status``
a thread per source         capture (sources/pg/capture.py): blocking psycopg on the
                            replication connection, decoding and batching
  + its store thread        the batches' store writes and commits, in order
                            (sources/pg/store_thread.py), overlapping the next batch's decoding
a thread per source         its backfills (sources/backfill.py), when capture asks for them
one asyncio loop thread     every connector (engine/forwarder.py; the file's and the API-made,
                            runtime/connectors.py) and the Notifier that LISTENs for the
                            store's commits (store/reader.py)
the API thread              uvicorn on its own asyncio loop (api/app.py): Consume API with its
                            own Notifier and its queue sweeper, HTTP ingest, health, metrics
a scheduler thread          retention and slot-lag jobs (runtime/jobs.py)
==========================  ==================================================================
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from core.api.waiting import awaited_store
from core.config.model import WeirConfig
from core.config.sources import PostgresSource
from core.failures import AWAY, for_good, sources_let_in, wait_for_store
from core.metrics import Metrics
from core.redact import remember_config
from core.runtime.connectors import ConnectorWorks
from core.store import Store, open_store
from core.store import connectors as api_connectors

if TYPE_CHECKING:
    from core.runtime.supervisor import Worker

log = logging.getLogger("weir")
GC_YOUNG = 50_000  # new objects between collections of the youngest generation


def prepare(cfg: WeirConfig) -> Store:
    """Migrate the store, register the sources and create their publications and slots, so
    that every change committed from now on will be captured. ``serve`` does the same in its
    threads; call this first when writes follow at once (the demo, tests).
    """
    from core.sources.pg import snapshot

    store = open_store(cfg)
    for src in cfg.sources:
        if isinstance(src, PostgresSource):
            with snapshot.connect(src.url.get_secret_value(), "weir") as conn:
                snapshot.ensure_capture(conn, src, store)
    return store


def tune_gc() -> None:
    """Collect cycles less often than Python's default (every 700 new objects), which on a
    stream moved every message read ahead (up to ``max_pending``) into the oldest generation
    and then walked the whole heap for it: 22% of a Kafka connector's time on a backlog, 0.3%
    now. The objects of the startup are frozen out of those walks for good.
    """
    gc.freeze()
    gc.set_threshold(GC_YOUNG, 20, 10)


def join_all(works: Iterable[Any], grace: float) -> None:
    """Wait for stopped works to end, ``grace`` seconds for them all (each waited for alone,
    ten connectors stuck on an unreachable broker took ten graces, past systemd's stop
    timeout)."""
    deadline = time.monotonic() + grace
    for w in works:
        w.join(max(0.0, deadline - time.monotonic()))


def serve(
    cfg: WeirConfig, stop: threading.Event, grace: float = 30.0, worker: Worker | None = None
) -> int:
    """Run until ``stop`` is set, then drain. Returns 1 when a source failed for good, else 0.

    Sources and connectors run only while this process holds their lease (core/runtime/leases.py):
    with several instances (or worker processes) on one store, each is run by one of them, and
    taken over by another within ``LEASE_POLL`` when its owner dies. Without ``worker``, every
    part of the file runs here; a worker runs its role's part only (the API, or the sources and
    connectors it selects), and the scheduled jobs when it is the one given them.
    """
    from core.runtime import jobs
    from core.runtime.leases import Leases

    remember_config(cfg)
    if not (wait_for_store(cfg, stop) if worker is not None else awaited_store(cfg, stop)):
        log.info("stopped before the store answered")
        return 0
    store = open_store(cfg)
    if worker is None:  # else the supervisor looked
        try:
            sources_let_in(cfg)
        except Exception as e:
            if (why := for_good(e)) is None:
                raise
            log.error("%s", why)
            return 1
    if clash := api_connectors.clashes(cfg, store):
        log.error(
            "the config file declares connectors that were made over the API: %s; each"
            " name's cursors belong to one connector: give the file's another name, or take it"
            " out of the file and DELETE /v1/connectors/NAME",
            ", ".join(clash),
        )
        return 1
    metrics = Metrics()
    metrics.watch_store(cfg, store)
    serves_api = cfg.api is not None and (worker is None or worker.role == "api")
    api = None
    if serves_api:  # FastAPI and uvicorn cost a process 11 MB: only the one serving loads them
        from core.api.app import ApiServer

        api = ApiServer(cfg, store, metrics)
    if api is not None:
        try:
            api.start()
        except BaseException as e:
            log.error("api: cannot start: %s", e)
            return 1
    works = _source_works(cfg, store, metrics, worker)
    connectors = ConnectorWorks(cfg, store, metrics, worker)
    leases = Leases(store, len(works), "all" if worker is None else worker.name)
    scheduler = jobs.start(cfg, store) if worker is None or worker.jobs else None
    if worker is None or worker.jobs:  # once an instance, beside the start
        threading.Thread(target=_say_unmatched, args=(cfg,), daemon=True).start()
    tune_gc()
    if worker is None:
        log.info(
            "instance %s serving %d sources, %d connectors and %d consumers",
            leases.instance, len(cfg.sources), len(cfg.connectors), len(cfg.consumers),
        )  # fmt: skip
    else:
        log.info("worker %s is instance %s", worker.name, leases.instance)
    failed = False
    reported: dict[str, tuple[str, str]] = {}  # what weir status was last told, by work
    try:
        while not stop.is_set():
            if not leases.alive():  # another instance may take the work over now: stop it
                for w in works.values():
                    w.stop()
                join_all(works.values(), LOST_GRACE)
                reported.clear()
            else:
                connectors.update(works, leases, grace)  # the API-made ones may have changed
                for name, w in works.items():
                    if w.error is not None:
                        failed = True
                        stop.set()
                    elif leases.paused(name):  # drained and given up; nobody runs it
                        if w.running:
                            w.stop()
                            w.join(grace)
                            leases.give_up(name)
                            reported.pop(name, None)
                        continue
                    elif not w.running and leases.take(name):
                        w.start()
                    if (w.running or w.error is not None) and reported.get(name) != w.status():
                        reported[name] = w.status()
                        leases.report(name, *reported[name])
                surplus = leases.surplus()  # for the peers to take their share
                for name in surplus:
                    works[name].stop()
                join_all([works[name] for name in surplus], grace)
                for name in surplus:
                    leases.give_up(name)
                    reported.pop(name, None)
            stop.wait(LEASE_POLL)
    finally:
        for w in works.values():
            w.stop()
        join_all(works.values(), grace)
        connectors.close()  # first: a connector's end may still be asking the leases' connection
        leases.close()
        if scheduler is not None:
            scheduler.shutdown(wait=False)
        if api is not None:
            api.stop()
    if worker is None:  # a worker's end the supervisor says ("worker … drained")
        log.info("stopped")
    return 1 if failed else 0


def _source_works(
    cfg: WeirConfig, store: Store, metrics: Metrics, worker: Worker | None
) -> dict[str, _Work]:
    """The sources' works this process may run under their leases, by lease name (its
    connectors' are core/runtime/connectors.py's)."""
    works: dict[str, _Work] = {}
    pg = [s for s in cfg.sources if isinstance(s, PostgresSource)]
    for k, src in enumerate(pg):
        if worker is None or worker.runs("sources", k):
            works[f"source:{src.name}"] = _SourceWork(src, store, metrics)
            works[f"backfill:{src.name}"] = _BackfillWork(src, store)
    return works


def _say_unmatched(cfg: WeirConfig) -> None:
    """What the file's connectors and consumers select that their sources do not have (a typo
    sends nothing)."""
    from core.sources.pg.selected import selection_problems

    for problem in selection_problems(cfg, [*cfg.connectors, *cfg.consumers]):
        log.warning("%s", problem)


LEASE_POLL = 1.0  # seconds between lease checks: the takeover time when an instance dies
LOST_GRACE = 5.0  # seconds work may take to stop after its lease was lost
RETRY_BACKFILL = 5.0  # seconds before a backfill that lost a connection resumes
BACKFILL_POLL = 2.0  # seconds between looks for backfills capture asked for


class _Work(Protocol):
    """A source's capture or a connector, started and stopped as its lease comes and goes."""

    error: BaseException | None  # it failed for good: weir run exits 1

    @property
    def running(self) -> bool: ...

    def status(self) -> tuple[str, str]:
        """(state, why) for weir status: ``streaming``, ``reconnecting`` and the reason, ..."""

    def start(self) -> None: ...

    def stop(self) -> None:
        """Ask it to drain and stop; ``join`` waits."""

    def join(self, timeout: float) -> None: ...


class _ThreadWork:
    """Work that runs on a thread of its own until ``stop`` is set; ``body`` is the work."""

    what = "work"

    def __init__(self, name: str) -> None:
        self.name = name
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.error: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def body(self, stop: threading.Event) -> None:
        raise NotImplementedError

    def status(self) -> tuple[str, str]:
        return ("failed", str(self.error)) if self.error is not None else ("running", "")

    def start(self) -> None:
        self._stop = stop = threading.Event()

        def run() -> None:
            try:
                self.body(stop)
            except Exception as e:
                if str(e).startswith(f"{self.what} {self.name!r}:"):  # it says whose
                    log.error("%s", e)
                else:
                    log.error("%s %s: %s", self.what, self.name, e)
                self.error = e

        self._thread = threading.Thread(target=run, name=f"{self.what}-{self.name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)


class _SourceWork(_ThreadWork):
    what = "source"

    def __init__(self, src: PostgresSource, store: Store, metrics: Metrics) -> None:
        from core.sources.pg.capture import PostgresCapture

        super().__init__(src.name)
        self.capture = PostgresCapture(src, store, metrics)

    def body(self, stop: threading.Event) -> None:
        self.capture.run(stop)

    def status(self) -> tuple[str, str]:
        if self.error is not None:
            return "failed", str(self.error)
        return self.capture.state, self.capture.detail


class _BackfillWork(_ThreadWork):
    """A source's backfills beside its capture: its ``backfill:`` tables, each once, and the
    tables capture asks for (after a lost slot, or a table that joined late); resumed after a
    restart or a takeover by another instance."""

    what = "backfill of source"

    def __init__(self, src: PostgresSource, store: Store) -> None:
        super().__init__(src.name)
        self.src = src
        self.store = store

    def body(self, stop: threading.Event) -> None:
        from core.sources.backfill import run_configured, run_requested

        configured = self.src.backfill is None
        while not stop.is_set():
            try:
                if not configured:
                    run_configured(self.src, self.store, stop)
                    configured = not stop.is_set()
                run_requested(self.src, self.store, stop)
                wait = BACKFILL_POLL
            except AWAY as e:  # a connection lost: resume at the last page
                log.warning("backfill of source %s: %s; resuming in %gs", self.src.name,
                            str(e).strip(), RETRY_BACKFILL)  # fmt: skip
                wait = RETRY_BACKFILL
            stop.wait(wait)
