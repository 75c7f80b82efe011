"""A connector's ``steps`` (docs/transforms.md): filter, transform and route, in order, run on
each message after it is read from the store and before it is sent. Expressions, templates and
functions are checked here, at load, so that a typo is a config error naming its key; the
engine compiles them into closures (core/steps/).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any, Self

from pydantic import (
    Discriminator,
    Field,
    JsonValue,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from core.config.base import Duration, Model
from core.redact import Said, said
from core.steps import expr, functions

STORED = {"stored": True}  # the validation context of a config the store gave back


def checks_functions(info: ValidationInfo) -> bool:
    """Whether validating imports the functions steps name: not for a config the store gave
    back (its function may be gone since: its messages then fail saying so, and Weir runs)."""
    return not (info.context or {}).get("stored")


def _templates(fields: dict[str, Any]) -> None:
    """Each text of ``fields`` parsed as a template, a wrong one refused at its key (the
    file's line, the API's ``loc``: ``route.subject``)."""
    for key, value in fields.items():
        if isinstance(value, str):
            try:
                expr.template(value)
            except ValueError as e:
                raise refusal_at((key,), said("%s", e)) from None


class FilterStep(Model):
    """Keep a message when the expression is true, drop it (and move past it) otherwise."""

    filter: str = Field(description="an expression over action, record, changes, metadata")

    @field_validator("filter")
    @classmethod
    def _expression(cls, v: str) -> str:
        expr.expression(v)  # refused with the reason (an ExpressionError is a ValueError)
        return v


class TransformSpec(Model):
    """Reshape the message: the declarative keys apply in the order listed here, or a function
    does it all."""

    keep: list[str] | None = Field(None, description="the record's fields kept (and of changes)")
    drop: list[str] = Field([], description="the record's fields dropped (and of changes)")
    rename: dict[str, str] = Field({}, description="record fields renamed, old: new")
    add: dict[str, JsonValue] = Field(
        {},
        description="fields added to the record: a value as given, or text as a template "
        "(`{metadata.table_name}`; a template of one field alone keeps its value's type)",
    )
    flatten: bool = Field(
        False,
        description="the message becomes its record alone, with `_action` (events) or "
        "`_deleted` (records) beside its fields, as Debezium's ExtractNewRecordState does",
    )
    function: str | None = Field(
        None,
        description="`module:function` in functions.dir, called with (action, record, changes, "
        "metadata); returns the new message (a dict) or None to drop it",
    )

    @field_validator("add")
    @classmethod
    def _templates(cls, v: dict[str, Any]) -> dict[str, Any]:
        _templates(v)
        return v

    @field_validator("function")
    @classmethod
    def _function(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and checks_functions(info):
            functions.load(v)
        return v

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        given = self.model_fields_set - {"function"}
        # beside a function, what does something (a config dumped and read again gives all)
        beside = {f for f in given if getattr(self, f) != type(self).model_fields[f].default}
        if self.function is not None and beside:
            raise ValueError(
                said(
                    "a function transforms alone: move %s to a transform step of its own",
                    ", ".join(sorted(beside)),
                )
            )
        if not given and self.function is None:
            raise ValueError("a transform needs keep, drop, rename, add, flatten or function")
        return self


class TransformStep(Model):
    transform: TransformSpec = Field(
        description="reshape the message: keep, drop, rename, add, flatten, or a function"
    )


class RouteStep(Model):
    """Where a message goes, per message: the connector's route fields (NATS: ``subject``, the
    subject after ``sequin-{stream}.{namespace}.``), each a template, or a function."""

    route: dict[str, str] = Field(
        description="route field: template, or function: `module:function` returning a dict "
        "of route fields"
    )

    @field_validator("route")
    @classmethod
    def _fields(cls, v: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        if not v:
            raise ValueError("a route names at least one field")
        if "function" in v:
            if len(v) > 1:
                raise ValueError("a route function decides every field alone")
            if checks_functions(info):
                functions.load(v["function"])
        else:
            _templates(v)
        return v


class EnrichSpec(Model):
    """One SQL query against the message's source database a batch: its rows joined to the
    messages by a key, each message's row put in a field of its record."""

    sql: str = Field(
        description="a SELECT taking the batch's keys, a text[], as `%(ids)s` "
        "(`… WHERE id = ANY(%(ids)s::int[])`)"
    )
    key: str = Field(description="the message's field whose value joins it to a row: a path")
    on: str = Field("id", description="the row's column that holds the key")
    into: str = Field("enrichment", description="the record's field the row goes in (null: none)")

    @field_validator("sql")
    @classmethod
    def _ids(cls, v: str) -> str:
        if "%(ids)s" not in v:
            raise ValueError("the query takes the batch's keys as %(ids)s "
                             "(… WHERE id = ANY(%(ids)s::int[]))")  # fmt: skip
        return v

    @field_validator("key")
    @classmethod
    def _path(cls, v: str) -> str:
        expr.path(v)
        return v


class EnrichStep(Model):
    enrich: EnrichSpec = Field(
        description="join a row of the source database to each message, one query a batch"
    )


def _step_kind(v: Any) -> str | None:
    """Which step ``v`` is, by its one key; None: one error says what a step is."""
    if isinstance(v, (FilterStep, TransformStep, RouteStep, EnrichStep)):
        return next(iter(type(v).model_fields))
    if isinstance(v, dict) and len(v) == 1 and next(iter(v)) in KINDS:
        return str(next(iter(v)))
    return None


KINDS = ("filter", "transform", "route", "enrich")
Step = Annotated[
    Annotated[FilterStep, Tag("filter")]
    | Annotated[TransformStep, Tag("transform")]
    | Annotated[RouteStep, Tag("route")]
    | Annotated[EnrichStep, Tag("enrich")],
    Discriminator(
        _step_kind,
        custom_error_type="step",
        custom_error_message="a step is one of filter: EXPRESSION, transform: {…}, route: {…}, "
        "enrich: {…}",
    ),
]


class FunctionsConfig(Model):
    """Where the steps' functions are loaded from, and how long one may run."""

    dir: str | None = Field(
        None,
        description="the directory of the modules steps name (`module:function`); relative to "
        "the config file's directory",
    )
    timeout: Duration = Field(
        timedelta(seconds=1),
        description="how long one call may run before its message goes to the failed list",
    )


@dataclass(frozen=True)
class RouteField:
    """A route field a connector takes: how a template's field value is written into it, and
    what a whole value must be (raises ValueError)."""

    escape: Callable[[str], str]
    check: Callable[[str], None]


def flat_before(steps: list[Step]) -> list[bool]:
    """Whether the message is its record alone (after a ``flatten``) before each step, and
    after the last. A function's transform is taken to give back a whole message."""
    flat, out = False, []
    for step in steps:
        out.append(flat)
        if isinstance(step, TransformStep):
            flat = step.transform.function is None and step.transform.flatten
    return [*out, flat]


def check_steps(steps: list[Step], fields: dict[str, RouteField], connector: str) -> None:
    """Refuse what ``steps`` cannot do in the ``connector`` (``a nats connector``) that takes
    the route ``fields`` (none: no route step), at the step's place: the config's error names
    its line (``connectors[0].steps[1].route.subject``), the API's 422 its key."""
    _after_flatten(steps)
    _routes(steps, fields, Said(connector))


def refusal_at(at: tuple[int | str, ...], why: Said) -> ValidationError:
    """A model validator's refusal at a place below its model (``("steps", 1, "route")``), so
    that the file's error names that line and the API's 422 that key."""
    return ValidationError.from_exception_data("config", [InitErrorDetails(
        type=PydanticCustomError("value_error", "{error}", {"error": why}), loc=at,
        input=None)])  # fmt: skip


def _after_flatten(steps: list[Step]) -> None:
    """Refuse a declarative transform after a flatten: the message is its record then, with no
    ``record`` of its own to keep, drop or rename fields of (it did nothing, silently)."""
    for i, (step, flat) in enumerate(zip(steps, flat_before(steps), strict=False)):
        if isinstance(step, TransformStep) and step.transform.function is None and flat:
            raise refusal_at(("steps", i, "transform"), said(
                "after a flatten the message is the record: put this transform before the "
                "flatten (filters read message.x)"))  # fmt: skip


def _routes(steps: list[Step], fields: dict[str, RouteField], connector: Said) -> None:
    """Refuse route fields the connector does not take (``fields`` empty: any route), and
    a route field's literal text its place cannot hold."""
    for i, step in enumerate(steps):
        if not isinstance(step, RouteStep):
            continue
        if not fields:
            raise refusal_at(("steps", i, "route"), said(
                "%s takes no route step: its messages have one place (filter, transform and "
                "enrich only)", connector))  # fmt: skip
        wrong = sorted(set(step.route) - {*fields, "function"})
        if wrong:
            raise refusal_at(("steps", i, "route", wrong[0]), said(
                "%s takes %s in a route, not %s", connector, Said(", ".join(fields)),
                ", ".join(wrong)))  # fmt: skip
        for name, text in step.route.items():
            if name in fields:  # a sample of what it makes: its literal text must fit
                pieces, _ = expr.template(text)
                try:
                    fields[name].check("x".join(pieces))
                except ValueError as e:
                    raise refusal_at(("steps", i, "route", name), said("%r: %s", text, e)) from None
