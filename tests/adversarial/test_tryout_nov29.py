"""Findings of the Nov 29 outside try-out: each test shows one thing that still breaks a
promise of README.md / docs/, against real servers."""

from __future__ import annotations

import json

import httpx

from tests.helpers import stored
from tests.helpers.api import api_serving


def _push(client: httpx.Client, *recs: dict[str, object]) -> httpx.Response:
    return client.post("/v1/sources/stripe/records", json={"records": list(recs)})


def test_ingest_far_future_upstream_updated_at_is_a_422_not_a_500(db_url: str) -> None:
    """docs/consume-api.md: every ingest body is refused with a 422 naming what is wrong, or
    taken. ``upstream_updated_at`` of 9999-12-31T23:59:59-14:00 is a valid ISO-8601 time with
    a zone (pydantic takes it) but lies past year 9999 in UTC: ``utc_iso`` overflows and the
    API answers 500 Internal Server Error (and drops the keep-alive connection)."""
    with api_serving(db_url) as client:
        r = _push(client, {"collection_id": "c", "record_id": "1", "data": {"a": 1},
                           "upstream_updated_at": "9999-12-31T23:59:59-14:00"})  # fmt: skip
        assert r.status_code == 422 and "upstream_updated_at" in r.text, (r.status_code, r.text)


def test_ingest_older_upstream_updated_at_later_in_a_batch_does_not_overwrite(
    db_url: str,
) -> None:
    """docs/consume-api.md: "a record is written only when its version is newer than the
    stored one" (an older version never overwrites a newer one), and a record listed twice in
    a batch is newer the second time only for "the same time of ingest, or an equal
    upstream_updated_at". Pushed in one batch as 2026 then 2020, the 2020 version is taken as
    newer (accepted 2) and the record ends as the older data; pushed in two batches, the same
    2020 version is skipped. The outcome depends on how a sync happened to batch."""
    one = {"collection_id": "c", "record_id": "1"}
    two = {"collection_id": "c", "record_id": "2"}
    new = "2026-01-01T00:00:00Z"
    old = "2020-01-01T00:00:00Z"
    with api_serving(db_url) as client:
        # two batches: the older one is skipped
        assert _push(client, {**one, "data": {"v": "new"}, "upstream_updated_at": new}).json() == {
            "accepted": 1,
            "skipped": 0,
        }
        assert _push(client, {**one, "data": {"v": "old"}, "upstream_updated_at": old}).json() == {
            "accepted": 0,
            "skipped": 1,
        }
        # one batch: the same two pushes
        got = _push(client, {**two, "data": {"v": "new"}, "upstream_updated_at": new},
                    {**two, "data": {"v": "old"}, "upstream_updated_at": old})  # fmt: skip
        latest = {r["record_id"]: json.loads(r["record_json"]) for r in stored.records(db_url)}
        assert latest["1"] == {"v": "new"}
        assert (got.json(), latest["2"]) == ({"accepted": 1, "skipped": 1}, {"v": "new"}), (
            got.text,
            latest,
        )
