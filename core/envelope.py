"""Messages, group keys, subjects and payloads as subscribers see them (docs/design.md “Messages”,
“Guarantees”, contract): pure data, built from store rows when a message leaves Weir.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson

from core.ids import encode_token, schema_table_of
from core.redact import said

_dumps = orjson.dumps


class RawJson(bytes):
    """The text of a json/jsonb value that every JSON parser reads as it is: written into
    payloads untouched (:func:`dumps`), so its numbers keep every digit."""

    __slots__ = ()


def _fragment(value: Any) -> orjson.Fragment:
    if isinstance(value, RawJson):
        return orjson.Fragment(bytes(value))
    raise TypeError(said("%s is not a JSON value", type(value).__name__))


def dumps(record: Any) -> bytes:
    """A record (or changes) as JSON bytes, :class:`RawJson` values spliced in as they are.

    Copied to its own size: orjson's bytes keep the 4 KiB buffer they were written in, and a
    store batch keeps thousands of records (a 1M-change backlog took 2 GB in capture)."""
    return memoryview(orjson.dumps(record, default=_fragment)).tobytes()


def utc_iso(at: datetime) -> str:
    """A time as messages write it (``commit_timestamp``, ``upstream_updated_at``): ISO 8601
    in UTC with microseconds, ``2026-11-22T10:00:00.123456Z``. A store batch keeps the text."""
    return at.astimezone(UTC).isoformat(timespec="microseconds")[:-6] + "Z"


# YYYY-MM-DD, as an ISO 8601 time begins where Postgres and people write it
_ISO_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def iso_time(text: str) -> datetime | None:
    """``text`` read as an ISO 8601 date or time as Postgres and people write it (YYYY-MM-DD,
    then ``T`` or a space and the time; an offset ``Z``, ``±hh``, ``±hhmm`` or ``±hh:mm``), or
    None: ``fromisoformat`` alone takes week dates and the basic form too, pydantic no ``±hh``
    and digits alone as seconds since 1970."""
    if not _ISO_DATE.match(text) or text[10:11] not in ("", "T", " "):
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


EVENT_TYPES = {"insert": "inserted", "update": "updated", "delete": "deleted",
               "truncate": "truncated"}  # fmt: skip


def collection_prefix(sync_id: str, provider: str, collection_id: str) -> str:
    """``{sync_id}.{provider}.{collection}.``: what every group key of a collection starts with."""
    return f"{sync_id}.{encode_token(provider)}.{encode_token(collection_id)}."


MAX_RECORD_TOKEN = 256  # bytes of a record id in subjects and store keys before it is hashed


def record_token(record_id: str | None) -> str:
    """A record id as the last token of its group key: itself (``_`` for none, as for
    truncates), or ``~`` and the SHA-256 hex of it when longer than 256 bytes, so subjects stay
    far below NATS's control-line limit and store keys below an index entry's."""
    if record_id is None:
        return "_"
    if len(record_id) <= MAX_RECORD_TOKEN:  # record ids are ASCII: characters are bytes
        return record_id
    return "~" + hashlib.sha256(record_id.encode()).hexdigest()


# record_token in SQL, over a text column or expression {c} (the records stream's key).
RECORD_TOKEN_SQL = (
    f"CASE WHEN octet_length({{c}}) <= {MAX_RECORD_TOKEN} THEN {{c}}"
    " ELSE '~' || encode(sha256(convert_to({c}, 'UTF8')), 'hex') END"
)


def group_key(sync_id: str, provider: str, collection_id: str, record_id: str | None) -> str:
    """``{sync_id}.{provider}.{collection}.{record token}``: the unit of per-record order."""
    return collection_prefix(sync_id, provider, collection_id) + record_token(record_id)


def subject_prefix(stream: str, namespace: str) -> str:
    """``sequin-records.{namespace}`` or ``sequin-events.{namespace}``."""
    return f"sequin-{stream}.{namespace}"


def event_subject(namespace: str, key: str, action: str) -> str:
    return f"sequin-events.{namespace}.{key}.{EVENT_TYPES[action]}"


def record_subject(namespace: str, key: str) -> str:
    return f"sequin-records.{namespace}.{key}"


class Payloads:
    """The payloads of one source's messages (docs/design.md “Messages”): JSON objects whose
    ``record`` and ``changes`` are the stored JSON texts, spliced in without re-parsing, and
    whose ``metadata`` is written piece by piece, what one collection's messages share made
    once (the same bytes ``orjson`` writes for the metadata as a dict, a third of the time),
    and what one commit's share made once for its messages, which come one after another.
    Each payload is one join of its pieces: it is made for every message a connector sends.
    """

    def __init__(self, sync_id: str, provider: str) -> None:
        self.head = b'"metadata":{"sync_id":' + _dumps(sync_id) + b',"provider":' + _dumps(
            provider) + b',"collection_id":'  # fmt: skip
        self.postgres = provider == "postgres"
        self._collections: dict[str, tuple[bytes, bytes]] = {}
        self._commit: tuple[int, str | None, bytes] = (-1, None, b"")

    def _pieces(self, collection_id: str) -> tuple[bytes, bytes]:
        """(up to the record id, from it to the time) of a collection's messages."""
        got = self._collections.get(collection_id)
        if got is None:
            before = self.head + _dumps(collection_id) + b',"record_id":'
            if self.postgres:
                schema, table = schema_table_of(collection_id)
                after = (b',"table_schema":' + _dumps(schema) + b',"table_name":' + _dumps(table)
                         + b',"commit_timestamp":')  # fmt: skip
            else:
                after = b',"upstream_updated_at":'
            got = self._collections[collection_id] = (before, after)
        return got

    def _times(self, lsn: int, ts: str | None) -> bytes:
        """From the time up to the seq: a commit's messages share it (a records-stream
        version's own ``lsn`` is its version)."""
        if self._commit[0] == lsn and self._commit[1] == ts:
            return self._commit[2]
        t = _dumps(ts)
        if self.postgres:
            made = b"".join((t, b',"commit_lsn":', str(lsn).encode(), b',"upstream_updated_at":',
                             t, b',"seq":'))  # fmt: skip
        else:
            made = t + b',"seq":'
        self._commit = (lsn, ts, made)
        return made

    def event(self, seq: int, collection_id: str, record_id: str | None, action: str, key: str,
              commit_lsn: int, ts: str, record_json: bytes | None,
              changes_json: bytes | None) -> bytes:  # fmt: skip
        """An events-stream message from its store entry."""
        before, after = self._pieces(collection_id)
        return b"".join((
            b'{"record":', record_json or b"null", b',"changes":', changes_json or b"null",
            _ACTIONS[action], before, _dumps(record_id), after, self._times(commit_lsn, ts),
            str(seq).encode(), b',"idempotency_key":', _dumps(key), b"}}",
        ))  # fmt: skip

    def record(self, seq: int, collection_id: str, record_id: str, key: str, version: int,
               ts: str | None, deleted: bool, record_json: bytes) -> bytes:  # fmt: skip
        """A records-stream message: the record's latest version, or its tombstone."""
        before, after = self._pieces(collection_id)
        return b"".join((
            b'{"record":', record_json, b",", before, _dumps(record_id), after,
            self._times(version, ts), str(seq).encode(), b',"idempotency_key":', _dumps(key),
            b',"deleted":true}}' if deleted else b',"deleted":false}}',
        ))  # fmt: skip


_ACTIONS = {a: b',"action":"' + a.encode() + b'",' for a in EVENT_TYPES}


def event_key(sync_id: str, commit_lsn: int, commit_idx: int) -> str:
    """An events-stream message's idempotency key: unique per change of its source."""
    return f"{sync_id}:{commit_lsn}:{commit_idx}"


def record_key(group: str, version: int) -> str:
    """A records-stream message's idempotency key: built from the group key, whose tokens hold
    no ``.`` of their own, so two records never share one whatever their ids."""
    return f"{group}:{version}"


def key_prefixes(sync_id: str) -> tuple[str, str]:
    """What every idempotency key of a source's messages starts with (events, records)."""
    return f"{sync_id}:", f"{sync_id}."


# A broker's position as a sink's acknowledgements have shown it, stream by stream (e.g.
# JetStream stream sequences): saved with a connector's cursor (core/engine/sink.py ``mark``).
BrokerMark = dict[str, int]


@dataclass(slots=True, eq=False)
class Message:
    """One message leaving Weir, built from a store row (core/store/reader.py; docs/design.md
    “Messages”).

    ``group`` is the group key (unit of order, :func:`group_key`), ``key`` the idempotency key,
    ``payload`` the JSON a subscriber receives. ``action`` is the event's action (``None`` on the
    records stream). ``committed`` is the upstream commit time (epoch seconds), for latency
    metrics. ``replay`` marks one sent again from the failed list: it settles its entry there,
    not the cursor.
    """

    sync_id: str
    provider: str
    seq: int
    collection_id: str
    action: str | None
    group: str
    key: str
    payload: bytes
    committed: float = 0.0
    attempts: int = 0
    replay: bool = False  # sent again from the failed list (an operator's retry)
    route: dict[str, str] | None = None  # where its steps sent it (core/steps/), by route field


def earliest(marks: Sequence[BrokerMark]) -> BrokerMark:
    """The mark a restart reads back from, given each source's saved mark: per broker stream
    or partition the lowest position, so that nothing a source sent after its own mark is
    missed. A stream that one of the marks lacks did not exist when it was taken (a Kafka
    topic made for a new table): it is left out, so the sink reads it from its start."""
    if not marks:
        return {}
    shared = set(marks[0]).intersection(*marks[1:])
    return {stream: min(mark[stream] for mark in marks) for stream in shared}
