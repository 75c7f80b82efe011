"""Messages and subjects as subscribers see them (DESIGN.md sections 4 and 5, contract).

Built from store rows when a message leaves Weir; every connector and the demo use these.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from core.ids import encode_token

EVENT_TYPES = {"insert": "inserted", "update": "updated", "delete": "deleted",
               "truncate": "truncated"}  # fmt: skip


def iso_utc(ts: datetime) -> str:
    """``2026-11-22T10:00:00.123456Z``: UTC, always with microseconds."""
    return ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if ts.utcoffset() is not None else ts.isoformat()


def group_key(sync_id: str, provider: str, collection_id: str, record_id: str | None) -> str:
    """``{sync_id}.{provider}.{collection}.{record_id}``: the unit of per-record order."""
    return ".".join(
        (sync_id, encode_token(provider), encode_token(collection_id), record_id or "_")
    )


def event_subject(namespace: str, key: str, action: str) -> str:
    return f"sequin-events.{namespace}.{key}.{EVENT_TYPES[action]}"


def record_subject(namespace: str, key: str) -> str:
    return f"sequin-records.{namespace}.{key}"


def event_message(
    sync_id: str,
    provider: str,
    seq: int,
    collection_id: str,
    record_id: str | None,
    action: str,
    commit_lsn: int,
    commit_idx: int,
    committed_at: datetime,
    record: dict[str, Any] | None,
    changes: dict[str, Any] | None,
) -> dict[str, Any]:
    """An events-stream message from its store row."""
    schema, _, table = collection_id.partition(":")
    ts = iso_utc(committed_at)
    metadata: dict[str, Any] = {
        "sync_id": sync_id,
        "provider": provider,
        "collection_id": collection_id,
        "record_id": record_id,
    }
    if provider == "postgres":
        metadata |= {"table_schema": schema, "table_name": table, "commit_timestamp": ts,
                     "commit_lsn": commit_lsn}  # fmt: skip
    metadata |= {
        "upstream_updated_at": ts,
        "seq": seq,
        "idempotency_key": f"{sync_id}:{commit_lsn}:{commit_idx}",
    }
    return {"record": record, "changes": changes, "action": action, "metadata": metadata}
