"""What every connector's config shares (docs/configuration.md “Keys”, `connectors`): its stream and
selection, start position, steps, batching and retries. Each connector package's model extends
:class:`ConnectorBase` with its broker's settings.
"""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Self

from pydantic import Discriminator, Field, PrivateAttr, Tag, field_validator, model_validator

from core.config.base import Duration, Model
from core.config.steps import RouteField, Step, check_steps
from core.envelope import iso_time
from core.redact import said

if TYPE_CHECKING:
    from core.templates import Template


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
        """Seconds to wait before attempt ``attempt + 1``; ``rand`` is uniform in [0, 1). The
        growth stops at ``max`` for ever: a destination down for hours retries at ``max`` (the
        power itself overflowed a float after 1,024 doublings: found by an outside tryout)."""
        initial, most = self.initial.total_seconds(), self.max.total_seconds()
        if initial <= 0.0 or initial >= most or self.multiplier == 1.0:
            base = min(initial, most)
        else:  # past the power that reaches max, max: the power is not computed
            reaches = math.log(most / initial, self.multiplier)
            base = most if attempt - 1 >= reaches else initial * self.multiplier ** (attempt - 1)
        return min(base, most) * (1 - self.jitter + 2 * self.jitter * rand)


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
            raise ValueError(said("op %r needs a list value", self.op))
        if self.op in ("is_null", "is_not_null") and self.value is not None:
            raise ValueError(said("op %r takes no value", self.op))
        if self.op not in ("in", "not_in", "is_null", "is_not_null") and (
            self.value is None or isinstance(self.value, (list, dict))
        ):
            raise ValueError(said("op %r needs a single value", self.op))
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
        raise ValueError(said("value %s is no JSON number: compare with a number, or quote it", v))
    elif not isinstance(v, (str, int, float, type(None))):
        raise ValueError(
            said("value %r is no JSON value: write it as text, a number, true, false or null", v)
        )


class SeqStart(Model):
    seq: int = Field(ge=1, description="first seq to deliver")


class TimeStart(Model):
    time: datetime = Field(description="deliver messages written at or after this time")

    @field_validator("time", mode="before")
    @classmethod
    def _iso(cls, v: Any) -> Any:
        """ISO 8601 text (or YAML's timestamp) only, read as ``iso_time`` reads it: pydantic
        reads a number, or digits, as seconds since 1970 (``100``, a seq meant, began in 1970)
        and refuses the ``+00`` Postgres writes."""
        if isinstance(v, date):
            return v
        if isinstance(v, str) and (at := iso_time(v)) is not None:
            return at
        raise ValueError("an ISO 8601 time, such as 2026-01-31T12:00:00Z")

    @property
    def utc(self) -> datetime:
        """The time; one without an offset is UTC (not the store session's time zone)."""
        return self.time if self.time.tzinfo is not None else self.time.replace(tzinfo=UTC)


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
        "current record), only messages stored after it, a seq or a time (one in events "
        "retention deleted begins at the first kept, with a warning); then its saved position "
        "wins",
    )
    filters: list[Filter] = Field([], description="conditions on the record that must all hold")
    steps: list[Step] = Field(
        [],
        description="filter, transform and route, in order, on each message before it is sent "
        "(docs/transforms.md)",
    )
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
    # Each source's [events seq, records seq] when it was made over the API: where its
    # start_position end starts (None: where its first start finds the streams).
    _heads: dict[str, list[int]] | None = PrivateAttr(None)
    # The same of each source a change over the API added, at the change: read from there on.
    _added: dict[str, list[int]] | None = PrivateAttr(None)

    @property
    def incarnation(self) -> int | None:
        return self._incarnation

    def made(self, incarnation: int, heads: dict[str, list[int]] | None = None,
             added: dict[str, list[int]] | None = None) -> Self:  # fmt: skip
        """This connector as the making ``incarnation`` of it over the API, made when its
        sources' streams ended at ``heads``; ``added``: where those of the sources changes
        added ended at the change."""
        c = self.model_copy()
        c._incarnation, c._heads, c._added = incarnation, heads, added
        return c

    def head_when_made(self, sync_id: str) -> int | None:
        """Where the source's stream ended when the connector was made over the API."""
        return self._head(self._heads, sync_id)

    def added_at(self, sync_id: str) -> int | None:
        """The seq the source's stream had reached when a change over the API last added the
        source to the connector (a change applies from there on); None when none did."""
        return self._head(self._added, sync_id)

    def _head(self, heads: dict[str, list[int]] | None, sync_id: str) -> int | None:
        got = (heads or {}).get(sync_id)
        return None if got is None else got[0 if self.stream == "events" else 1]

    # The route fields the connector's type takes in its steps (core/config/steps.py).
    ROUTES: ClassVar[dict[str, RouteField]] = {}

    def places(self) -> Template | None:
        """The template of the places it sends to, made per message (a Kafka topic, an SQS
        queue: core/templates.py), which its sink and ``weir transform test`` render; None
        for a connector whose place is its config's."""
        return None

    @model_validator(mode="after")
    def _actions_on_events(self) -> ConnectorBase:
        if self.actions is not None and self.stream != "events":
            raise ValueError("actions: filters the events stream only")
        check_steps(self.steps, self.ROUTES, f"a {self.type} connector")
        return self
