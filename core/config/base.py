"""Config building blocks shared by core and every connector package
(docs/configuration.md “The config file”).

Connector packages import these to declare their settings; ``core.config.model`` assembles the file.
"""

from __future__ import annotations

import math
import os
import re
import stat
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, Self, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PlainSerializer,
    PrivateAttr,
    SecretStr,
    Tag,
    WithJsonSchema,
    model_validator,
)

from core.tables import parse_table, table_name

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_LONGEST = 999_999 * 86400.0  # seconds: timedelta ends at 999,999,999 days; this is plenty


def _duration(v: Any) -> Any:
    """``7d``, ``12h``, ``30m``, ``10s``, ``250ms`` or a number of seconds."""
    if isinstance(v, str):
        m = _DURATION.match(v)
        if not m:
            raise ValueError("expected a duration like 250ms, 10s, 30m, 12h or 7d")
        v = float(m.group(1)) * _UNITS[m.group(2)]
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if not 0 <= v <= _LONGEST:  # (also NaN) beyond it timedelta overflows
            raise ValueError(f"expected a duration from 0 to {_LONGEST // 86400:.0f}d")
        return timedelta(seconds=v)
    return v


def duration_text(v: timedelta) -> str:
    """A duration as the config writes it (``250ms``, ``10s``, ``1.5s``): what the API shows
    of a config can be sent back as it is."""
    ms = v.total_seconds() * 1000
    return f"{ms:g}ms" if ms < 1000 else f"{ms / 1000:g}s"


Duration = Annotated[
    timedelta,
    BeforeValidator(_duration),
    PlainSerializer(duration_text, return_type=str, when_used="json"),
    # as the config writes it, not pydantic's ISO 8601 (which _duration refuses)
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": _DURATION.pattern},
                {"type": "number", "minimum": 0, "maximum": _LONGEST},
            ]
        }
    ),
]


def _no_nul(v: str) -> str:
    if "\x00" in v:
        raise ValueError("must not contain the NUL character (Postgres cannot store it)")
    return v


Text = Annotated[str, AfterValidator(_no_nul)]
# schema.table, in the one spelling of core.tables, so that names compare equal as text
TableName = Annotated[str, AfterValidator(lambda t: table_name(*parse_table(t)))]


def tag_of(model: type[BaseModel], field: str) -> str:
    """The one value a union member's discriminator ``field`` (a ``Literal``) may take: a
    connector's ``type``, a source's ``kind``."""
    return str(get_args(model.model_fields[field].annotation)[0])


def check_pair(model: BaseModel, a: str, b: str) -> None:
    """A config validator: fields ``a`` and ``b`` are both given or both left out."""
    if (getattr(model, a) is None) != (getattr(model, b) is None):
        raise ValueError(f"{a} and {b} go together")


def check_http_url(v: str, example: str) -> str:
    """A config validator: an http:// or https:// URL (``example`` shows one)."""
    if not v.startswith(("https://", "http://")):
        raise ValueError(f"expected an http:// or https:// URL, like {example}")
    return v


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="after")
    def _no_nul(self) -> Self:
        """No setting holds a NUL character: Postgres keeps none in text (a connector or
        consumer made over the API is kept there). Nested models checked themselves."""
        for name in type(self).model_fields:
            stack = [getattr(self, name)]
            while stack:
                v = stack.pop()
                if isinstance(v, SecretStr):
                    v = v.get_secret_value()
                if isinstance(v, str) and "\x00" in v:
                    raise ValueError(f"{name}: holds a NUL character (\\u0000), which no "
                                     "setting may")  # fmt: skip
                if isinstance(v, dict):
                    stack += [*v.keys(), *v.values()]
                elif isinstance(v, (list, tuple)):
                    stack += v
        return self


def _readable(path: Path) -> Path:
    """A file the config names (a CA, a key, credentials) is one this process can read: said
    at load with its key, not at each connect as a server that cannot be reached. Looked at,
    not opened: opening a FIFO waits for a writer, and held the API and every connector (found
    by an outside tryout). ``~`` is the user's home; a relative path is the working
    directory's."""
    if not str(path).strip() or str(path) == ".":
        raise ValueError("is empty: give a file's path")
    path = path.expanduser()
    try:
        mode = path.stat().st_mode
    except OSError as e:
        raise ValueError(f"cannot read {path}: {(e.strerror or str(e)).lower()}") from None
    if not stat.S_ISREG(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
        raise ValueError(f"cannot read {path}: it is {kind}")
    if not os.access(path, os.R_OK):
        raise ValueError(f"cannot read {path}: permission denied")
    return path


ReadableFile = Annotated[Path, AfterValidator(_readable)]


class TlsFiles(Model):
    """TLS to a broker: a CA to trust and, for mutual TLS, a client certificate and key."""

    ca_file: ReadableFile | None = Field(None, description="CA certificates to trust (PEM)")
    cert_file: ReadableFile | None = Field(
        None, description="client certificate (PEM) for mutual TLS, with key_file"
    )
    key_file: ReadableFile | None = Field(None, description="the client certificate's key (PEM)")

    @model_validator(mode="after")
    def _pair(self) -> Self:
        check_pair(self, "cert_file", "key_file")
        return self


class BatchPolicy(Model):
    """A connector's ``batch``: how much goes to the broker in one write."""

    max_messages: int = Field(500, ge=1, le=10_000, description="messages in one write at most")
    max_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="payload bytes in one write at most (a larger message goes alone)",
    )


class RetryPolicy(Model):
    """A connector's ``retry``: backoff between attempts, capped, with jitter (:meth:`delay`)."""

    initial: Duration = Field(timedelta(milliseconds=100), description="the first wait")
    max: Duration = Field(timedelta(seconds=10), description="the longest wait, before jitter")
    multiplier: float = Field(2.0, ge=1.0, description="each wait is the one before times this")
    jitter: float = Field(
        0.2, ge=0.0, le=1.0, description="each wait is made up to this fraction shorter or longer"
    )
    max_attempts: int | None = Field(
        None,
        ge=1,
        description="attempts before the message goes to the failed list; unset: for ever, but "
        "for a message that alone loses the connection 3 times",
    )

    def delay(self, attempt: int, rand: float) -> float:
        """Seconds to wait before attempt ``attempt + 1``; ``rand`` is uniform in [0, 1)."""
        base = min(
            self.max.total_seconds(),
            self.initial.total_seconds() * self.multiplier ** (attempt - 1),
        )
        return base * (1 - self.jitter + 2 * self.jitter * rand)


FilterOp = Literal[
    "=", "!=", "<", "<=", ">", ">=", "in", "not_in", "is_null", "is_not_null", "like"
]


class Filter(Model):
    """One condition on a field of the message's record; a connector's filters all must hold."""

    column: str = Field(min_length=1, description="a top-level field of the record")
    op: FilterOp = Field(description="how the field compares with value")
    value: Any = Field(
        None,
        description="JSON as YAML 1.2 reads it: a list for in and not_in, none for is_null and "
        "is_not_null, a LIKE pattern (`%` any text, `_` one character) for like; values compare "
        "as jsonb compares them, numbers by value, never across types",
    )

    @model_validator(mode="after")
    def _value_fits_op(self) -> Filter:
        if self.op in ("in", "not_in") and not isinstance(self.value, list):
            raise ValueError(f"op {self.op!r} needs a list value")
        if self.op in ("is_null", "is_not_null") and self.value is not None:
            raise ValueError(f"op {self.op!r} takes no value")
        if self.op not in ("in", "not_in", "is_null", "is_not_null") and (
            self.value is None or isinstance(self.value, (list, dict))
        ):
            raise ValueError(f"op {self.op!r} needs a single value")
        if self.op == "like" and not isinstance(self.value, str):
            raise ValueError("op 'like' needs a text pattern")
        _json_value(self.value)
        return self


def _json_value(v: Any) -> None:
    """Refuse what a record's JSON cannot hold, so a filter never compares with it: YAML reads
    ``.nan`` and ``.inf`` as floats, ``!!binary`` as bytes."""
    if isinstance(v, list):
        for x in v:
            _json_value(x)
    elif isinstance(v, dict):
        for x in v.values():
            _json_value(x)
    elif isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"value {v} is no JSON number: compare with a number, or quote it")
    elif not isinstance(v, (str, int, float, type(None))):
        raise ValueError(f"value {v!r} is no JSON value: write it as text, a number, true, "
                         "false or null")  # fmt: skip


class SeqStart(Model):
    seq: int = Field(ge=1, description="first seq to deliver")


class TimeStart(Model):
    time: datetime = Field(description="deliver messages written at or after this time")


def _start_kind(v: Any) -> str | None:
    """Which form of start position ``v`` is; None: none, and one error says what is."""
    if isinstance(v, (SeqStart, TimeStart)):
        return "seq" if isinstance(v, SeqStart) else "time"
    if isinstance(v, str):
        return "word" if v in ("beginning", "end") else None
    if isinstance(v, dict) and len(v) == 1 and next(iter(v)) in ("seq", "time"):
        return str(next(iter(v)))
    return None


StartPosition = Annotated[
    Annotated[Literal["beginning", "end"], Tag("word")]
    | Annotated[SeqStart, Tag("seq")]
    | Annotated[TimeStart, Tag("time")],
    Discriminator(
        _start_kind,
        custom_error_type="start_position",
        custom_error_message="expected beginning, end, {seq: N} or {time: ISO-8601}",
    ),
]
Action = Literal["insert", "update", "delete", "truncate"]


class ConnectorBase(Model):
    """What every connector shares: which stream, which messages, where to start, how to batch
    and retry. The broker settings live under a key named after the ``type``.
    """

    type: str  # each connector's model narrows it to its Literal (core/registry.py)
    name: str = Field(
        pattern=r"^[A-Za-z0-9_-]{1,64}$",
        description="its position, failed list and pause are kept under it: letters, digits, "
        "`_` and `-`, up to 64",
    )
    stream: Literal["records", "events"] = Field(
        description="records: each record's newest version; events: every change"
    )
    sources: list[str] | None = Field(None, description="the sources it reads; default: all")
    collections: list[str] = Field(
        ["*"], description="patterns of the collection ids it takes (`public:orders`, `*` any text)"
    )
    actions: list[Action] | None = Field(
        None, description="the events it takes (events stream only); default: all"
    )
    start_position: StartPosition = Field(
        "beginning",
        description="where its first start begins: every retained message (records: every "
        "current record), only messages stored after it, a seq or a time; then its saved "
        "position wins",
    )
    filters: list[Filter] = Field([], description="conditions on the record that must all hold")
    batch: BatchPolicy = Field(
        BatchPolicy(),
        description="how much goes to the broker in one write: a batch leaves as soon as a "
        "write slot is free (max_in_flight), so it fills up under load and stays small when idle",
    )
    retry: RetryPolicy = Field(
        RetryPolicy(),
        description="the waits between attempts of a failed message, and between reconnects: "
        "initial, then multiplied by multiplier at each attempt, at most max, with jitter",
    )
    max_in_flight: int = Field(8, ge=1, le=256, description="batches awaiting the broker")
    max_pending: int = Field(
        8_000,
        ge=10,
        le=1_000_000,
        description="messages read ahead from the store; the default keeps 8 batches of 500 "
        "in flight (max_in_flight, batch.max_messages) with 4,000 more ready: raise it with "
        "them; each waiting message holds about 1.5 KB of memory",
    )
    shards: int = Field(
        1,
        ge=1,
        le=64,
        description="units of work the connector is split into, by a stable hash of the group "
        "key, so that it spreads over worker processes and instances (per-record order holds); "
        "each reads ahead up to max_pending and holds a store connection per source",
    )

    # Which making of a connector over the API this is (core/store/connectors.py); None for
    # the file's. Not a setting: compared with the config, so one deleted and made again under
    # its name, even alike, is another connector.
    _incarnation: int | None = PrivateAttr(None)

    @property
    def incarnation(self) -> int | None:
        return self._incarnation

    def made(self, incarnation: int) -> Self:
        """This connector as the making ``incarnation`` of it over the API."""
        c = self.model_copy()
        c._incarnation = incarnation
        return c

    @model_validator(mode="after")
    def _actions_on_events(self) -> ConnectorBase:
        if self.actions is not None and self.stream != "events":
            raise ValueError("actions: filters the events stream only")
        return self
