"""Prometheus metrics of one ``weir run`` (served at ``GET /metrics`` by the HTTP API).

Counted where things happen (capture, ingest, the forwarding engine); positions and lags are
read from the store when scraped (core/status.py). Commit→delivery latency is observed a batch
at a time: a bisect per message, then one write per bucket that the batch touched.

Under the supervisor (core/runtime/supervisor.py) the counting happens in worker processes and
the serving in the ``api`` process: the supervisor gives its workers a directory of their own,
``PROMETHEUS_MULTIPROC_DIR``, where prometheus_client keeps every value in a file per process
(memory-mapped, so a value is there the moment it is counted, SIGKILL or not), and the ``api``
process sums those files when scraped (``MultiProcessCollector``). The files of a worker that
died stay and are summed, so no counter goes backwards when a worker is restarted; the gauge
of messages in flight sums the live processes only (the supervisor calls ``mark_process_dead``).
A process keeps one ``Metrics`` in that mode: two would write the same values over each other.
"""

from __future__ import annotations

import bisect
import glob
import logging
import os
import time
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from core.config.model import WeirConfig
from core.store import Store

log = logging.getLogger("weir.metrics")

SHARED_DIR = "PROMETHEUS_MULTIPROC_DIR"  # set: values live in files that the api process sums
BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class StoreCollector(Collector):
    """Positions read from the store and the sources at scrape time."""

    def __init__(self, cfg: WeirConfig, store: Store) -> None:
        self.cfg = cfg
        self.store = store

    def collect(self) -> Iterator[Metric]:
        from core import status
        from core.store import status as stored

        up = GaugeMetricFamily("weir_store_up", "1 when the store answered this scrape")
        try:
            sources = status.sources(self.cfg, self.store)
            cursors = stored.cursors(self.store)
            queues = stored.consumer_queues(self.store)
        except Exception as e:  # the store is down: say so, and nothing else
            log.warning("metrics: cannot read the store: %s", type(e).__name__)
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        seqs = GaugeMetricFamily(
            "weir_source_last_seq", "Last seq stored", labels=["source", "stream"]
        )
        slot = GaugeMetricFamily(
            "weir_source_slot_lag_bytes", "WAL the replication slot holds back", labels=["source"]
        )
        for s in sources:
            seqs.add_metric([s.name, "events"], s.events_seq)
            seqs.add_metric([s.name, "records"], s.records_seq)
            if s.slot_bytes is not None:
                slot.add_metric([s.name], s.slot_bytes)
        yield seqs
        yield slot
        labels = ["connector", "source"]
        lag = GaugeMetricFamily("weir_cursor_lag_messages", "Stored, not yet past the cursor",
                                labels=labels)  # fmt: skip
        age = GaugeMetricFamily(
            "weir_cursor_lag_seconds",
            "Age of the oldest message not past the cursor",
            labels=labels,
        )
        failed = GaugeMetricFamily("weir_failed_messages", "On the failed list", labels=labels)
        for c in cursors:
            lag.add_metric([c.name, c.source], c.lag_messages)
            age.add_metric([c.name, c.source], c.lag_seconds)
            failed.add_metric([c.name, c.source], c.failed)
        yield from (lag, age, failed)
        pending = GaugeMetricFamily(
            "weir_consumer_pending",
            "Queued and not outstanding (new or nacked)",
            labels=["consumer"],
        )
        acks = GaugeMetricFamily("weir_consumer_ack_pending",
                                 "Outstanding: delivered, neither acked nor nacked (expired too)",
                                 labels=["consumer"])  # fmt: skip
        for name, (waiting, outstanding) in queues.items():
            pending.add_metric([name], waiting)
            acks.add_metric([name], outstanding)
        yield from (pending, acks)


class _Summed(MultiProcessCollector):
    """The workers' files summed, but for a file a worker has made and not sized yet: a scrape
    in that moment (a worker starting, or restarted after a SIGKILL) failed whole on its 0
    bytes, a 500 for every metric; it holds no value yet."""

    def collect(self) -> Iterable[Metric]:
        files = []
        for path in glob.glob(os.path.join(self._path, "*.db")):
            try:
                if os.path.getsize(path) > 0:
                    files.append(path)
            except FileNotFoundError:  # a live gauge's, its process marked dead since
                continue
        metrics: Iterable[Metric] = self.merge(files, accumulate=True)  # type: ignore[no-untyped-call]
        return metrics


class Metrics:
    """The metrics of one process; every part of ``weir run`` in it counts into the same one."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)  # what render() serves
        shared = os.environ.get(SHARED_DIR)
        if shared:  # the values go to files, and what is served is the sum of every process's
            _Summed(self.registry, path=shared)  # type: ignore[no-untyped-call]
        r = None if shared else self.registry
        self.changes = Counter("weir_source_changes", "Changes written to the store",
                               ["source"], registry=r)  # fmt: skip
        self.delivered = Counter("weir_connector_delivered", "Messages the broker acknowledged",
                                 ["connector"], registry=r)  # fmt: skip
        self.failed = Counter("weir_connector_failed", "Messages moved to the failed list",
                              ["connector"], registry=r)  # fmt: skip
        self.retried = Counter("weir_connector_retried", "Attempts that failed and are retried",
                               ["connector"], registry=r)  # fmt: skip
        self.in_flight = Gauge("weir_connector_in_flight", "Messages sent, not yet acknowledged",
                               ["connector"], registry=r, multiprocess_mode="livesum")  # fmt: skip
        self.latency = Histogram(
            "weir_connector_delivery_latency_seconds",
            "Upstream commit to broker acknowledgement, per message",
            ["connector"], buckets=BOUNDS, registry=r,
        )  # fmt: skip

    def watch_store(self, cfg: WeirConfig, store: Store) -> None:
        self.registry.register(StoreCollector(cfg, store))

    def delivered_batch(self, connector: str, committed: Sequence[float]) -> None:
        """``committed`` (store commit times, upstream) were acknowledged by the broker now.
        Histogram.observe would cost two locked writes per message (2.3 µs in a worker against
        0.15 for a bisect): the batch is binned here and added to the histogram's own values,
        which are the ones it serves and, in a worker, writes to its file."""
        self.delivered.labels(connector).inc(len(committed))
        now = time.time()
        counts = [0] * (len(BOUNDS) + 1)
        total = 0.0
        for at in committed:
            seconds = max(0.0, now - at)
            counts[bisect.bisect_left(BOUNDS, seconds)] += 1
            total += seconds
        child = self.latency.labels(connector)
        for value, n in zip(child._buckets, counts, strict=True):
            if n:
                value.inc(n)
        child._sum.inc(total)

    def render(self) -> bytes:
        return generate_latest(self.registry)
