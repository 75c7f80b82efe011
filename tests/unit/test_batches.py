"""A store batch (core/store/batches.py) gives back every entry as written, whatever its texts
hold; a version missing columns takes them from the one before with their text unchanged."""

from __future__ import annotations

import json
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from core.envelope import RawJson, dumps
from core.store.batches import Entries, Version
from core.store.change import Change
from core.store.records import Previous, split_object

texts = st.one_of(st.none(), st.binary(max_size=300))
entry = st.tuples(
    st.text(max_size=40), st.one_of(st.none(), st.text(max_size=40)),
    st.sampled_from(["insert", "update", "delete", "truncate", "upsert"]),
    st.integers(0, 2**63 - 1), st.integers(-1, 2**31 - 1), st.text(max_size=30),
    texts, texts, st.one_of(st.none(), st.integers(1, 2**63 - 1)),
    st.one_of(st.none(), st.integers(0, 2**63 - 1)), texts,
)  # fmt: skip


@given(st.lists(entry, max_size=60))
def test_a_batch_gives_back_every_entry(rows: list[tuple]) -> None:  # type: ignore[type-arg]
    e = Entries()
    for coll, rid, action, lsn, idx, ts, record, changes, rseq, version, payload in rows:
        e.add(coll, rid, action, lsn, idx, ts, record, changes, rseq, version, payload)
    blob = e.encode()
    got = Entries.decode(blob)
    assert len(got) == len(rows)
    for name in Entries.__slots__:
        assert getattr(got, name) == getattr(e, name), name


def test_a_version_reads_its_own_payload_else_its_record() -> None:
    e = Entries()
    e.add("c", "1", "update", 10, 2, "t", b'{"a":1}', None, rseq=5)
    e.add("c", "2", "delete", 10, 3, "t", b'{"id":2}', None, rseq=6, payload=b'{"id":2,"a":7}')
    e.add_version(Version("c", "3", 7, 40, -1, False, "t", b"{}"))
    got = Entries.decode(e.encode())
    assert got.version_at(0) == Version("c", "1", 5, 10, 2, False, "t", b'{"a":1}')
    assert got.version_at(1) == Version("c", "2", 6, 10, 3, True, "t", b'{"id":2,"a":7}')
    assert got.version_at(2) == Version("c", "3", 7, 40, -1, False, "t", b"{}")


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(10**30), 10**30), st.text(max_size=20),
              st.decimals(allow_nan=False, allow_infinity=False, places=4)),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=4),
    max_leaves=12,
)  # fmt: skip


def _raw(v: object) -> object:
    """Big or exact numbers as the JSON text capture keeps them in (``RawJson``)."""
    if isinstance(v, (int, Decimal)) and not isinstance(v, bool):
        return RawJson(str(v).encode())
    if isinstance(v, list):
        return [_raw(x) for x in v]
    if isinstance(v, dict):
        return {k: _raw(x) for k, x in v.items()}
    return v


@given(st.dictionaries(st.text(max_size=8), json_values, max_size=8),
       st.dictionaries(st.text(max_size=8), json_values, max_size=8), st.data())  # fmt: skip
def test_a_version_takes_the_columns_it_lacks_from_the_one_before(
    before: dict[str, object], record: dict[str, object], data: st.DataObject
) -> None:
    stored = dumps(_raw(before))
    assert {k: bytes(v) for k, v in split_object(stored).items()} == {
        k: dumps(_raw(x)) for k, x in before.items()
    }
    missing = tuple(data.draw(st.lists(st.sampled_from(sorted(before) or ["x"]), unique=True)))
    missing = tuple(k for k in missing if k not in record)
    change = Change(action="update", collection_id="c", record_id="1",
                    record=_raw(record), changes=None, missing=missing,  # type: ignore[arg-type]
                    old_record_id=None, version=1, idx=0, committed_at="")  # fmt: skip
    previous = Previous([change], lambda keys: {("c", "1"): split_object(stored)})
    whole, _ = previous.complete(change)
    out = json.loads(dumps(whole), parse_float=Decimal)
    want = {k: before[k] for k in missing if k in before} | record
    assert out == json.loads(dumps(_raw(want)), parse_float=Decimal)
    assert bool(previous.unfilled) == any(k not in before for k in missing)
