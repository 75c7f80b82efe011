"""The connectors one process of ``weir run`` runs (core/runtime/service.py runs them under
their leases): the shards of the file's connectors and of those made over the management API
(core/store/connectors.py) that its worker's position selects, on one asyncio loop. When the
API-made ones change (seen at a lease poll), the works are rebuilt: a deleted or changed
connector's shards are drained and given up, a changed one starts again from its cursors with
its new config, a new one (one made again under its name included: another making) starts
from its ``start_position``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import logging
import os
import threading
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from core.config.model import Connector, WeirConfig
from core.engine.forwarder import Forwarder, Refused
from core.metrics import SHARED_DIR, Metrics
from core.redact import remember_config
from core.shards import Shard
from core.store import Store
from core.store import connectors as api_connectors
from core.store.notifier import Notifier

if TYPE_CHECKING:
    from core.runtime.leases import Leases
    from core.runtime.supervisor import Worker

log = logging.getLogger("weir")
T = TypeVar("T")


class ConnectorWorks:
    """The connector works of one process, by lease name, kept in the lease loop's dict."""

    def __init__(self, cfg: WeirConfig, store: Store, metrics: Metrics,
                 worker: Worker | None) -> None:  # fmt: skip
        self.file = cfg
        self.store = store
        self.metrics = metrics
        self.worker = worker
        self.version: str | None = None  # of the API-made connectors the works are built on
        self.loop: ConnectorLoop | None = None  # made with the first connector work
        self.mine: dict[str, ConnectorWork] = {}

    def update(self, works: dict[str, Any], leases: Leases, grace: float) -> None:
        """Rebuild this process's connector works in ``works`` when the API-made connectors
        changed since the last call (the first call builds them)."""
        if leases.connectors_version == self.version:
            return
        self.version = leases.connectors_version
        cfg = self.file
        if self.worker is None or self.worker.role == "connectors":
            cfg = api_connectors.with_api_connectors(cfg, self.store)
            remember_config(cfg)  # never logged, as the file's
        wanted = {
            f"connector:{shard.key(c.name)}": (c, shard)
            for k, (c, shard) in enumerate(cfg.connector_shards())
            if self.worker is None or self.worker.runs("connectors", k)
        }
        for name, work in list(self.mine.items()):
            if name not in wanted or wanted[name][0] != work.connector:
                work.stop()
                work.join(grace)
                if name in leases.held:
                    leases.give_up(name)
                del self.mine[name], works[name]
        for name, (c, shard) in wanted.items():
            if name not in self.mine:
                if self.loop is None:
                    self.loop = ConnectorLoop(self.store)
                work = ConnectorWork(c, shard, cfg, self.store, self.metrics, self.loop)
                self.mine[name] = works[name] = work
        leases.works = len(works)

    def close(self) -> None:
        if self.loop is not None:
            self.loop.close()


class ConnectorLoop:
    """The event loop every connector of this instance runs in, in a thread of its own."""

    def __init__(self, store: Store) -> None:
        self.loop = asyncio.new_event_loop()
        self.notifier = Notifier(store)
        self._thread = threading.Thread(target=self.loop.run_forever, name="connectors",
                                        daemon=True)  # fmt: skip
        self._thread.start()
        self.call(self.notifier.start())
        self.said: set[str] = set()  # the connectors whose refusal for good was looked at

    def say_refused(self, connector: str, line: str) -> None:
        """A connector's refusal for good, said once however many of its shards end with it,
        in this process and in this run's other worker processes (workers: {connectors: 3}
        said it three times; found by an outside tryout): by the first of them to end so."""
        if connector not in self.said:
            self.said.add(connector)
            if first_in_run(f"refused:{connector}"):
                log.error("%s", line)

    def call(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        self.call(self.notifier.stop()).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


class ConnectorWork:
    def __init__(self, c: Connector, shard: Shard, cfg: WeirConfig, store: Store,
                 metrics: Metrics, loop: ConnectorLoop) -> None:  # fmt: skip
        self.connector = c
        self.forwarder = Forwarder(c, cfg.sources_of(c), store, loop.notifier, metrics,
                                   shard=shard,
                                   step_timeout=cfg.functions.timeout.total_seconds())  # fmt: skip
        self.loop = loop
        self._halt = asyncio.Event()  # binds to the loop when first awaited
        self._run: concurrent.futures.Future[None] | None = None

    @property
    def error(self) -> BaseException | None:
        """Why it ended for good (core/engine/forwarder.py's ``Refused``): the engine retries
        every other failure itself."""
        if self._run is None or not self._run.done() or self._run.cancelled():
            return None
        return self._run.exception()

    @property
    def running(self) -> bool:
        return self._run is not None and not self._run.done()

    def status(self) -> tuple[str, str]:
        return self.forwarder.state, self.forwarder.detail

    def start(self) -> None:
        self._halt = asyncio.Event()  # made here, so that a stop() right after start() counts
        self._run = self.loop.call(self.forwarder.run(self._halt))
        self._run.add_done_callback(self._ended)

    def _ended(self, run: concurrent.futures.Future[None]) -> None:
        if not run.cancelled() and isinstance(e := run.exception(), Refused):
            self.loop.say_refused(self.connector.name, f"connector {self.connector.name}: {e}")

    def stop(self) -> None:
        self.loop.loop.call_soon_threadsafe(self._halt.set)

    def join(self, timeout: float) -> None:
        if self._run is None:
            return
        try:
            self._run.result(timeout)
        except concurrent.futures.TimeoutError:
            log.warning("connector %s: did not drain in time (WEIR_SHUTDOWN_GRACE): stopped",
                        self.forwarder.name)  # fmt: skip
            self._run.cancel()
        except Refused:
            pass  # said as it ended (_ended)
        except Exception as e:
            log.error("connector %s: %s", self.forwarder.name, e)


def first_in_run(what: str) -> bool:
    """Whether this process is the first of its ``weir run`` to say ``what``: a file made in
    the directory the supervisor shares with its workers decides, as it lasts as long as the
    run (a lock on a worker's store connection ended with that worker, and the next worker to
    be refused a second later said it again). A process on its own is the only one to ask;
    a directory that cannot be written to says it rather twice than never."""
    shared = os.environ.get(SHARED_DIR)
    if not shared:
        return True
    mark = os.path.join(shared, "said-" + hashlib.sha256(what.encode()).hexdigest()[:32])
    try:
        os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False
    except OSError:
        return True
    return True
