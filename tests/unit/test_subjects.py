"""NATS subject patterns: the read-back finds a connector's messages in any stream whose
subjects overlap its own, by the intersection of the two patterns."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from connectors.nats.sink import intersect
from core.envelope import Payloads
from core.ids import schema_table_of

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


_MAYBE = st.one_of(st.none(), st.text())


@given(st.sampled_from(["postgres", "stripe"]), st.text(min_size=1), _MAYBE,
       st.integers(0, 2**63 - 1), _MAYBE, st.integers(1, 2**63 - 1), st.text(),
       st.booleans())  # fmt: skip
def test_payloads_are_the_documented_objects(
    provider: str, coll: str, rid: str | None, lsn: int, ts: str | None, seq: int, key: str,
    deleted: bool,
) -> None:  # fmt: skip
    """A payload is the JSON object docs/design.md “Messages” shows, in its key order, with the
    stored record and changes spliced in as they are."""
    sid = "902261b0-6b22-48a0-8d6b-2fdb16cf8402"
    meta: dict[str, object] = {"sync_id": sid, "provider": provider, "collection_id": coll,
                               "record_id": rid}  # fmt: skip
    if provider == "postgres":
        schema, table = schema_table_of(coll)
        meta |= {"table_schema": schema, "table_name": table, "commit_timestamp": ts,
                 "commit_lsn": lsn}  # fmt: skip
    meta |= {"upstream_updated_at": ts, "seq": seq, "idempotency_key": key}
    record, changes = b'{"id": 1, "n": 1.10}', b'{"n":2}'
    payloads = Payloads(sid, provider)
    event = payloads.event(seq, coll, rid, "update", key, lsn, ts, record, changes)  # type: ignore[arg-type]
    assert event == b'{"record":' + record + b',"changes":' + changes + \
        b',"action":"update","metadata":' + orjson.dumps(meta) + b"}"  # fmt: skip
    assert orjson.loads(payloads.event(seq, coll, rid, "truncate", key, lsn, ts, None, None))[  # type: ignore[arg-type]
        "record"] is None  # fmt: skip
    got = payloads.record(seq, coll, rid or "r", key, lsn, ts, deleted, record)
    meta["record_id"] = rid or "r"
    assert (
        got
        == b'{"record":'
        + record
        + b',"metadata":'
        + orjson.dumps(meta | {"deleted": deleted})
        + b"}"
    )
