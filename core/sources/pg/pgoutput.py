"""The pgoutput logical replication protocol, version 1: flat decoders over bytes.

Called once per CopyData message on the capture hot path, so every function here is a plain
function over ``bytes`` returning tuples: no classes per message, no logging. Column values stay
as the server's text bytes; :mod:`core.sources.pg.values` turns them into JSON values.

Reference: PostgreSQL docs, "Logical Replication Message Formats" and "Streaming Replication
Protocol" (XLogData / Primary keepalive / Standby status update).
"""

from __future__ import annotations

import struct
from typing import Any, Final

from core.ids import lsn_to_str
from core.redact import said

_i16 = struct.Struct(">h").unpack_from
_i32 = struct.Struct(">i").unpack_from
_u32 = struct.Struct(">I").unpack_from
_u64 = struct.Struct(">Q").unpack_from
_xlog_header = struct.Struct(">QQq").unpack_from
_keepalive = struct.Struct(">QqB").unpack_from
_begin = struct.Struct(">QqI").unpack_from
_commit = struct.Struct(">BQQq").unpack_from
_status = struct.Struct(">cQQQqB").pack


class _Unchanged:
    """Marks an unchanged TOASTed value: the server did not send it, so it is unknown."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED: Final = _Unchanged()

# Seconds between the Unix epoch and the PostgreSQL epoch (2000-01-01 UTC).
PG_EPOCH_OFFSET_US: Final = 946_684_800 * 1_000_000

# A decoded column value: the text bytes, None for SQL NULL, or UNCHANGED.
Value = bytes | None | _Unchanged
Tuple = list[Value]


class ProtocolError(ValueError):
    """The server sent something this decoder does not understand."""


def _cstring(buf: bytes, pos: int) -> tuple[str, int]:
    """A name: UTF-8, or (a database in another encoding) bytes kept as surrogates, which
    ``core.sources.pg.relations`` decodes in the database's encoding."""
    end = buf.index(0, pos)
    return buf[pos:end].decode(errors="surrogateescape"), end + 1


def decode_tuple(buf: bytes, pos: int) -> tuple[Tuple, int]:
    """TupleData at ``pos``: the column values and the position after them."""
    (ncols,) = _i16(buf, pos)
    pos += 2
    out: Tuple = []
    append = out.append
    for _ in range(ncols):
        kind = buf[pos]
        pos += 1
        if kind == 116:  # 't' text
            (n,) = _i32(buf, pos)
            pos += 4
            append(buf[pos : pos + n])
            pos += n
        elif kind == 110:  # 'n' null
            append(None)
        elif kind == 117:  # 'u' unchanged toast
            append(UNCHANGED)
        elif kind == 98:  # 'b' binary: only sent when binary 'true' was asked for
            raise ProtocolError("binary tuple data received; Weir asks for text format")
        else:
            raise ProtocolError(said("unknown tuple data kind %r at offset %s", kind, pos - 1))
    return out, pos


def decode(buf: bytes) -> tuple[Any, ...]:
    """Decode one pgoutput message. Returns a tuple whose first item is the message tag:

    - ``("B", final_lsn, commit_time_us, xid)``
    - ``("C", flags, commit_lsn, end_lsn, commit_time_us)``
    - ``("O", origin_lsn, origin_name)``
    - ``("R", relid, namespace, name, replica_identity, columns)`` with columns a tuple of
      ``(flags, name, type_oid, type_modifier)``; flags bit 1 marks a key column
    - ``("Y", type_oid, namespace, name)``
    - ``("I", relid, new_tuple)``
    - ``("U", relid, old_kind, old_tuple, new_tuple)``; old_kind is ``"K"`` (key only),
      ``"O"`` (whole old row, REPLICA IDENTITY FULL) or None
    - ``("D", relid, old_kind, old_tuple)``
    - ``("T", options, relids)``; options bit 1 = CASCADE, bit 2 = RESTART IDENTITY
    - ``("M", transactional, lsn, prefix, content)``

    Times are microseconds since the Unix epoch.
    """
    tag = buf[0]
    if tag == 73:  # 'I'
        (relid,) = _u32(buf, 1)
        if buf[5] != 78:
            raise ProtocolError("Insert without a new tuple")
        new, _ = decode_tuple(buf, 6)
        return ("I", relid, new)
    if tag == 85:  # 'U'
        (relid,) = _u32(buf, 1)
        kind = buf[5]
        old_kind = None
        old: Tuple | None = None
        pos = 6
        if kind in (75, 79):  # 'K' or 'O'
            old_kind = "K" if kind == 75 else "O"
            old, pos = decode_tuple(buf, 6)
            kind = buf[pos]
            pos += 1
        if kind != 78:
            raise ProtocolError("Update without a new tuple")
        new, _ = decode_tuple(buf, pos)
        return ("U", relid, old_kind, old, new)
    if tag == 68:  # 'D'
        (relid,) = _u32(buf, 1)
        kind = buf[5]
        if kind not in (75, 79):
            raise ProtocolError("Delete without an old tuple")
        old, _ = decode_tuple(buf, 6)
        return ("D", relid, "K" if kind == 75 else "O", old)
    if tag == 66:  # 'B'
        final_lsn, ts, xid = _begin(buf, 1)
        return ("B", final_lsn, ts + PG_EPOCH_OFFSET_US, xid)
    if tag == 67:  # 'C'
        flags, commit_lsn, end_lsn, ts = _commit(buf, 1)
        return ("C", flags, commit_lsn, end_lsn, ts + PG_EPOCH_OFFSET_US)
    if tag == 82:  # 'R'
        (relid,) = _u32(buf, 1)
        namespace, pos = _cstring(buf, 5)
        name, pos = _cstring(buf, pos)
        replident = chr(buf[pos])
        (ncols,) = _i16(buf, pos + 1)
        pos += 3
        cols = []
        for _ in range(ncols):
            flags = buf[pos]
            colname, pos = _cstring(buf, pos + 1)
            typoid, typmod = struct.unpack_from(">Ii", buf, pos)
            pos += 8
            cols.append((flags, colname, typoid, typmod))
        return ("R", relid, namespace, name, replident, tuple(cols))
    if tag == 89:  # 'Y'
        (typoid,) = _u32(buf, 1)
        namespace, pos = _cstring(buf, 5)
        name, _ = _cstring(buf, pos)
        return ("Y", typoid, namespace, name)
    if tag == 84:  # 'T'
        (nrels,) = _i32(buf, 1)
        options = buf[5]
        relids = struct.unpack_from(f">{nrels}I", buf, 6)
        return ("T", options, relids)
    if tag == 79:  # 'O'
        (lsn,) = _u64(buf, 1)
        name, _ = _cstring(buf, 9)
        return ("O", lsn, name)
    if tag == 77:  # 'M'
        flags = buf[1]
        (lsn,) = _u64(buf, 2)
        prefix, pos = _cstring(buf, 10)
        (n,) = _i32(buf, pos)
        return ("M", bool(flags & 1), lsn, prefix, buf[pos + 4 : pos + 4 + n])
    raise ProtocolError(said("unknown pgoutput message tag %r", chr(tag)))


# Bytes before the pgoutput message in XLogData: 'w', wal start, wal end, send time.
XLOG_HEADER: Final = 25


def start_replication(slot: str, publication: str, lsn: int) -> bytes:
    """The START_REPLICATION command for pgoutput v1 with logical messages (heartbeats)."""
    return (
        f'START_REPLICATION SLOT "{slot}" LOGICAL {lsn_to_str(lsn)} '
        f"(proto_version '1', publication_names '\"{publication}\"', messages 'true')"
    ).encode()


def decode_copy_data(buf: bytes) -> tuple[Any, ...]:
    """The replication envelope around pgoutput messages.

    - ``("w", wal_start, wal_end, payload)`` XLogData
    - ``("k", wal_end, reply_requested)`` primary keepalive
    """
    tag = buf[0]
    if tag == 119:  # 'w'
        start, end, _ = _xlog_header(buf, 1)
        return ("w", start, end, buf[XLOG_HEADER:])
    if tag == 107:  # 'k'
        end, _, reply = _keepalive(buf, 1)
        return ("k", end, bool(reply))
    raise ProtocolError(said("unknown replication message tag %r", chr(tag)))


def standby_status(written: int, flushed: int, now_us: int, reply: bool = False) -> bytes:
    """The Standby status update a client sends: ``flushed`` is what the slot may free."""
    return _status(b"r", written, flushed, flushed, now_us - PG_EPOCH_OFFSET_US, int(reply))
