"""``weir nats setup``: create the JetStream streams the connectors publish into (DESIGN.md
section 5) when they are missing, and report existing ones whose settings differ.
"""

from __future__ import annotations

from typing import Any

import nats
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

from connectors.nats.config import NatsConnector, StreamLimits
from connectors.nats.sink import connect_options
from core.failures import Unreachable, network_reason, url_addresses


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
    }


async def _connect(connector: NatsConnector) -> Any:
    """A connection that tries each server twice, each attempt bounded by ``connect_timeout``,
    then raises :class:`Unreachable` with the last reason (nats-py would retry for ever and
    log a traceback for each attempt)."""
    s = connector.nats
    failures: list[Exception] = []

    async def failed(e: Exception) -> None:
        failures.append(e)

    options = connect_options(s, connector.name) | {
        "allow_reconnect": False, "max_reconnect_attempts": 1, "error_cb": failed,
    }  # fmt: skip
    try:
        return await nats.connect(**options)
    except (TimeoutError, nats.errors.Error, OSError) as e:
        last = failures[-1] if failures else e
        where = url_addresses(options["servers"])
        # nats-py raises a plain Error for the server's -ERR 'Authorization Violation'
        if isinstance(last, nats.errors.AuthorizationError) or "Authorization" in str(last):
            raise Unreachable(
                "NATS",
                where,
                "it refused the credentials",
                "nats.user/password, token, nkey_seed_file or creds_file",
            ) from None
        raise Unreachable(
            "NATS", where, network_reason(last), "nats.url and that nats-server runs there"
        ) from None


async def ensure_streams(connector: NatsConnector) -> list[str]:
    """One line per stream: created, ok, or how it differs. Raises when NATS is unreachable."""
    s = connector.nats
    limits = s.records_stream if connector.stream == "records" else s.events_stream
    nc = await _connect(connector)
    try:
        js = nc.jetstream()
        wanted = _wanted(limits)
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
