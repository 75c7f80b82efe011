"""Kafka and SQS sinks against their raw clients, on the same broker in the same run.

For each broker: N events are captured into the store first (no connector running); then a
connector forwards that backlog, timed from its start until its cursor reaches N. The raw
client sends N messages of the same size in a plain loop: confluent-kafka ``produce`` with
delivery reports (idempotent, acks=all, as Weir's producer), and boto3 ``send_message_batch``
of 10 to a FIFO queue. The ratio is Weir over raw (target >= 0.8, DESIGN.md section 12).

    .venv/bin/python bench/sinks.py [--kafka-n 100000] [--sqs-n 3000]

The brokers are the test ones (tansu in memory; moto, whose queues slow down with every message
they hold, so SQS runs a smaller N to a fresh queue for each side). Prints one JSON line and
appends it to bench/results/sinks.jsonl.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
import time
from datetime import UTC, datetime
from typing import Any

import boto3
import psycopg
from common import new_db, record
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from core.config.model import WeirConfig
from core.runtime.service import prepare, serve
from devkit.embedded import EmbeddedKafka, EmbeddedPostgres, EmbeddedSqs


def run_for(cfg: WeirConfig, done: Any, timeout: float = 900) -> float:
    """Serve ``cfg`` until ``done()``; seconds from start to done."""
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=(cfg, stop), daemon=True)
    t0 = time.perf_counter()
    thread.start()
    try:
        while not done():
            if time.perf_counter() - t0 > timeout:
                raise TimeoutError("the bench did not finish")
            time.sleep(0.1)
        return time.perf_counter() - t0
    finally:
        stop.set()
        thread.join(120)


def scalar(conn: psycopg.Connection[Any], sql: str) -> Any:
    row = conn.execute(sql).fetchone()
    return row[0] if row else None


def weir_rate(
    pg: EmbeddedPostgres, name: str, n: int, connector: dict[str, Any]
) -> tuple[float, int]:
    """Capture n events, then time the connector over that backlog. Returns the rate and the
    payload size (the record plus about 450 bytes of envelope).
    """
    url = new_db(pg, name)
    source = {"name": "app", "kind": "postgres", "url": url, "tables": ["public.bench"],
              "slot": f"weir_{name}"}  # fmt: skip
    capture = WeirConfig.model_validate({"sources": [source]})
    prepare(capture)
    with psycopg.connect(url, autocommit=True) as conn:
        for lo in range(0, n, 10_000):
            conn.execute(
                "INSERT INTO bench SELECT g, g, 'name-' || g FROM "
                "generate_series(%s::bigint, %s::bigint) g",
                (lo + 1, min(n, lo + 10_000)),
            )
    with psycopg.connect(url, autocommit=True) as conn:  # one connection polls
        run_for(capture, lambda: scalar(conn, "SELECT count(*) FROM weir.events") >= n)
        size = int(scalar(conn, "SELECT avg(length(record::text)) FROM weir.events") or 0) + 450
        cfg = WeirConfig.model_validate({"sources": [source], "connectors": [connector]})
        prepare(cfg)
        cursor = f"SELECT seq FROM weir.cursors WHERE connector = '{connector['name']}'"
        seconds = run_for(cfg, lambda: (scalar(conn, cursor) or 0) >= n)
    return n / seconds, size


def raw_kafka(bootstrap: str, topic: str, n: int, size: int) -> float:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                  "linger.ms": 5, "compression.type": "lz4"})  # fmt: skip
    body = b"x" * size
    done = [0]

    def report(err: Any, msg: Any) -> None:
        done[0] += 1

    t0 = time.perf_counter()
    for i in range(n):
        while True:
            try:
                p.produce(topic, body, str(i % 5000).encode(), on_delivery=report,
                          headers=[("idempotency_key", str(i).encode())])  # fmt: skip
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    p.flush(120)
    assert done[0] == n
    return n / (time.perf_counter() - t0)


def raw_sqs(client: Any, url: str, n: int, size: int) -> float:
    body = "x" * size
    t0 = time.perf_counter()
    for lo in range(0, n, 10):
        entries = [
            {"Id": str(i), "MessageBody": body, "MessageGroupId": f"g{i % 5000}",
             "MessageDeduplicationId": f"d{i}"}
            for i in range(lo, min(n, lo + 10))
        ]  # fmt: skip
        assert not client.send_message_batch(QueueUrl=url, Entries=entries).get("Failed")
    return n / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kafka-n", type=int, default=100_000)
    ap.add_argument("--sqs-n", type=int, default=3000)
    args = ap.parse_args()
    result: dict[str, Any] = {
        "bench": "sinks",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
    }
    with EmbeddedPostgres() as pg, EmbeddedKafka() as kafka, EmbeddedSqs() as sqs:
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        for f in admin.create_topics([NewTopic(t, num_partitions=6)
                                      for t in ("weir-bench", "raw-bench")]).values():  # fmt: skip
            f.result(30)
        kafka_cfg = {"bootstrap_servers": kafka.bootstrap, "topic": "weir-bench"}
        kconn = {"name": "to-kafka", "type": "kafka", "stream": "events", "kafka": kafka_cfg}
        weir, size = weir_rate(pg, "kbench", args.kafka_n, kconn)
        raw = raw_kafka(kafka.bootstrap, "raw-bench", args.kafka_n, size)
        result["kafka"] = {"n": args.kafka_n, "weir_per_s": round(weir), "raw_per_s": round(raw),
                           "ratio": round(weir / raw, 3), "bytes": size}  # fmt: skip

        client = boto3.client("sqs", region_name="us-east-1", endpoint_url=sqs.url,
                               aws_access_key_id="k", aws_secret_access_key="s")  # fmt: skip
        for q in ("weir-bench.fifo", "raw-bench.fifo"):
            client.create_queue(QueueName=q, Attributes={"FifoQueue": "true"})
        sconn = {"name": "to-sqs", "type": "sqs", "stream": "events",
                 "sqs": {"queue_url": sqs.queue_url("weir-bench.fifo"), "endpoint_url": sqs.url,
                         "access_key_id": "k", "secret_access_key": "s"}}  # fmt: skip
        weir, size = weir_rate(pg, "sbench", args.sqs_n, sconn)
        raw = raw_sqs(client, sqs.queue_url("raw-bench.fifo"), args.sqs_n, size)
        result["sqs"] = {"n": args.sqs_n, "weir_per_s": round(weir), "raw_per_s": round(raw),
                         "ratio": round(weir / raw, 3), "bytes": size}  # fmt: skip
    record(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
