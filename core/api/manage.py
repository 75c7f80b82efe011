"""The management API's engine (docs/operations.md “Management API and CLI”): where sources,
connectors (by shard) and HTTP pull consumers stand, a connector's throughput and lag over the last
hour, and the operator's actions (pause, resume; retry and discard on failed lists). The routes are
core/api/manage_routes.py; the web console (core/api/console/) shows the same.

The store's side of the actions is core/store/operate.py, shared with the CLI; where things
stand is read as ``weir status`` reads it (core/status.py, core/store/status.py). Throughput
comes from samples of every cursor taken every ``SAMPLE_EVERY`` seconds by this process and
kept for an hour, in memory: a restarted API starts a new hour.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any

import orjson
from psycopg_pool import AsyncConnectionPool

from core import status
from core.api.consume import Consumers
from core.config.model import CONNECTOR, Connector, UnknownSourceError, WeirConfig
from core.errors import Conflict, InvalidField, NotFound
from core.ids import lsn_to_str
from core.masks import masks_in, shown, unmasked
from core.redact import Said, remember_config, said
from core.sources.pg.selected import selection_problems
from core.store import Store
from core.store import connectors as api_connectors
from core.store import status as stored
from core.store.consumers import CONSUMER_PREFIX, consumer_key
from core.store.cursors import SPARK_PREFIX
from core.store.operate import Operations as StoreOperations

log = logging.getLogger("weir.manage")

SAMPLE_EVERY = 5.0  # seconds between two samples of the cursors
KEEP = 3600.0  # seconds of samples kept: the console's chart spans them

# A sample: when, and by cursor name (a connector's shard key): seq (summed over its
# sources), messages behind, age of the oldest message behind.
Sample = tuple[float, dict[str, tuple[int, int, float]]]


def _base(key: str) -> str:
    return key.split("#", 1)[0]


class History:
    """Samples of every cursor over the last ``KEEP`` seconds."""

    def __init__(self) -> None:
        self.samples: deque[Sample] = deque(maxlen=int(KEEP / SAMPLE_EVERY) + 1)

    def add(self, cursors: list[stored.CursorStatus], at: float) -> None:
        by: dict[str, tuple[int, int, float]] = {}
        for c in cursors:
            seq, lag, age = by.get(c.name, (0, 0, 0.0))
            by[c.name] = (seq + c.seq, lag + c.lag_messages, max(age, c.lag_seconds))
        self.samples.append((at, by))

    def rate(self, key: str) -> float | None:
        """Messages a second past the cursor ``key`` between the last two samples."""
        if len(self.samples) < 2:
            return None
        (t0, a), (t1, b) = self.samples[-2], self.samples[-1]
        if key not in a or key not in b or t1 <= t0:
            return None
        return max(b[key][0] - a[key][0], 0) / (t1 - t0)

    def series(self, connector: str) -> list[dict[str, Any]]:
        """The connector's throughput and lag at each sample (its shards summed)."""
        out: list[dict[str, Any]] = []
        last: tuple[float, int] | None = None
        for at, by in self.samples:
            mine = [v for k, v in by.items() if _base(k) == connector]
            if not mine:
                continue
            seq = sum(v[0] for v in mine)
            rate = max(seq - last[1], 0) / (at - last[0]) if last and at > last[0] else 0.0
            out.append({"t": round(at, 3), "rate": round(rate, 2),
                        "lag_messages": sum(v[1] for v in mine),
                        "lag_seconds": round(max(v[2] for v in mine), 3)})  # fmt: skip
            last = (at, seq)
        return out


class Operations:
    """Everything the management routes and the console read and do, for one API process."""

    def __init__(
        self, cfg: WeirConfig, store: Store, pool: AsyncConnectionPool[Any], consumers: Consumers
    ) -> None:
        self.cfg = cfg
        self.store = store
        self.pool = pool
        self.engine = consumers
        self.ops = StoreOperations(store)
        self._history = History()
        self._sampler: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._sampler = asyncio.create_task(self._sample(), name="manage-sampler")

    async def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler

    async def _sample(self) -> None:
        while True:
            try:
                cursors = await asyncio.to_thread(stored.cursors, self.store)
                self._history.add(cursors, time.time())
            except Exception as e:  # the store went away: the chart has a gap
                log.debug("manage: sampling the cursors failed: %s", e)
            await asyncio.sleep(SAMPLE_EVERY)

    # -- where things stand ---------------------------------------------------------------

    async def sources(self) -> list[dict[str, Any]]:
        found, works = await asyncio.gather(
            asyncio.to_thread(status.sources, self.cfg, self.store),
            asyncio.to_thread(stored.works, self.store),
        )
        idle = stored.WorkState("not running", "", None)
        out = []
        for s in found:
            w = works.get(f"source:{s.name}", idle) if s.kind == "postgres" else None
            out.append({
                "name": s.name, "kind": s.kind, "state": w.state if w else "-",
                "detail": (w.detail if w else "") or s.error or "", "owner": s.owner,
                "last_lsn": lsn_to_str(s.commit_lsn) if s.kind == "postgres" else str(s.commit_lsn),
                "events_seq": s.events_seq, "records_seq": s.records_seq,
                "slot_lag_bytes": s.slot_bytes, "slot_active": s.slot_active, "failed": s.failed,
            })  # fmt: skip
        return out

    async def connectors(self) -> list[dict[str, Any]]:
        cursors, works = await asyncio.gather(
            asyncio.to_thread(stored.cursors, self.store),
            asyncio.to_thread(stored.works, self.store),
        )
        cfg, made = await self._effective()
        paused = works.paused
        by_key: dict[str, list[stored.CursorStatus]] = {}
        for cur in cursors:
            by_key.setdefault(cur.name, []).append(cur)
        out: dict[str, dict[str, Any]] = {}
        for c, shard in cfg.connector_shards():
            key = shard.key(c.name)
            mine = by_key.get(key, [])
            w = works.connector(key) or stored.WorkState("not running", "", None)
            entry = out.setdefault(c.name, {
                "name": c.name, "type": c.type, "stream": c.stream,
                "origin": "api" if c.name in made else "config",
                "paused": c.name in paused, "failed": mine[0].failed if mine else 0, "shards": [],
                "steps": shown(c.model_dump(mode="json", include={"steps"}))["steps"],
            })  # fmt: skip
            entry["shards"].append({
                "key": key, "state": w.state, "detail": w.detail, "owner": w.owner,
                "sources": [x.source for x in mine], "seq": sum(x.seq for x in mine),
                "lag_messages": sum(x.lag_messages for x in mine),
                "lag_seconds": max((x.lag_seconds for x in mine), default=0.0),
                "rate": self._history.rate(key),
            })  # fmt: skip
        return list(out.values())

    async def connector(self, name: str) -> dict[str, Any]:
        for c in await self.connectors():
            if c["name"] == name:
                return c
        raise NotFound(said("no connector named %r", name))

    async def consumers(self) -> list[dict[str, Any]]:
        listing = await self.engine.listing()
        queues = await asyncio.to_thread(stored.consumer_queues, self.store)
        async with self.pool.connection() as conn:
            failed = {c.name: await self.ops.count(conn, consumer_key(c.name)) for c, _ in listing}
        return [{"name": c.name, "stream": c.stream, "origin": origin,
                 "pending": queues.get(c.name, (0, 0))[0],
                 "ack_pending": queues.get(c.name, (0, 0))[1], "failed": failed[c.name]}
                for c, origin in listing]  # fmt: skip

    async def spark_queries(self) -> list[dict[str, Any]]:
        """Every named Spark query's position in each stream it read (docs/spark.md)."""
        cursors = await asyncio.to_thread(stored.cursors, self.store)
        return [{"name": c.name.removeprefix(SPARK_PREFIX), "source": c.source,
                 "stream": c.stream, "seq": c.seq, "lag_messages": c.lag_messages,
                 "lag_seconds": c.lag_seconds}
                for c in cursors if c.name.startswith(SPARK_PREFIX)]  # fmt: skip

    def history(self, name: str) -> list[dict[str, Any]]:
        """The connector's samples of the last hour ([] for a name without any)."""
        return self._history.series(name)

    # -- actions --------------------------------------------------------------------------

    async def _effective(self) -> tuple[WeirConfig, set[str]]:
        """The config with the API-made connectors, and their names."""
        async with self.pool.connection() as conn:
            stored = await api_connectors.aload(self.store, conn)
        cfg = self.cfg.with_stored(stored)
        return cfg, {c.name for c in cfg.connectors[len(self.cfg.connectors) :]}

    async def _connector_named(self, name: str) -> Connector:
        cfg, _ = await self._effective()
        for c in cfg.connectors:
            if c.name == name:
                return c
        raise NotFound(said("no connector named %r", name))

    # -- connectors made over the API -----------------------------------------------------

    async def put(self, name: str | None, c: Connector, raw: dict[str, Any]) -> dict[str, Any]:
        """Store a connector made (``name`` None) or changed over the API; ``raw`` is the
        body as sent (its secrets kept: the validated model masks them)."""
        if name is not None and c.name != name:
            raise InvalidField(
                said("the name cannot change (it is %r)", name), loc=("body", "name")
            )
        if c.name in {f.name for f in self.cfg.connectors}:
            raise Conflict(
                said("connector %r is declared in the config file; change it there", c.name)
            )
        try:
            self.cfg.sources_of(c)
        except UnknownSourceError as e:
            raise InvalidField(str(e), loc=("body", "sources")) from None
        added: list[str] = []  # the sources a change adds: read from the change on
        if name is not None:
            was = await self._connector_named(name)  # NotFound
            if (was.type, was.stream) != (c.type, c.stream):
                raise Conflict(
                    said(
                        "connector %r: its type and stream cannot change (its cursors "
                        "and broker marks are theirs); delete it and make another",
                        name,
                    )
                )
            if was.start_position != c.start_position:  # a change goes on from the cursors
                raise Conflict(
                    said(
                        "connector %r: start_position is where a new connector starts "
                        "and a change goes on from its cursors; delete it and make it "
                        "again to start elsewhere",
                        name,
                    )
                )
            async with self.pool.connection() as conn:
                stored = await api_connectors.raw(self.store, conn, name) or {}
            raw = unmasked(raw, self.described(was)["config"], stored)
            c = CONNECTOR.validate_python(raw)  # what is stored: the secrets put back
            before = {s.name for s in self.cfg.sources_of(was)}  # read from their cursors
            added = [s.name for s in self.cfg.sources_of(c) if s.name not in before]
        if (at := masks_in(raw)) is not None:
            raise InvalidField(
                "a masked value where a secret goes: send the secret itself, or the value as "
                "it was shown to keep it",
                loc=("body", *at),
            )
        async with self.pool.connection() as conn:
            done = await api_connectors.put(self.store, conn, c.name, orjson.dumps(raw).decode(),
                                            new=name is None, added=added)  # fmt: skip
        if not done:
            raise Conflict(said("a connector named %r exists", c.name))
        remember_config(c)  # its secrets hidden, its names printed whole (as the file's are)
        log.info(
            "connector %s: %s over the API", c.name, Said("made" if name is None else "changed")
        )
        unmatched = await asyncio.to_thread(selection_problems, self.cfg, [c])
        for problem in unmatched:
            log.warning("%s", problem)
        return {**self.described(c), "warnings": unmatched}

    async def delete(self, name: str) -> None:
        if name in {f.name for f in self.cfg.connectors}:
            raise Conflict(
                said("connector %r is declared in the config file; remove it there", name)
            )
        async with self.pool.connection() as conn:
            try:
                if not await api_connectors.delete(self.store, conn, name):
                    raise NotFound(said("no connector named %r made over the API", name))
            except api_connectors.StillSending as e:
                raise Conflict(str(e)) from None
        log.info("connector %s: deleted over the API", name)

    async def config_of(self, name: str) -> dict[str, Any]:
        return self.described(await self._connector_named(name))

    def described(self, c: Connector) -> dict[str, Any]:
        """A connector's config as the API shows it: secrets masked, and where it is from."""
        origin = "config" if c.name in {f.name for f in self.cfg.connectors} else "api"
        return {"origin": origin, "config": shown(c.model_dump(mode="json"))}

    async def _list_named(self, name: str) -> str:
        """The failed list ``name`` names (a connector, or ``consumer:NAME``)."""
        if name.startswith(CONSUMER_PREFIX):
            await self.engine.get(name.removeprefix(CONSUMER_PREFIX))  # NotFound
        else:
            await self._connector_named(name)
        return name

    async def pause(self, name: str, paused: bool) -> dict[str, Any]:
        await self._connector_named(name)
        async with self.pool.connection() as conn:
            await self.ops.set_paused(conn, name, paused)
        log.info("connector %s: %s by an operator", name, Said("paused" if paused else "resumed"))
        return await self.connector(name)

    async def failed(self, name: str, limit: int, after: str | None) -> dict[str, Any]:
        list_name = await self._list_named(name)
        async with self.pool.connection() as conn:
            data, next_ = await self.ops.failed(conn, list_name, limit, after)
        return {"data": data, "next": next_}

    async def failed_one(self, name: str, entry: str) -> dict[str, Any]:
        list_name = await self._list_named(name)
        async with self.pool.connection() as conn:
            return await self.ops.failed_one(conn, list_name, entry)

    async def retry(self, name: str, ids: list[str] | None) -> int:
        list_name = await self._list_named(name)
        async with self.pool.connection() as conn:
            count = await self.ops.retry(conn, list_name, ids)
        if name.startswith(CONSUMER_PREFIX):
            await self.engine.retried(name.removeprefix(CONSUMER_PREFIX))
        log.info("%s: %d failed messages to be retried, asked by an operator", name, count)
        return count

    async def discard(self, name: str, ids: list[str] | None) -> int:
        list_name = await self._list_named(name)
        async with self.pool.connection() as conn:
            count = await self.ops.discard(conn, list_name, ids)
        log.info("%s: %d failed messages discarded by an operator", name, count)
        return count
