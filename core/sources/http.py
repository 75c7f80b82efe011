"""HTTP ingest for ``kind: http`` sources (API syncs): batches of upserts and deletes become
events- and records-stream messages, as a Postgres source's changes do
(docs/configuration.md “Source database”).

A batch is one store transaction under the source row's lock, so batches of one source commit
one after the other, also from several Weir processes. Versions: a record's ``version`` (else
its ``upstream_updated_at`` in microseconds, else the time of ingest) must be newer than the
stored one, and the record other than the stored one, or it is skipped; so an older version
never overwrites a newer one, and sending a batch again changes nothing. A record pushed twice
in a batch with the same time (no version) is newer the second time, as the batch lists them.
Each batch gets the next number of the source's ``commit_lsn``, which with the position in the
batch makes the events' idempotency keys.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta
from typing import Any, Self

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    field_validator,
    model_validator,
)

from core.config.model import WeirConfig
from core.config.sources import HttpSource
from core.envelope import record_token, utc_iso
from core.errors import Conflict, NotFound
from core.ids import encode_token
from core.metrics import Metrics
from core.redact import said
from core.sources.pg.values import MAX_DEPTH
from core.store import Conn, Store, index
from core.store.change import Change
from core.store.ingest import current_records, lock_batch
from core.store.writer import SourceWriter


class IngestRecord(BaseModel):
    """One record as an API sync pushes it."""

    model_config = ConfigDict(extra="forbid")

    collection_id: str = Field(min_length=1, max_length=256, pattern=r"^[^\s.*>\x00]+$")
    record_id: str = Field(min_length=1, max_length=512)
    data: dict[str, Any] | None = Field(None, description="the record; optional for a delete")
    deleted: StrictBool = False  # "yes" or 1 is refused, not taken for true
    version: StrictInt | None = Field(None, ge=0, le=2**63 - 1)
    upstream_updated_at: datetime | None = None

    @field_validator("record_id", mode="before")
    @classmethod
    def _id_text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("upstream_updated_at")
    @classmethod
    def _aware(cls, v: datetime | None) -> datetime | None:
        if v is not None and v.tzinfo is None:
            raise ValueError("needs a time zone, e.g. 2026-11-22T10:00:00Z")
        if v is not None and v < _EPOCH:
            raise ValueError("is before 1970-01-01T00:00:00Z: a version counts microseconds "
                             "since then; give version instead")  # fmt: skip
        try:
            v = v if v is None else v.astimezone(UTC)
        except OverflowError:  # 9999-12-31T23:59:59-14:00, say
            raise ValueError("is after 9999-12-31T23:59:59.999999Z in UTC: a version counts "
                             "microseconds to then; give version instead") from None  # fmt: skip
        return v

    @field_validator("data")
    @classmethod
    def _storable(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return v
        wrapped: Any = v
        for _ in range(_PAD):
            wrapped = [wrapped]
        try:
            orjson.dumps(wrapped)
        except TypeError as e:  # nested too deep (the API refuses the rest)
            raise ValueError(
                said(
                    "cannot be stored: %s; nest it at most %s levels deep, counting data itself",
                    e,
                    MAX_DEPTH + 1,
                )
            ) from None
        return v

    @model_validator(mode="after")
    def _data_unless_deleted(self) -> Self:
        if self.data is None and not self.deleted:
            raise ValueError("data is required unless deleted is true")
        return self


class Ingest:
    """Writes pushed records into their http source's streams."""

    def __init__(self, cfg: WeirConfig, store: Store, metrics: Metrics) -> None:
        self.cfg = cfg
        self.store = store
        self.metrics = metrics
        self._conns: dict[str, Conn] = {}
        self._locks: dict[str, threading.Lock] = {}

    async def write(self, name: str, records: list[IngestRecord]) -> tuple[int, int]:
        """Write a batch (a POST of the ingest route); returns (accepted, skipped as not
        newer). :class:`NotFound` or :class:`Conflict` when ``name`` is no http source."""
        try:
            src = self.cfg.source(name)
        except KeyError:
            raise NotFound(said("no source named %r", name)) from None
        if not isinstance(src, HttpSource):
            raise Conflict(
                said(
                    "source %r is a %s source; only http sources take records over HTTP",
                    name,
                    src.kind,
                )
            )
        return await asyncio.to_thread(self._write, src, records)

    def _write(self, src: HttpSource, records: list[IngestRecord]) -> tuple[int, int]:
        with self._locks.setdefault(src.name, threading.Lock()):
            conn = self._conns.get(src.name)
            if conn is None or conn.closed:
                conn = self._conns[src.name] = self.store.connect()
                index.ensure(conn, self.store)
            writer = SourceWriter(conn, self.store, src.sync_id)
            try:
                return self._batch(conn, writer, src, records)
            except BaseException:
                writer.rollback()
                raise

    def _batch(
        self, conn: Conn, writer: SourceWriter, src: HttpSource, records: list[IngestRecord]
    ) -> tuple[int, int]:
        batch_no = lock_batch(conn, self.store, src.sync_id)
        keyed = [(r.collection_id, encode_token(r.record_id), r) for r in records]
        current = current_records(  # by the records stream's key, the record token
            conn, self.store, src.sync_id, [(c, i, record_token(i)) for c, i, _ in keyed]
        )
        now = datetime.now(UTC)
        changes: list[Change] = []
        timed: dict[tuple[str, str], int] = {}  # the records this batch changed so far by a
        # time, with that time (microseconds)
        for coll, rid, rec in keyed:
            ts = rec.upstream_updated_at or now
            version = rec.version if rec.version is not None else _micros(ts)
            cur = current.get((coll, rid))
            if (
                rec.version is None
                and cur is not None
                and version >= timed.get((coll, rid), version + 1)
            ):
                # Pushed again in the batch with the same time (the time of ingest, or an equal
                # upstream_updated_at): the later one is the newer, as the batch lists them. An
                # older time stays older (it overwrote the newer version: found by a tryout).
                version = max(version, cur[0] + 1)
            if cur is not None and (version <= cur[0] or _same(cur, rec)):
                continue
            diff = None
            if rec.deleted:
                action = "delete"
                record = rec.data if rec.data is not None else (cur[2] if cur else {})
            elif cur is None or cur[1]:
                action, record = "insert", rec.data or {}
            else:
                action, record = "update", rec.data or {}
                old = cur[2]
                diff = {k: old.get(k) for k in old.keys() | record.keys()
                        if old.get(k) != record.get(k)}  # fmt: skip
            iso = utc_iso(ts)
            idx = len(changes)
            change = Change(action=action, collection_id=coll, record_id=rid, record=record,
                            changes=diff, missing=(), old_record_id=None, version=version,
                            idx=idx, committed_at=iso, event_lsn=batch_no)  # fmt: skip
            changes.append(change)
            current[(coll, rid)] = (version, rec.deleted, record)
            if rec.version is None:
                timed[(coll, rid)] = _micros(ts)
        if changes:
            writer.write(changes)
            writer.commit(batch_no, batch_no)
            self.metrics.changes.labels(src.name).inc(len(changes))
        else:
            conn.rollback()
        return len(changes), len(records) - len(changes)

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()


def _same(cur: tuple[int, bool, dict[str, Any]], rec: IngestRecord) -> bool:
    """Whether a pushed record is the stored one: a delete of a deleted record, or the same
    names and values (numbers as written) of a live one. It is no new version."""
    _, deleted, stored = cur
    if deleted or rec.deleted:
        return deleted and rec.deleted
    return orjson.dumps(stored, option=orjson.OPT_SORT_KEYS) == orjson.dumps(
        rec.data, option=orjson.OPT_SORT_KEYS
    )


def _micros(ts: datetime) -> int:
    return (ts - _EPOCH) // timedelta(microseconds=1)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# data nests at most MAX_DEPTH + 1 levels, its values MAX_DEPTH as capture keeps JSON: it is
# written by orjson (which writes 254) inside the levels that leaves
_PAD = 254 - (MAX_DEPTH + 1)
