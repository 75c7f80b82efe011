"""Kafka, SQS and webhook sinks against their raw clients, on the same broker in the same run.

For each broker: N events are captured into the store first (no connector running); then a
connector forwards that backlog, timed from its start until its cursor reaches N. The raw
client sends N messages of the same size in a plain loop: confluent-kafka ``produce`` with
delivery reports (idempotent, acks=all, as Weir's producer), boto3 ``send_message_batch`` of
10 to a FIFO queue, and httpx POSTs of 100 messages, 8 at a time (as the webhook sink sends
them by default), to a receiver in a process of its own. The ratio is Weir over raw (target
with one shard >= 0.5, issue 30; docs/design.md “Performance”: 0.8 with shards). A broker whose N is
0 is left out.

    .venv/bin/python bench/sinks.py [--kafka-n 100000] [--sqs-n 3000] [--webhook-n 100000]

The brokers are the test ones (tansu in memory; moto, whose queues slow down with every message
they hold, so SQS runs a smaller N to a fresh queue for each side). Prints one JSON line and
appends it to bench/results/sinks.jsonl.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

import boto3
import httpx
import psycopg
from common import insert_rows, new_db, record, run_for
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from connectors.webhook.config import WebhookConnector
from core.config.model import WeirConfig
from core.runtime.service import prepare
from core.store.batches import Entries
from devkit.embedded import EmbeddedKafka, EmbeddedPostgres, EmbeddedSqs


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
        insert_rows(conn, n)
    with psycopg.connect(url, autocommit=True) as conn:  # one connection polls
        run_for(capture, lambda: scalar(conn, "SELECT events_seq FROM weir.sources"), n)
        first = Entries.decode(scalar(conn, "SELECT data FROM weir.event_batches LIMIT 1"))
        size = sum(len(r or b"") for r in first.record) // len(first) + 450
        cfg = WeirConfig.model_validate({"sources": [source], "connectors": [connector]})
        prepare(cfg)
        cursor = f"SELECT seq FROM weir.cursors WHERE connector = '{connector['name']}'"
        rate = run_for(cfg, lambda: scalar(conn, cursor) or 0, n)
    return rate, size


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


# A webhook receiver in a process of its own: answers 200 to every POST and counts the messages
# it was sent (by their idempotency keys), which GET / returns.
RECEIVER = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
taken = [0]
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        taken[0] += body.count(b'"idempotency_key"')
        self.send_response(200); self.send_header("content-length", "0"); self.end_headers()
    def do_GET(self):
        out = str(taken[0]).encode()
        self.send_response(200); self.send_header("content-length", str(len(out)))
        self.end_headers(); self.wfile.write(out)
    def log_message(self, *args): pass
server = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


class Receiver:
    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline())}"

    def taken(self) -> int:
        return int(httpx.get(self.url).text)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def raw_webhook(url: str, n: int, size: int) -> float:
    """Bodies of the webhook sink's default batch, 8 requests at a time, as it sends them."""
    per = WebhookConnector.model_fields["batch"].default.max_messages
    body = b'{"data":[' + b",".join([b'{"idempotency_key":"k","x":"' + b"x" * size + b'"}'] * per)
    body += b"]}"

    async def post_all() -> float:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=8)) as client:
            sem = asyncio.Semaphore(8)

            async def post() -> None:
                async with sem:
                    json = {"content-type": "application/json"}
                    resp = await client.post(url, content=body, headers=json)
                    resp.raise_for_status()

            t0 = time.perf_counter()
            await asyncio.gather(*(post() for _ in range(n // per)))
            return time.perf_counter() - t0

    return (n // per) * per / asyncio.run(post_all())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kafka-n", type=int, default=100_000)
    ap.add_argument("--sqs-n", type=int, default=3000)
    ap.add_argument("--webhook-n", type=int, default=100_000)
    args = ap.parse_args()
    result: dict[str, Any] = {
        "bench": "sinks",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": platform.node(),
        "cpus": os.cpu_count(),
    }
    with EmbeddedPostgres() as pg, EmbeddedKafka() as kafka, EmbeddedSqs() as sqs:
        if args.kafka_n:
            result["kafka"] = kafka_part(pg, kafka, args.kafka_n)
        if args.sqs_n:
            result["sqs"] = sqs_part(pg, sqs, args.sqs_n)
        if args.webhook_n:
            result["webhook"] = webhook_part(pg, args.webhook_n)
    record(result)
    return 0


def ratio(n: int, weir: float, raw: float, size: int) -> dict[str, Any]:
    return {"n": n, "weir_per_s": round(weir), "raw_per_s": round(raw),
            "ratio": round(weir / raw, 3), "bytes": size}  # fmt: skip


def kafka_part(pg: EmbeddedPostgres, kafka: EmbeddedKafka, n: int) -> dict[str, Any]:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for f in admin.create_topics([NewTopic(t, num_partitions=6)
                                  for t in ("weir-bench", "raw-bench")]).values():  # fmt: skip
        f.result(30)
    kafka_cfg = {"bootstrap_servers": kafka.bootstrap, "topic": "weir-bench"}
    kconn = {"name": "to-kafka", "type": "kafka", "stream": "events", "kafka": kafka_cfg}
    weir, size = weir_rate(pg, "kbench", n, kconn)
    return ratio(n, weir, raw_kafka(kafka.bootstrap, "raw-bench", n, size), size)


def sqs_part(pg: EmbeddedPostgres, sqs: EmbeddedSqs, n: int) -> dict[str, Any]:
    client = boto3.client("sqs", region_name="us-east-1", endpoint_url=sqs.url,
                           aws_access_key_id="k", aws_secret_access_key="s")  # fmt: skip
    for q in ("weir-bench.fifo", "raw-bench.fifo"):
        client.create_queue(QueueName=q, Attributes={"FifoQueue": "true"})
    sconn = {"name": "to-sqs", "type": "sqs", "stream": "events",
             "sqs": {"queue_url": sqs.queue_url("weir-bench.fifo"), "endpoint_url": sqs.url,
                     "access_key_id": "k", "secret_access_key": "s"}}  # fmt: skip
    weir, size = weir_rate(pg, "sbench", n, sconn)
    return ratio(n, weir, raw_sqs(client, sqs.queue_url("raw-bench.fifo"), n, size), size)


def webhook_part(pg: EmbeddedPostgres, n: int) -> dict[str, Any]:
    for_weir, for_raw = Receiver(), Receiver()
    try:
        wconn = {"name": "to-webhook", "type": "webhook", "stream": "events",
                 "webhook": {"url": for_weir.url + "/hook"}}  # fmt: skip
        weir, size = weir_rate(pg, "wbench", n, wconn)
        assert for_weir.taken() >= n
        return ratio(n, weir, raw_webhook(for_raw.url + "/hook", n, size), size)
    finally:
        for_weir.close()
        for_raw.close()


if __name__ == "__main__":
    sys.exit(main())
