"""The events stream's rows as Arrow batches made column by column from the store's batches
(core/store/batches.py ``Stored``): the record and changes texts become Arrow string columns
over the stored bytes as they are (their lengths give the offsets), the other fields convert
from their lists in Arrow's C++, and a bucket or a selection is a filter. No Python work is
done a row but the bucket's hash, and the selection's test when there is one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import accumulate
from zlib import crc32

import pyarrow as pa
import pyarrow.compute as pc

from core.store.batches import Stored

RECORD, CHANGES = 0, 1  # Stored's texts: record, changes, payload
_LARGE = 2**31  # bytes of texts from which a column needs 64-bit offsets


def texts(batch: Stored, k: int) -> pa.Array:
    """Text field ``k`` of every entry, over the batch's bytes (None where its length is -1)."""
    lens = batch.lens[k]
    ends = list(accumulate((n if n > 0 else 0 for n in lens), initial=0))
    kind, width = (
        (pa.string(), pa.int32()) if ends[-1] < _LARGE else (pa.large_string(), pa.int64())
    )
    valid = None
    if any(n < 0 for n in lens):
        valid = pa.array([n >= 0 for n in lens], pa.bool_()).buffers()[1]
    data = pa.py_buffer(batch.raw).slice(batch.starts[k], ends[-1])
    return pa.Array.from_buffers(kind, len(lens), [valid, pa.array(ends, width).buffers()[1], data])


def bucket_of(of: int, index: int) -> Callable[[list[str], list[str | None]], list[bool]]:
    """Whether each entry's record is in bucket ``index`` of ``of``: CRC-32 of
    ``collection/record id`` (the collection's part computed once)."""
    prefixes: dict[str, int] = {}

    def mask(colls: list[str], rids: list[str | None]) -> list[bool]:
        out = []
        for coll, rid in zip(colls, rids, strict=True):
            start = prefixes.get(coll)
            if start is None:
                start = prefixes[coll] = crc32(f"{coll}/".encode())
            out.append(crc32((rid or "").encode(), start) % of == index)
        return out

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
        n = b - a
        actions = pa.array(action[a:b], pa.string())
        columns = [
            *(pa.repeat(v, n) for v in same),
            pa.array(coll[a:b], pa.string()),
            pa.array(rid[a:b], pa.string()),
            actions,
            pa.array(range(first + a, first + b), pa.int64()),
            pa.array(ts[a:b], pa.string()).cast(schema.field(6).type),  # ISO 8601 text, Z: UTC
            record.slice(a, n).cast(pa.string()),
            changes.slice(a, n).cast(pa.string()),
            pc.equal(actions, "delete"),
        ]
        out = pa.RecordBatch.from_arrays(columns, schema=schema)
        if keep is not None:
            out = out.filter(pa.array(keep(batch, a, b), pa.bool_()))
        if out.num_rows:
            yield out
