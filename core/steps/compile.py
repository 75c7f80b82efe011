"""A connector's steps compiled into plain functions of the message (docs/transforms.md): each
takes the message (a dict, as JSON reads the payload) and the route so far, and returns the
message to go on with, or None to drop it. Built once when a session starts.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.config.steps import (
    EnrichSpec,
    EnrichStep,
    FilterStep,
    RouteField,
    RouteStep,
    Step,
    TransformSpec,
    TransformStep,
    flat_before,
)
from core.engine.sink import FatalError
from core.redact import said
from core.steps import expr, functions
from core.steps.payload import dump, load

Msg = dict[str, Any]
Route = dict[str, str]
Run = Callable[[Msg, Route], Msg | None]


class StepFailed(FatalError):
    """A message its steps could not make: it goes to the failed list at once."""


class StepError(Exception):
    """What a step made of a message that cannot be sent (a function's wrong answer, a route
    field missing): the message goes to the failed list with it."""


@dataclass(frozen=True, slots=True)
class Compiled:
    """One step: its name in errors (``steps[1] transform``), whether it calls a user's
    function, and the function of (message, route)."""

    name: str
    calls_user: bool
    changes_payload: bool
    run: Run


@dataclass(frozen=True, slots=True)
class EnrichAt:
    """An enrich step and its name: it runs on a whole batch (core/steps/enrich.py); ``flat``:
    after a flatten, the message is the record its row goes in."""

    name: str
    spec: EnrichSpec
    flat: bool


def compile_steps(
    steps: list[Step], routes: dict[str, RouteField], records: bool
) -> list[Compiled | EnrichAt]:
    out: list[Compiled | EnrichAt] = []
    flat = flat_before(steps)
    for i, step in enumerate(steps):
        if isinstance(step, FilterStep):
            out.append(Compiled(f"steps[{i}] filter", False, False, _filter(step.filter)))
        elif isinstance(step, TransformStep):
            spec = step.transform
            run = _function(spec.function) if spec.function else _transform(spec, records)
            out.append(Compiled(f"steps[{i}] transform", bool(spec.function), True, run))
        elif isinstance(step, RouteStep):
            fn = step.route.get("function")
            run = _route_function(fn, routes) if fn else _route(step.route, routes)
            out.append(Compiled(f"steps[{i}] route", bool(fn), False, run))
        elif isinstance(step, EnrichStep):
            out.append(EnrichAt(f"steps[{i}] enrich", step.enrich, flat[i]))
    return out


def parts(msg: Msg) -> tuple[Any, Any, Any, Any]:
    return msg.get("action"), msg.get("record"), msg.get("changes"), msg.get("metadata")


def _filter(text: str) -> Run:
    test = expr.expression(text)

    def run(msg: Msg, route: Route) -> Msg | None:
        return msg if test(*parts(msg), msg) else None

    return run


def render(text: str, escape: Callable[[str], str] | None = None) -> Callable[[Msg], Any]:
    """A template as a function of the message. Text with fields: each field's value as text
    (``escape``d; a missing field is an error when ``escape`` is given, else empty text). A
    template that is one field alone, without ``escape``: the field's value as it is."""
    pieces, fields = expr.template(text)
    if escape is None and len(fields) == 1 and pieces == ["", ""]:
        only = fields[0]
        return lambda msg: only(*parts(msg), msg)

    def run(msg: Msg) -> str:
        out = [pieces[0]]
        for field, piece in zip(fields, pieces[1:], strict=True):
            v = field(*parts(msg), msg)
            if escape is None:
                out.append("" if v is None else v if type(v) is str else expr.text_of(v))
            elif v is None:
                raise StepError(said("%r: a field is missing or null", text))
            else:
                out.append(escape(v if type(v) is str else expr.text_of(v)))
            out.append(piece)
        return "".join(out)

    return run


def _transform(spec: TransformSpec, records: bool) -> Run:
    keep, drop, rename = spec.keep, frozenset(spec.drop), spec.rename
    adds = [(name, render(v) if isinstance(v, str) else (lambda msg, v=v: v))
            for name, v in spec.add.items()]  # fmt: skip
    marker = "_deleted" if records else "_action"

    def run(msg: Msg, route: Route) -> Msg | None:
        for part in ("record", "changes"):
            d = msg.get(part)
            if type(d) is dict:
                if keep is not None:
                    d = {k: d[k] for k in keep if k in d}
                if drop:
                    d = {k: v for k, v in d.items() if k not in drop}
                if rename:  # a field renamed onto another's name replaces it
                    moved = {rename[k]: v for k, v in d.items() if k in rename}
                    d = {k: v for k, v in d.items() if k not in rename and k not in moved}
                    d.update(moved)
                msg[part] = d
        record = msg.get("record")
        if adds and type(record) is dict:
            for name, value in adds:
                v = value(msg)  # a list or object a copy: a message's own, never in itself
                record[name] = copy.deepcopy(v) if type(v) in (dict, list) else v
        if spec.flatten:
            flat = dict(record) if type(record) is dict else {}
            meta = msg.get("metadata")
            flat[marker] = (meta.get("deleted") if type(meta) is dict else None) if records \
                else msg.get("action")  # fmt: skip
            return flat
        return msg

    return run


def _function(spec: str) -> Run:
    fn = functions.Loaded(spec)

    def run(msg: Msg, route: Route) -> Msg | None:
        out = fn()(*parts(msg))
        if out is None:
            return None
        if not isinstance(out, dict):
            raise StepError(said("%s returned %s, not a dict or None", spec, type(out).__name__))
        made: Msg = load(dump(out))  # JSON's own values: an OrderedDict's or a defaultdict's
        return made  # fields are read as a dict's, and numbers stay as they were read

    return run


def _route(fields: dict[str, str], routes: dict[str, RouteField]) -> Run:
    made = [(name, render(text, routes[name].escape)) for name, text in fields.items()]

    def run(msg: Msg, route: Route) -> Msg | None:
        for name, value in made:
            route[name] = value(msg)
        return msg

    return run


def _route_function(spec: str, routes: dict[str, RouteField]) -> Run:
    fn = functions.Loaded(spec)

    def run(msg: Msg, route: Route) -> Msg | None:
        out = fn()(*parts(msg))
        if not isinstance(out, dict):  # an OrderedDict too
            raise StepError(
                said("%s returned %s, not a dict of route fields", spec, type(out).__name__)
            )
        for name, value in out.items():
            field = routes.get(name)
            if field is None:
                raise StepError(
                    said(
                        "%s returned the route field %r; this connector takes %s",
                        spec,
                        name,
                        ", ".join(routes),
                    )
                )
            if type(value) is not str:
                raise StepError(said("%s returned %s: %r, not text", spec, name, value))
            field.check(value)
            route[name] = value
        return msg

    return run
