"""Weir's streams as a Spark data source, format ``weir`` (docs/spark.md): batch reads and
Structured Streaming, with offsets that are a source's gap-free ``seq``.

    spark.dataSource.register(WeirSource)
    spark.readStream.format("weir").option("config", "weir.yaml").option("source", "app")
         .option("stream", "events").load()

The driver reads the config once (:func:`spec_of`) into a :class:`Spec` that executors get
pickled: no connection is opened before ``read``, which connects from the executor and reads its
partition with the connectors' reader (core/store/reader.py), so a row is what a connector of
the same selection would send. A micro-batch's seq range is split into ``partitions`` buckets by
the hash that splits connectors into shards: a record's messages are all in one bucket, in seq
order, so per-record order holds within a partition.

Offsets: ``{"seq": N}``, every message up to N read. The first is the ``start`` option's (as a
connector's ``start_position``: beginning, end, ``{seq: N}`` as ``seq:N``, or an ISO time);
``maxMessagesPerTrigger`` caps a micro-batch at that many seqs. A query that names itself
(``name``) records each committed offset in the store as the cursor ``spark:NAME``, shown by
``weir status`` beside connectors. An events-stream range retention already deleted fails the
query with one error naming the seqs (as Kafka's failOnDataLoss does): it never skips silently.
The ``schema`` option adds typed columns of the record (spark/typed.py).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from operator import itemgetter
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from core.store.batches import Entries, Stored, Version
from core.store.reader import StreamReader
from spark import arrow, sink
from spark.options import Spec, spec_of
from spark.position import Position, bounds, opened, run
from spark.typed import Columns, SourceError, typed_fields

SCHEMA = (
    "sync_id string, provider string, collection_id string, record_id string, action string, "
    "seq long, committed_at timestamp, record string, changes string, deleted boolean"
)
ENVELOPE = [column.split()[0] for column in SCHEMA.split(", ")]
PAGE = 5_000  # messages a read takes from the store at a time


def _typed(options: dict[str, str], schema: StructType) -> Spec:
    """The spec, with the typed columns of the schema Spark reads with (those after the
    envelope's: the ``schema`` option's, :meth:`WeirSource.schema`, or, given with
    ``.schema()``, a schema such a read had), checked. Another schema is refused: the rows'
    columns are the envelope's, then the typed ones."""
    if schema.fieldNames()[: len(ENVELOPE)] != ENVELOPE:
        ddl = ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in schema.fields)
        raise SourceError(
            f"a weir read's columns are the envelope's ({', '.join(ENVELOPE)}), then the "
            'typed columns of the record its option "schema" gives: write '
            f'.option("schema", "{ddl}"), not .schema(...)'
        )
    spec = spec_of(options)
    if len(schema.fields) == len(ENVELOPE):
        return spec
    return replace(spec, typed=typed_fields(schema, ENVELOPE, SourceError))


class WeirSource(DataSource):
    """Format ``weir``: a source's events or records stream; writing, an http source's records
    (spark/sink.py)."""

    @classmethod
    def name(cls) -> str:
        return "weir"

    def schema(self) -> str:
        """The envelope's columns, then the ``schema`` option's (Spark parses the DDL)."""
        typed = {k.lower(): v for k, v in self.options.items()}.get("schema")
        return f"{SCHEMA}, {typed}" if typed and typed.strip() else SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return _BatchReader(_typed(dict(self.options), schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return _StreamReader(_typed(dict(self.options), schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return sink.BatchWriter(sink.target_of(dict(self.options), schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return sink.StreamWriter(sink.target_of(dict(self.options), schema))


@dataclass
class Bucket(InputPartition):
    """One task's read: the messages in seqs (after, upto] of hash bucket ``index`` of ``of``."""

    after: int
    upto: int
    index: int
    of: int


def _buckets(spec: Spec, after: int, upto: int) -> list[InputPartition]:
    """``partitions`` hash buckets of (after, upto], or with ``split`` seq, as many ranges of
    seqs (each message read by one task only, but a record's in several partitions)."""
    n = spec.partitions
    if upto <= after:
        return []
    if spec.split == "hash":
        return [Bucket(after, upto, i, n) for i in range(n)]
    cuts = [after + (upto - after) * i // n for i in range(n + 1)]
    return [Bucket(a, b, 0, 1) for a, b in itertools.pairwise(cuts) if b > a]


class _BatchReader(DataSourceReader):
    """Everything the stream holds now, from the start option's position."""

    def __init__(self, spec: Spec) -> None:
        self.spec = spec

    def partitions(self) -> list[InputPartition]:
        after, head = run(bounds(self.spec))
        return _buckets(self.spec, after, head)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, Bucket):  # nothing to read: Spark asks for one partition
            return iter(())
        return _batches(self.spec, partition)


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.target: int | None = None  # Trigger.AvailableNow: the head when the query began
        self.position = Position(spec)

    def prepareForTriggerAvailableNow(self) -> None:
        _, self.target = run(bounds(self.spec, False))

    def initialOffset(self) -> dict[str, int]:
        after, _ = run(bounds(self.spec))
        return {"seq": after}

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.spec.max_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        self.position.note(start["seq"])
        head = self.target if self.target is not None else run(bounds(self.spec, False))[1]
        if isinstance(limit, ReadMaxRows):
            head = min(head, start["seq"] + limit.max_rows)
        return {"seq": max(head, start["seq"])}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        return _buckets(self.spec, start["seq"], end["seq"])

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, Bucket):  # nothing to read: Spark asks for one partition
            return iter(())
        return _batches(self.spec, partition)

    def commit(self, end: dict[str, int]) -> None:
        """What the query has read and written, kept in the store. Spark calls ``commit`` late
        and seldom (never at the end of an AvailableNow query); the start of a micro-batch being
        planned is the end of one that completed, so ``latestOffset`` notes it too."""
        self.position.note(end["seq"])


_ARROW = pa.schema([
    ("sync_id", pa.string()), ("provider", pa.string()), ("collection_id", pa.string()),
    ("record_id", pa.string()), ("action", pa.string()), ("seq", pa.int64()),
    ("committed_at", pa.string()), ("record", pa.string()), ("changes", pa.string()),
    ("deleted", pa.bool_()),
])  # fmt: skip
_TIME = pa.timestamp("us", tz="UTC")


def _batches(spec: Spec, part: Bucket) -> Iterator[pa.RecordBatch]:
    """The bucket's rows as Arrow batches, a page each: Spark takes them as they are (rows one
    by one cost it ~20 times more). The events stream's are made column by column from the
    stored batches (spark/arrow.py); the records stream's, and rows with the schema option's
    typed columns after them, from the rows the connectors' reader makes."""
    schema = _ARROW.set(6, pa.field("committed_at", _TIME))
    same = [pa.scalar(spec.sync_id, pa.string()), pa.scalar(spec.provider, pa.string())]
    if spec.stream == "events" and spec.typed is None:
        yield from _event_batches(spec, part, same, schema)
        return
    typed = None
    if spec.typed is not None:
        typed = Columns(spec.typed, spec.permissive, spec.source)
        schema = pa.schema([*schema, *typed.arrow])
    for page in _pages(spec, part):
        # A column at a time (zip(*page) cost 1.3 us a row); the source's two, repeated.
        columns = [pa.repeat(v, len(page)) for v in same]
        columns += [pa.array(list(map(itemgetter(k), page)), _ARROW.field(k).type)
                    for k in range(len(same), len(_ARROW))]  # fmt: skip
        columns[6] = columns[6].cast(_TIME)  # ISO 8601 text, Z: UTC
        if typed is not None:
            columns += typed.arrays(page)
        yield pa.RecordBatch.from_arrays(columns, schema=schema)


@contextmanager
def _snapshot(spec: Spec, part: Bucket) -> Iterator[tuple[asyncio.AbstractEventLoop, StreamReader]]:
    """A reader of the store on an event loop of this task's own, in one snapshot for the
    check and the read: retention deleting events meanwhile (which the reader would step past)
    cannot take any from under it."""
    loop = asyncio.new_event_loop()
    reader: StreamReader | None = None
    try:
        reader = loop.run_until_complete(opened(spec))
        loop.run_until_complete(reader.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ"))
        if spec.stream == "events":
            loop.run_until_complete(_present(reader, part))
        yield loop, reader
    finally:
        if reader is not None:
            loop.run_until_complete(reader.close())
        loop.close()


def _event_batches(spec: Spec, part: Bucket, same: list[pa.Scalar],
                   schema: pa.Schema) -> Iterator[pa.RecordBatch]:  # fmt: skip
    """The events of the bucket, a stored batch at a time."""
    with _snapshot(spec, part) as (loop, reader):
        bucket = arrow.bucket_of(part.of, part.index) if part.of > 1 else None
        select = None if reader.select.everything else reader.select
        records: list[Any] = [None, []]  # the last batch a selection looked at, its records

        def keep(batch: Stored, a: int, b: int) -> list[bool]:
            coll, rid, action = (col[a:b] for col in batch.scalars[:3])
            mask = [True] * (b - a) if bucket is None else bucket(coll, rid)
            if select is not None:
                if records[0] is not batch:
                    records[:] = [batch, batch.texts(arrow.RECORD)]
                record = records[1][a:b]
                rows = zip(mask, coll, rid, action, record, strict=True)
                mask = [m and select(c, r, x, t) for m, c, r, x, t in rows]
            return mask

        after = part.after
        while after < part.upto:
            found = loop.run_until_complete(reader.stored_batches(after, part.upto))
            if not found:
                return
            for first, data in found:
                batch = Stored.of(data)
                lo, hi = (
                    max(0, after + 1 - first),
                    min(len(batch.scalars[0]), part.upto + 1 - first),
                )
                keeps = None if bucket is None and select is None else keep
                yield from arrow.event_batches(batch, first, lo, hi, PAGE, same, schema, keeps)
                after = first + hi - 1


def _pages(spec: Spec, part: Bucket) -> Iterator[list[tuple[Any, ...]]]:
    """The bucket's rows, a page at a time."""
    sid, provider, of, index = spec.sync_id, spec.provider, part.of, part.index

    def event(e: Entries, i: int, seq: int) -> tuple[Any, ...] | int:
        """The row of an event of this bucket; of another's, its seq alone."""
        coll, rid = e.coll[i], e.rid[i]
        if of > 1 and arrow.bucket(coll, rid, of) != index:
            return seq
        action, changes = e.action[i], e.changes[i]
        record = e.record[i]
        return (sid, provider, coll, rid, action, seq, e.ts[i],
                None if record is None else record.decode(),
                None if changes is None else changes.decode(), action == "delete")  # fmt: skip

    def version(v: Version) -> tuple[Any, ...] | int:
        if of > 1 and arrow.bucket(v.coll, v.rid, of) != index:
            return v.seq
        return (sid, provider, v.coll, v.rid, "delete" if v.deleted else "upsert", v.seq,
                v.ts or None, v.record.decode(), None, v.deleted)  # fmt: skip

    with _snapshot(spec, part) as (loop, reader):
        after = part.after
        while after < part.upto:  # events: PAGE taken a pass; records: all in one
            pages = reader.pages(after, part.upto, PAGE, event, version)
            taken = 0
            while True:
                try:
                    page = loop.run_until_complete(anext(pages))
                except StopAsyncIteration:
                    break
                if page:
                    taken += len(page)
                    last = page[-1]
                    after = last if isinstance(last, int) else last[5]
                    rows = [r for r in page if isinstance(r, tuple)]
                    if rows:
                        yield rows
            if spec.stream == "records" or taken < PAGE:
                return


async def _present(reader: StreamReader, part: Bucket) -> None:
    """Fail when retention deleted events of the range (a query asked for them too late)."""
    oldest = await reader.oldest()
    gone = part.upto if oldest is None else min(part.upto, oldest - 1)  # the last one deleted
    if part.after < gone:
        raise SourceError(
            f"events {part.after + 1} to {gone} of source {reader.sync_id} were deleted by "
            "retention (store.events_retention) before this query read them; start the query "
            "anew (a new checkpoint) with option start, or keep events longer"
        )
