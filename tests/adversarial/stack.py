"""A running Weir over one source database, forwarding to NATS and Kafka, and the checks a
user makes: what subscribers received, what the records stream holds, what failed and why.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from devkit.embedded import EmbeddedKafka, EmbeddedNats
from tests.adversarial.kinds import exact_json
from tests.connectors.kafka.harness import KafkaHarness
from tests.connectors.nats.harness import NatsHarness
from tests.helpers import stored as store_rows
from tests.helpers.capture import wait_for
from tests.helpers.weir import serving, weir_config


class Stack:
    """Weir with a records and an events connector to NATS and a records connector to Kafka,
    over every table of the ``public`` schema (followed: tables created later are captured).
    """

    def __init__(self, url: str, nats: EmbeddedNats, kafka: EmbeddedKafka | None) -> None:
        self.url = url
        self.nats = NatsHarness(nats)
        self.kafka = KafkaHarness(kafka) if kafka is not None else None
        self.connectors = [self.nats.connector("nats-records", "records"),
                           self.nats.connector("nats-events", "events")]  # fmt: skip
        for c in self.connectors:
            self.nats.prepare(c)
        if self.kafka is not None:
            self.connectors.append(self.kafka.connector("kafka-records", "records"))
            self.kafka.prepare(self.connectors[-1])
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS markers (id serial PRIMARY KEY)")

    @contextmanager
    def running(self, **source: Any) -> Iterator[Stack]:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(20_000)  # subscribers' parsers meet JSON nested 1024 deep
        try:
            with serving(weir_config(self.url, self.connectors, **source)):
                yield self
        finally:
            sys.setrecursionlimit(limit)

    def sync(self, timeout: float = 120) -> None:
        """Until every change committed so far is stored and each connector is past it."""
        with psycopg.connect(self.url, autocommit=True) as conn:
            row = conn.execute("INSERT INTO markers DEFAULT VALUES RETURNING id").fetchone()
        assert row is not None
        marker = str(row[0])

        def done() -> bool:
            stored = store_rows.record(self.url, "public:markers", marker)
            with psycopg.connect(self.url) as conn:
                behind = conn.execute(
                    "SELECT count(*) FROM weir.cursors c JOIN weir.sources s USING (sync_id)"
                    " WHERE c.seq < CASE c.stream WHEN 'events' THEN s.events_seq"
                    " ELSE s.records_seq END"
                ).fetchone()
                cursors = conn.execute("SELECT count(*) FROM weir.cursors").fetchone()
            return stored is not None and behind == (0,) and cursors == (len(self.connectors),)

        wait_for(done, timeout=timeout, what="capture and every connector to catch up")

    # -- what each side holds -----------------------------------------------------------------

    def store_records(self, collection: str) -> dict[str, tuple[bool, Any]]:
        """The records stream: record id -> (deleted, record), numbers exact."""
        rows = store_rows.records(self.url)
        return {r["record_id"]: (r["deleted"], exact_json(r["record_json"])) for r in rows
                if r["collection_id"] == collection}  # fmt: skip

    def subscriber_records(self, collection: str) -> dict[str, dict[str, tuple[bool, Any]]]:
        """Per records connector, as its subscriber sees it: the latest message of each record
        (NATS keeps one per subject; Kafka's latest per key), numbers exact."""
        out = {}
        for c in self.connectors:
            if c["stream"] != "records":
                continue
            harness = self.nats if c["type"] == "nats" else self.kafka
            assert harness is not None
            latest: dict[str, tuple[bool, Any]] = {}
            for d in harness.read(c):
                payload = exact_json(d.raw)
                meta = payload["metadata"]
                if meta["collection_id"] == collection:
                    latest[meta["record_id"]] = (meta["deleted"], payload["record"])
            out[c["name"]] = latest
        return out

    def events(self, collection: str) -> list[dict[str, Any]]:
        """The events a NATS subscriber received for the collection, in stream order."""
        c = next(c for c in self.connectors if c["stream"] == "events")
        got = [d.payload for d in self.nats.read(c)]
        return [p for p in got if p["metadata"]["collection_id"] == collection]

    def failed(self) -> list[dict[str, Any]]:
        with (
            psycopg.connect(self.url) as conn,
            conn.cursor(row_factory=psycopg.rows.dict_row) as cur,
        ):
            return cur.execute(
                "SELECT connector, seq, error, payload FROM weir.failed_messages ORDER BY seq"
            ).fetchall()
