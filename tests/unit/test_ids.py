"""Subject tokens and record ids (docs/configuration.md “Source database”;
docs/design.md “Subjects and record ids”)."""

from __future__ import annotations

import re
import uuid
from typing import Any
from urllib.parse import unquote_to_bytes

from hypothesis import given
from hypothesis import strategies as st

from core.ids import NULL_TOKEN, encode_token, key_token, record_id_of, sync_id_for

TOKEN = re.compile(r"^(?:[A-Za-z0-9_\-:]|%[0-9A-F]{2})+$")


@given(st.text(min_size=1))
def test_token_is_subject_safe_and_reversible(value: str) -> None:
    token = encode_token(value)
    assert TOKEN.match(token)
    assert not any(c in token for c in ".*> \t\n")
    assert unquote_to_bytes(token) == value.encode()


def test_token_examples() -> None:
    assert encode_token("public:users") == "public:users"
    assert encode_token("a.b") == "a%2Eb"
    assert encode_token("é") == "%C3%A9"
    assert encode_token("") == "%EMPTY"


@given(st.lists(st.one_of(st.integers(), st.text()), min_size=2, max_size=4))
def test_composite_ids_split_back_into_their_values(key: list[int | str]) -> None:
    parts = record_id_of(key).split(",")
    assert [unquote_to_bytes(p).decode() if p != "%EMPTY" else "" for p in parts] == [
        str(k) for k in key
    ]


def test_sync_id_is_stable() -> None:
    assert sync_id_for("app-db") == uuid.uuid5(uuid.NAMESPACE_URL, "weir:source:app-db")


@given(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text()))
def test_one_column_ids_follow_the_rule_of_every_id(value: Any) -> None:
    """The shortcuts for one key column (no join; an int as it prints) give the rule's answer:
    the value's token."""
    assert record_id_of([value]) == key_token(value)


_KEY_VALUE = st.one_of(st.none(), st.text(), st.sampled_from(["None", "NULL", "%NULL", ""]))


@given(st.lists(_KEY_VALUE, min_size=1, max_size=3), st.lists(_KEY_VALUE, min_size=1, max_size=3))
def test_different_keys_never_share_a_record_id(a: list[str | None], b: list[str | None]) -> None:
    """NULL, the empty text and texts that spell them ('None', '%NULL') are all different ids."""
    if len(a) == len(b) and a != b:
        assert record_id_of(a) != record_id_of(b)


def test_null_key_values_are_written_null() -> None:
    assert record_id_of([None]) == NULL_TOKEN == "%NULL"
    assert record_id_of(["None"]) == "None"
    assert record_id_of([None, "x"]) == "%NULL,x"
