"""The pgoutput decoder against messages built from the protocol's documented layout."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from core.ids import lsn_to_str, str_to_lsn
from core.sources.pg.pgoutput import (
    PG_EPOCH_OFFSET_US,
    UNCHANGED,
    decode,
    decode_copy_data,
    standby_status,
)

values = st.one_of(st.none(), st.just(UNCHANGED), st.binary(max_size=300))
rows = st.lists(values, max_size=40)
names = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30
)
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**63 - 1)


def tuple_data(row: list[object]) -> bytes:
    out = struct.pack(">h", len(row))
    for v in row:
        if v is None:
            out += b"n"
        elif v is UNCHANGED:
            out += b"u"
        else:
            assert isinstance(v, bytes)
            out += b"t" + struct.pack(">i", len(v)) + v
    return out


def cstr(s: str) -> bytes:
    return s.encode() + b"\x00"


@given(u32, rows)
def test_insert(relid: int, row: list[object]) -> None:
    assert decode(b"I" + struct.pack(">I", relid) + b"N" + tuple_data(row)) == ("I", relid, row)


@given(u32, st.sampled_from([None, "K", "O"]), rows, rows)
def test_update(relid: int, old_kind: str | None, old: list[object], new: list[object]) -> None:
    msg = b"U" + struct.pack(">I", relid)
    if old_kind:
        msg += old_kind.encode() + tuple_data(old)
    msg += b"N" + tuple_data(new)
    assert decode(msg) == ("U", relid, old_kind, old if old_kind else None, new)


@given(u32, st.sampled_from(["K", "O"]), rows)
def test_delete(relid: int, old_kind: str, old: list[object]) -> None:
    msg = b"D" + struct.pack(">I", relid) + old_kind.encode() + tuple_data(old)
    assert decode(msg) == ("D", relid, old_kind, old)


@given(u64, st.integers(-(2**62), 2**62), u32)
def test_begin_and_commit(lsn: int, ts: int, xid: int) -> None:
    assert decode(b"B" + struct.pack(">QqI", lsn, ts, xid)) == (
        "B", lsn, ts + PG_EPOCH_OFFSET_US, xid)  # fmt: skip
    assert decode(b"C" + struct.pack(">BQQq", 0, lsn, lsn + 8, ts)) == (
        "C", 0, lsn, lsn + 8, ts + PG_EPOCH_OFFSET_US)  # fmt: skip


@given(
    u32,
    names,
    names,
    st.sampled_from("dnfi"),
    st.lists(st.tuples(st.integers(0, 1), names, u32, st.integers(-1, 2**31 - 1)), max_size=20),
)
def test_relation(relid: int, ns: str, name: str, ident: str, cols: list[tuple]) -> None:
    msg = b"R" + struct.pack(">I", relid) + cstr(ns) + cstr(name) + ident.encode()
    msg += struct.pack(">h", len(cols))
    for flags, col, typoid, typmod in cols:
        msg += bytes([flags]) + cstr(col) + struct.pack(">Ii", typoid, typmod)
    assert decode(msg) == ("R", relid, ns, name, ident, tuple(cols))


@given(st.lists(u32, max_size=10), st.integers(0, 3))
def test_truncate(relids: list[int], options: int) -> None:
    msg = b"T" + struct.pack(">iB", len(relids), options) + struct.pack(f">{len(relids)}I", *relids)
    assert decode(msg) == ("T", options, tuple(relids))


@given(st.booleans(), u64, names, st.binary(max_size=100))
def test_logical_message(transactional: bool, lsn: int, prefix: str, content: bytes) -> None:
    msg = b"M" + bytes([transactional]) + struct.pack(">Q", lsn) + cstr(prefix)
    msg += struct.pack(">i", len(content)) + content
    assert decode(msg) == ("M", transactional, lsn, prefix, content)


def test_type_and_origin() -> None:
    assert decode(b"Y" + struct.pack(">I", 16384) + cstr("public") + cstr("mood")) == (
        "Y", 16384, "public", "mood")  # fmt: skip
    assert decode(b"O" + struct.pack(">Q", 99) + cstr("node_a")) == ("O", 99, "node_a")


def test_replication_envelope_and_status() -> None:
    payload = b"B" + struct.pack(">QqI", 1, 2, 3)
    assert decode_copy_data(b"w" + struct.pack(">QQq", 10, 20, 0) + payload) == (
        "w", 10, 20, payload)  # fmt: skip
    assert decode_copy_data(b"k" + struct.pack(">QqB", 42, 0, 1)) == ("k", 42, True)
    status = standby_status(5, 7, PG_EPOCH_OFFSET_US + 1)
    assert struct.unpack(">cQQQqB", status) == (b"r", 5, 7, 7, 1, 0)


@given(u64)
def test_lsn_text_round_trip(lsn: int) -> None:
    assert str_to_lsn(lsn_to_str(lsn)) == lsn
