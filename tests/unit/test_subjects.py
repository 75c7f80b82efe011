"""NATS subject patterns: the read-back finds a connector's messages in any stream whose
subjects overlap its own, by the intersection of the two patterns."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from connectors.nats.sink import intersect

_TOKEN = st.sampled_from(["a", "b", "c"])
_PATTERN = (
    st.lists(st.sampled_from(["a", "b", "*"]), min_size=1, max_size=4)
    .flatmap(lambda tokens: st.sampled_from([tokens, [*tokens, ">"]]))
    .map(".".join)
)


def matches(pattern: str, subject: str) -> bool:
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


@given(_PATTERN, _PATTERN, st.lists(_TOKEN, min_size=1, max_size=6).map(".".join))
def test_a_subject_matches_both_patterns_exactly_when_it_matches_their_intersection(
    a: str, b: str, subject: str
) -> None:
    both = intersect(a, b)
    if both is None:
        assert not (matches(a, subject) and matches(b, subject))
    else:
        assert matches(both, subject) == (matches(a, subject) and matches(b, subject))


def test_per_table_streams_meet_the_connectors_subjects() -> None:
    mine = "sequin-events.ns.sid.>"
    assert intersect(mine, "sequin-events.*.*.postgres.public:a.>") == (
        "sequin-events.ns.sid.postgres.public:a.>"
    )
    assert intersect(mine, "sequin-records.>") is None
