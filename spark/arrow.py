"""The events stream's rows as Arrow batches made column by column from the store's batches
(core/store/batches.py ``Stored``): the record and changes texts become Arrow string columns
over the stored bytes as they are (their lengths give the offsets), the other fields convert
from their lists in Arrow's C++, and a bucket or a selection is a filter. No Python work is
done a row but the bucket's hash, and the selection's test when there is one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate, compress
from typing import cast
from zlib import crc32

import pyarrow as pa
import pyarrow.compute as pc

from core.store.batches import Stored

RECORD, CHANGES = 0, 1  # Stored's texts: record, changes, payload
_LARGE = 2**31  # bytes of texts from which a column needs 64-bit offsets


def texts(batch: Stored, k: int) -> pa.Array:
    """Text field ``k`` of every entry, over the batch's bytes (None where its length is -1)."""
    lens = batch.lens[k]
    nulls = lens.count(-1)
    if nulls == len(lens):  # changes of inserts, say
        return pa.nulls(len(lens), pa.string())
    sizes = (n if n > 0 else 0 for n in lens) if nulls else lens
    ends = list(accumulate(sizes, initial=0))
    large = ends[-1] >= _LARGE
    kind, width = (pa.large_string(), pa.int64()) if large else (pa.string(), pa.int32())
    valid = pa.array([n >= 0 for n in lens], pa.bool_()).buffers()[1] if nulls else None
    data = pa.py_buffer(batch.raw).slice(batch.starts[k], ends[-1])
    return pa.Array.from_buffers(kind, len(lens), [valid, pa.array(ends, width).buffers()[1], data])


def bucket(coll: str, rid: str | None, of: int) -> int:
    """The hash bucket of a record among ``of``: CRC-32 of ``collection/record id`` (not a
    shard's MD5: 5x dearer)."""
    return crc32(f"{coll}/{rid or ''}".encode()) % of


def bucket_of(of: int, index: int) -> Callable[[list[str], list[str | None]], list[bool]]:
    """Whether each entry's record is in bucket ``index`` of ``of``, as ``bucket`` says, with
    the collection's part of the CRC computed once."""
    prefixes: dict[str, int] = {}

    def mask(colls: list[str], rids: list[str | None]) -> list[bool]:
        for coll in set(colls) - prefixes.keys():
            prefixes[coll] = crc32(f"{coll}/".encode())
        ids: Iterable[bytes] = (
            map(str.encode, cast(list[str], rids))
            if None not in rids
            else ((r or "").encode() for r in rids)
        )
        starts = map(prefixes.__getitem__, colls)
        return [crc32(i, p) % of == index for i, p in zip(ids, starts, strict=True)]

    return mask


def event_batches(
    batch: Stored,
    first: int,
    lo: int,
    hi: int,
    page: int,
    same: list[pa.Scalar],
    schema: pa.Schema,
    keep: Callable[[Stored, int, int], list[bool]] | None,
) -> Iterator[pa.RecordBatch]:
    """Entries ``lo`` to ``hi`` (excluded) of an events batch whose first seq is ``first``, as
    Arrow batches of ``page`` rows at most (the columns of ``schema``: the envelope's, the
    source's two from ``same``), with only the rows ``keep`` keeps when given."""
    coll, rid, action, _, _, ts = batch.scalars[:6]
    record, changes = texts(batch, RECORD), texts(batch, CHANGES)
    for a in range(lo, hi, page):
        b = min(hi, a + page)
        seqs: Iterable[int] = range(first + a, first + b)
        part = [coll[a:b], rid[a:b], action[a:b], ts[a:b]]
        texts_of = [record.slice(a, b - a), changes.slice(a, b - a)]
        if keep is not None:  # the rows kept, before any is converted
            mask = keep(batch, a, b)
            part = [list(compress(col, mask)) for col in part]
            seqs = compress(seqs, mask)
            kept = pa.array(mask, pa.bool_())
            texts_of = [t.filter(kept) for t in texts_of]
        n = len(part[0])
        if not n:
            continue
        actions = pa.array(part[2], pa.string())
        columns = [
            *(pa.repeat(v, n) for v in same),
            pa.array(part[0], pa.string()),
            pa.array(part[1], pa.string()),
            actions,
            pa.array(seqs, pa.int64()),
            pa.array(part[3], pa.string()).cast(schema.field(6).type),  # ISO 8601, Z: UTC
            *(t.cast(pa.string()) for t in texts_of),
            pc.equal(actions, "delete"),
        ]
        yield pa.RecordBatch.from_arrays(columns, schema=schema)
