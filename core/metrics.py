"""Prometheus metrics of one ``weir run`` (served at ``GET /metrics`` by the HTTP API).

Counted where things happen (capture, ingest, the forwarding engine); positions and lags are
read from the store when scraped (core/status.py). Commit→delivery latency is a histogram of
its own kind: observing costs a bisect per message, cheap enough for the delivery path.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from core.config.model import WeirConfig
from core.store import Store

log = logging.getLogger("weir.metrics")

BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class Latency(Collector):
    """``weir_connector_delivery_latency_seconds``: store commit (upstream commit time) to the
    broker's acknowledgement, per message.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buckets: dict[str, list[int]] = {}
        self._sums: dict[str, float] = {}

    def observe(self, connector: str, now: float, committed: Iterable[float]) -> None:
        with self._lock:
            buckets = self._buckets.setdefault(connector, [0] * (len(BOUNDS) + 1))
            total = 0.0
            for at in committed:
                seconds = max(0.0, now - at)
                buckets[bisect.bisect_left(BOUNDS, seconds)] += 1
                total += seconds
            self._sums[connector] = self._sums.get(connector, 0.0) + total

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "weir_connector_delivery_latency_seconds",
            "Upstream commit to broker acknowledgement, per message",
            labels=["connector"],
        )
        with self._lock:
            for connector, buckets in self._buckets.items():
                cumulative, running = [], 0
                for bound, n in zip((*map(str, BOUNDS), "+Inf"), buckets, strict=True):
                    running += n
                    cumulative.append((bound, running))
                family.add_metric([connector], cumulative, self._sums[connector])
        yield family


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
            "weir_consumer_pending", "Queued and visible", labels=["consumer"]
        )
        acks = GaugeMetricFamily("weir_consumer_ack_pending", "Delivered and not acknowledged",
                                 labels=["consumer"])  # fmt: skip
        for name, (visible, outstanding) in queues.items():
            pending.add_metric([name], visible)
            acks.add_metric([name], outstanding)
        yield from (pending, acks)


class Metrics:
    """The metrics of one run; every part of ``weir run`` counts into the same one."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        self.changes = Counter("weir_source_changes", "Changes written to the store",
                               ["source"], registry=r)  # fmt: skip
        self.delivered = Counter("weir_connector_delivered", "Messages the broker acknowledged",
                                 ["connector"], registry=r)  # fmt: skip
        self.failed = Counter("weir_connector_failed", "Messages moved to the failed list",
                              ["connector"], registry=r)  # fmt: skip
        self.retried = Counter("weir_connector_retried", "Attempts that failed and are retried",
                               ["connector"], registry=r)  # fmt: skip
        self.in_flight = Gauge("weir_connector_in_flight", "Messages sent, not yet acknowledged",
                               ["connector"], registry=r)  # fmt: skip
        self.latency = Latency()
        r.register(self.latency)

    def watch_store(self, cfg: WeirConfig, store: Store) -> None:
        self.registry.register(StoreCollector(cfg, store))

    def delivered_batch(self, connector: str, committed: Sequence[float]) -> None:
        self.delivered.labels(connector).inc(len(committed))
        self.latency.observe(connector, time.time(), committed)

    def render(self) -> bytes:
        return generate_latest(self.registry)
