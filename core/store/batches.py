"""The stream store's batches: the changes one store write made, or records-stream versions
that no change carries, as one row each (docs/design.md “The store's layout”).

A batch keeps its entries column by column: a list per field in one JSON header, then the
JSON texts of records, changes and records-stream payloads back to back, the whole compressed
with zlib when it is large enough to gain. The texts are kept as the bytes that are sent, never
parsed on the way in or out. An entry is one change of the events stream (an ``event_batches``
row's entry ``i`` has seq ``first_seq + i``) and, when ``rseq`` is set, the records-stream
version it made; a ``record_batches`` row's entries are versions only (a backfill's rows,
tombstones of a truncated table, versions kept after retention deleted their events batch).
An events batch is encoded before its versions are numbered: their seqs are columns of its row
(``version_pos``, ``version_seq``), set with :meth:`Entries.numbered`.

Fields of an entry:

=========  ===================================================================================
coll       collection id
rid        record id (whole, however long); None for a truncate
action     insert | update | delete | truncate (a version: delete for a tombstone, else upsert)
lsn        the events stream's commit LSN (http: the batch number); a version's own: its version
idx        position in its transaction; a version's version_idx
ts         upstream time, ISO 8601 UTC with microseconds (commit timestamp, upstream_updated_at)
rseq       the records-stream seq of the version the entry made, or None
version    the version when it is not ``lsn`` (http sources), else None
record     the record's JSON (None for a truncate)
changes    the changed columns' old values as JSON, or None
payload    the version's record when it is not ``record`` (a delete's tombstone: the values the
           WAL left out of its event, taken from the version before), else None
=========  ===================================================================================
"""

from __future__ import annotations

import zlib
from itertools import accumulate
from typing import Any, NamedTuple

import orjson

from core.redact import said

FORMAT_RAW, FORMAT_ZLIB = 0, 1
COMPRESS_FROM = 512  # bytes: smaller batches are stored as they are
_SCALARS = ("coll", "rid", "action", "lsn", "idx", "ts", "rseq", "version")
_TEXTS = ("record", "changes", "payload")


class Version(NamedTuple):
    """A records-stream version as an entry holds it."""

    coll: str
    rid: str
    seq: int
    version: int
    idx: int
    deleted: bool
    ts: str
    record: bytes


class Entries:
    """A batch's entries, a list per field (see the module's table)."""

    __slots__ = (*_SCALARS, *_TEXTS)

    def __init__(self) -> None:
        self.coll: list[str] = []
        self.rid: list[str | None] = []
        self.action: list[str] = []
        self.lsn: list[int] = []
        self.idx: list[int] = []
        self.ts: list[str] = []
        self.rseq: list[int | None] = []
        self.version: list[int | None] = []
        self.record: list[bytes | None] = []
        self.changes: list[bytes | None] = []
        self.payload: list[bytes | None] = []

    def __len__(self) -> int:
        return len(self.coll)

    def add(
        self,
        coll: str,
        rid: str | None,
        action: str,
        lsn: int,
        idx: int,
        ts: str,
        record: bytes | None,
        changes: bytes | None = None,
        rseq: int | None = None,
        version: int | None = None,
        payload: bytes | None = None,
    ) -> int:
        """Append an entry; returns its position."""
        self.coll.append(coll)
        self.rid.append(rid)
        self.action.append(action)
        self.lsn.append(lsn)
        self.idx.append(idx)
        self.ts.append(ts)
        self.rseq.append(rseq)
        self.version.append(version)
        self.record.append(record)
        self.changes.append(changes)
        self.payload.append(payload)
        return len(self.coll) - 1

    @classmethod
    def from_rows(cls, rows: list[tuple[Any, ...]]) -> Entries:
        """Entries from rows of their fields in the order of ``__slots__`` (how a writer builds a
        batch: a tuple a change is cheaper than a list a field)."""
        out = cls()
        if rows:
            for name, col in zip(cls.__slots__, zip(*rows, strict=True), strict=True):
                setattr(out, name, list(col))
        return out

    def add_version(self, v: Version) -> int:
        """Append a version that no change carries (a ``record_batches`` entry)."""
        action = "delete" if v.deleted else "upsert"
        return self.add(v.coll, v.rid, action, v.version, v.idx, v.ts, v.record, rseq=v.seq)

    def numbered(self, positions: list[int] | None, seqs: list[int] | None) -> Entries:
        """Set the records-stream seqs of the versions (an events batch's row has them)."""
        for i, seq in zip(positions or (), seqs or (), strict=True):
            self.rseq[i] = seq
        return self

    def version_at(self, i: int) -> Version:
        """The records-stream version entry ``i`` made (its ``rseq`` is set)."""
        seq = self.rseq[i]
        assert seq is not None, "the entry made no version"
        version = self.version[i]
        rid = self.rid[i]
        assert rid is not None
        record = self.payload[i] or self.record[i]
        assert record is not None
        return Version(
            self.coll[i],
            rid,
            seq,
            self.lsn[i] if version is None else version,
            self.idx[i],
            self.action[i] == "delete",
            self.ts[i],
            record,
        )

    def size(self) -> int:
        """Bytes of JSON text the entries hold."""
        return sum(len(t) for col in (self.record, self.changes, self.payload) for t in col if t)

    def encode(self) -> bytes:
        texts = [getattr(self, f) for f in _TEXTS]
        lens = [[-1 if t is None else len(t) for t in col] for col in texts]
        header = orjson.dumps([getattr(self, f) for f in _SCALARS] + lens)
        body = b"".join(t for col in texts for t in col if t is not None)
        raw = len(header).to_bytes(4, "little") + header + body
        if len(raw) < COMPRESS_FROM:
            return bytes([FORMAT_RAW]) + raw
        return bytes([FORMAT_ZLIB]) + zlib.compress(raw, 1)

    @classmethod
    def decode(cls, blob: bytes | memoryview) -> Entries:
        batch = Stored.of(blob)
        out = cls()
        for name, col in zip(_SCALARS, batch.scalars, strict=True):
            setattr(out, name, col)
        for k, name in enumerate(_TEXTS):
            setattr(out, name, batch.texts(k))
        return out


class Stored(NamedTuple):
    """A batch as it is stored, its texts not yet cut apart: the scalar fields' lists (in
    ``_SCALARS`` order) and, for each text field (``_TEXTS``), its texts' lengths (-1: None)
    and where the first begins in ``raw``, the others following it back to back (a reader
    that takes the texts whole, as Arrow's string columns do, never copies them one by one)."""

    scalars: list[list[Any]]
    lens: list[list[int]]
    starts: list[int]
    raw: bytes

    @classmethod
    def of(cls, blob: bytes | memoryview) -> Stored:
        blob = bytes(blob)
        if blob[0] == FORMAT_ZLIB:
            raw = zlib.decompress(blob[1:])
        elif blob[0] == FORMAT_RAW:
            raw = blob[1:]
        else:
            raise ValueError(said("a store batch in an unknown format (%s)", blob[0]))
        end = 4 + int.from_bytes(raw[:4], "little")
        columns: list[Any] = orjson.loads(raw[4:end])
        lens = columns[len(_SCALARS) :]
        # a length of -1 is a None: it adds nothing
        starts = list(accumulate((sum(col) + col.count(-1) for col in lens), initial=end))
        return cls(columns[: len(_SCALARS)], lens, starts[:-1], raw)

    def texts(self, k: int) -> list[bytes | None]:
        """The texts of field ``_TEXTS[k]``, one by one."""
        lens, raw = self.lens[k], self.raw
        ends = list(accumulate((n if n > 0 else 0 for n in lens), initial=self.starts[k]))
        return [None if n < 0 else raw[a:b] for n, a, b in zip(lens, ends, ends[1:], strict=False)]
