"""Scheduled jobs of ``weir run`` (apscheduler, a thread of their own):

- events retention: the events stream keeps ``store.events_retention``; older events are
  deleted a batch at a time (keeping the records-stream versions they hold), and a connector
  whose cursor had not reached them is warned about; records batches that newer versions left
  sparse are rewritten (core/store/retention.py);
- slot lag: each postgres source's replication slot is checked every minute, with a warning
  when it holds back more WAL than ``slot_lag_warning`` or when nothing reads it.

Capture heartbeats are the source's own (``heartbeat_interval``) and lease heartbeats are
written every second (runtime/leases.py). The Consume API sweeps its queues on its own event loop
(``Consumers.sweep``, core/api/app.py): visibility itself needs no sweep, being a time compared
when messages are received, but messages that used up ``max_deliver`` go to the failed list
without waiting for a receive.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from apscheduler.schedulers.background import BackgroundScheduler

from core.config.model import WeirConfig
from core.config.sources import PostgresSource
from core.failures import scheduled
from core.status import slot_lag
from core.store import Store, retention

log = logging.getLogger("weir.jobs")

PRUNE_EVERY = timedelta(minutes=10)
SLOTS_EVERY = timedelta(minutes=1)


def prune_events(cfg: WeirConfig, store: Store) -> int:
    """Delete events older than the retention, then compact the records batches; returns how
    many events went."""
    cutoff, hold = cfg.store.events_retention, cfg.store.readers_hold
    with store.connect(autocommit=True) as conn:
        for connector, source, n in retention.behind(conn, store, cutoff, hold):
            log.warning(
                "retention: %s had not delivered %d events of source %s older than %s; they are "
                "deleted now (raise store.events_retention to keep them longer)",
                connector, n, source, cutoff,
            )  # fmt: skip
    total = retention.delete_older(store, cutoff, hold)
    if total:
        log.info("retention: deleted %d events older than %s", total, cutoff)
    compacted = retention.compact(store)
    if compacted:
        log.info("retention: compacted %d records batches", compacted)
    return total


def check_slots(cfg: WeirConfig) -> list[str]:
    """Warn about replication slots that hold back too much WAL or that nothing reads."""
    warnings = []
    for src in cfg.sources:
        if not isinstance(src, PostgresSource):
            continue
        held, active, error = slot_lag(src)
        if error is not None:
            warnings.append(f"source {src.name}: slot check failed: {error}")
        elif held is not None and held > src.slot_lag_warning:
            warnings.append(
                f"source {src.name}: replication slot {src.slot} holds back {held} bytes of WAL"
                f" (more than slot_lag_warning, {int(src.slot_lag_warning)}); the source server"
                " keeps that WAL on disk until Weir catches up"
                + ("" if active else "; nothing is reading the slot")
            )
    for w in warnings:
        log.warning("%s", w)
    return warnings


def start(cfg: WeirConfig, store: Store) -> BackgroundScheduler:
    scheduler = BackgroundScheduler(daemon=True)
    scheduler.add_job(scheduled("retention", prune_events), "interval", args=(cfg, store),
                      id="retention", seconds=PRUNE_EVERY.total_seconds(), max_instances=1,
                      coalesce=True)  # fmt: skip
    scheduler.add_job(scheduled("slot check", check_slots), "interval", args=(cfg,), id="slots",
                      seconds=SLOTS_EVERY.total_seconds(), max_instances=1,
                      coalesce=True)  # fmt: skip
    scheduler.start()
    return scheduler
