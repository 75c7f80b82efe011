"""The latency histogram binned a batch at a time, and the run's metrics directory."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from core.metrics import BOUNDS, Metrics
from core.runtime.supervisor import MetricsDir


def test_a_batch_lands_in_the_buckets_that_observe_would_pick() -> None:
    metrics = Metrics()
    reference = Histogram("weir_connector_delivery_latency_seconds", "x", ["connector"],
                          buckets=BOUNDS, registry=CollectorRegistry())  # fmt: skip
    now = time.time()
    ages = [0.0, 0.004, 0.007, 0.3, 0.3, 299.0, 301.0, 1e6]  # clear of the bounds
    metrics.delivered_batch("c", [now - a for a in ages])
    for a in ages:
        reference.labels("c").observe(a)

    def buckets(h: Histogram) -> list[tuple[str, float]]:
        return [(s.labels["le"], s.value) for m in h.collect() for s in m.samples
                if s.name.endswith("_bucket")]  # fmt: skip

    assert buckets(metrics.latency) == buckets(reference)
    assert b'weir_connector_delivery_latency_seconds_count{connector="c"} 8.0' in metrics.render()
    assert b'weir_connector_delivered_total{connector="c"} 8.0' in generate_latest(metrics.registry)


def test_a_dead_supervisors_directory_is_swept_and_a_live_ones_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    abandoned = tmp_path / f"{MetricsDir.PREFIX}gone"
    abandoned.mkdir()
    (abandoned / "counter_1.db").write_bytes(b"")
    live = MetricsDir()
    assert not abandoned.exists()
    other = MetricsDir()  # a second run on this host leaves the first's alone
    assert Path(live.path).is_dir() and Path(other.path).is_dir()
    for run in (live, other):
        run.remove()
        assert not Path(run.path).exists()


def test_a_scrape_while_a_worker_makes_its_file_counts_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's file exists at 0 bytes for a moment before it is sized (a worker starting, or
    restarted after a SIGKILL): a scrape then served a 500 for every metric. It holds no value
    yet: the others are summed."""
    from prometheus_client.mmap_dict import MmapedDict, mmap_key

    counted = MmapedDict(str(tmp_path / "counter_101.db"))
    key = mmap_key("weir_source_changes", "weir_source_changes_total", ["source"], ["app"],
                   "Changes written to the store")  # fmt: skip
    counted.write_value(key, 7.0, 0.0)
    counted.close()
    (tmp_path / "counter_102.db").touch()  # made, not sized yet
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    served = generate_latest(Metrics().registry).decode()
    assert 'weir_source_changes_total{source="app"} 7.0' in served
