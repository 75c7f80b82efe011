"""Shard names and the record hash (core/shards.py): every shard's key names it back and no
other connector's; each record has one shard, and records spread over all of them."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from core.shards import Shard, shard_named, shard_of, split

NAMES = st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True)


@given(NAMES, NAMES, st.integers(1, 256), st.data())
def test_a_shard_key_names_its_shard_of_its_connector_only(
    name: str, other: str, of: int, data: st.DataObject
) -> None:
    shard = Shard(data.draw(st.integers(0, of - 1)), of)
    key = shard.key(name)
    assert shard_named(key, name) == shard
    if other != name:
        assert shard_named(key, other) is None
    assert (key == name) == (of == 1)  # an unsplit connector keeps its cursor's name


def test_junk_after_the_separator_names_no_shard() -> None:
    for key in ("x#", "x#1", "x#1/", "x#2/2", "x#01/2", "x#a/2", "x#1/2/3", "x#-1/2"):
        assert shard_named(key, "x") is None, key


def test_records_spread_over_every_shard() -> None:
    counts = Counter(shard_of("public:users", str(i), 4) for i in range(4000))
    assert set(counts) == {0, 1, 2, 3}
    assert min(counts.values()) > 800  # about 1,000 each
    assert split(3) == [Shard(0, 3), Shard(1, 3), Shard(2, 3)]
