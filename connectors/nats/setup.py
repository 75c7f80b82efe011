"""``weir nats setup``: create the JetStream streams the connectors publish into (docs/operations.md
“Deployment”) when they are missing, and report existing ones whose settings differ.
"""

from __future__ import annotations

import re
from typing import Any

import nats
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

from connectors.nats.config import NatsConnector, StreamLimits
from connectors.nats.connection import connect


def _wanted(limits: StreamLimits) -> dict[str, Any]:
    return {
        "subjects": sorted(limits.subjects),
        "max_msgs_per_subject": limits.max_msgs_per_subject,
        "max_age": limits.max_age.total_seconds(),
        "discard": limits.discard,
        "storage": limits.storage,
        "num_replicas": limits.replicas,
        "duplicate_window": limits.duplicate_window.total_seconds(),
    }


def _actual(config: StreamConfig) -> dict[str, Any]:
    return {
        "subjects": sorted(config.subjects or []),
        "max_msgs_per_subject": config.max_msgs_per_subject,
        "max_age": float(config.max_age or 0),
        "discard": getattr(config.discard, "value", config.discard),
        "storage": getattr(config.storage, "value", config.storage),
        "num_replicas": config.num_replicas,
        "duplicate_window": float(config.duplicate_window or 0),
        "allow_batched": bool(config.allow_batched),
    }


def batched(nc: Any) -> bool | None:
    """Whether the server takes fast batches (2.14 on: connectors/nats/fast.py, one answer a
    batch); None leaves the key out for an older one."""
    version = tuple(int(p) for p in re.findall(r"\d+", nc._server_info.get("version", ""))[:2])
    return True if version >= (2, 14) else None


async def ensure_streams(connector: NatsConnector) -> list[str]:
    """One line per stream: created, ok, or how it differs. Raises when NATS is unreachable."""
    s = connector.nats
    limits = s.records_stream if connector.stream == "records" else s.events_stream
    nc = await connect(connector)
    try:
        js = nc.jetstream()
        wanted = _wanted(limits) | {"allow_batched": bool(batched(nc))}
        try:
            info = await js.stream_info(limits.name)
        except nats.js.errors.NotFoundError:
            await js.add_stream(
                StreamConfig(
                    name=limits.name,
                    subjects=limits.subjects,
                    retention=RetentionPolicy.LIMITS,
                    storage=StorageType(limits.storage),
                    max_msgs_per_subject=limits.max_msgs_per_subject,
                    max_age=limits.max_age.total_seconds(),
                    discard=DiscardPolicy(limits.discard),
                    num_replicas=limits.replicas,
                    duplicate_window=limits.duplicate_window.total_seconds(),
                    allow_batched=batched(nc),
                )
            )
            return [f"{connector.name}: created stream {limits.name} ({limits.subjects[0]})"]
        actual = _actual(info.config)
        diffs = [f"{k} is {actual[k]!r}, recommended {v!r}" for k, v in wanted.items()
                 if actual[k] != v]  # fmt: skip
        if not diffs:
            return [f"{connector.name}: stream {limits.name} exists and matches"]
        return [f"{connector.name}: stream {limits.name} exists but differs: " + "; ".join(diffs)]
    finally:
        await nc.close()
