"""Destination names with placeholders (Kafka topics, SQS queue URLs): one message's
``{stream}``, ``{sync_id}``, ``{provider}`` and ``{collection}``, and ``{route}``: what the
connector's route step gives (a Kafka ``topic``, an SQS ``queue``: docs/transforms.md “Route”).
"""

from __future__ import annotations

import re
from typing import Any

from core.config.steps import RouteField, RouteStep, Step, refusal_at
from core.envelope import Message
from core.ids import encode_token
from core.redact import Said, said

PLACEHOLDERS = ("stream", "sync_id", "provider", "collection", "route")
MAX_NAMES = 10_000  # names kept made: a route may give a name a tenant, without end
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


def check_template(v: str) -> str:
    """A config validator: only the known placeholders."""
    unknown = [p for p in _PLACEHOLDER.findall(v) if p not in PLACEHOLDERS]
    if unknown:
        raise ValueError(
            said("unknown placeholder {%s}; use %s", unknown[0], ", ".join(PLACEHOLDERS))
        )
    return v


def routed_field(bad: str) -> RouteField:
    """The route field that fills ``{route}``: a field value's characters that the
    destination's names cannot hold (``bad``) become ``_``, and an empty one is ``_``; a
    function's value must hold none."""
    wrong = re.compile(bad)
    allowed = Said(bad[2:-1])

    def check(value: str) -> None:
        c = wrong.search(value)
        if not value or c is not None:
            if c is None:
                raise ValueError(said("%r is empty: a name here takes %s only", value, allowed))
            raise ValueError(said("%r holds %r: a name here takes %s only", value, c.group(),
                                  allowed))  # fmt: skip

    return RouteField(lambda v: wrong.sub("_", v) or "_", check)


def check_routed(template: str, steps: list[Step], field: str, key: str) -> None:
    """A template with ``{route}`` needs a route step giving ``field`` (a function may), and
    a route step giving ``field`` needs ``{route}`` in the template (``key``, the config's),
    each refused at its place."""
    routes = [(i, s.route) for i, s in enumerate(steps) if isinstance(s, RouteStep)]
    if "{route}" in template and not any(field in r or "function" in r for _, r in routes):
        raise refusal_at(tuple(key.split(".")), said(
            "%r holds {route}: add a route step giving its %s (steps: [{route: {%s: "
            "'{record.tenant}'}}])", template, Said(field), Said(field)))  # fmt: skip
    for i, route in routes:
        if "{route}" not in template and field in route:
            raise refusal_at(("steps", i, "route", field), said(
                "a route's %s fills {route} in %s: put it there (for example %s: "
                "'orders.{route}')", Said(field), Said(key), Said(key)))  # fmt: skip


class Unrouted(ValueError):
    """A message whose route does not give the field its destination's ``{route}`` needs."""


class Template:
    """Renders a template per message; ``bad`` matches the characters the destination's names
    cannot hold, which become ``_`` in the substituted values; ``{route}`` is the message's
    route ``field`` (written by :func:`routed_field` already).
    """

    def __init__(self, template: str, stream: str, bad: str, field: str = "") -> None:
        self.template = template
        self.stream = stream
        self.bad = re.compile(bad)
        self.fixed = _PLACEHOLDER.search(template) is None
        self.field = field if "{route}" in template else ""
        self._rendered: dict[tuple[Any, ...], str] = {}  # an entry a collection (and route)

    def render(self, m: Message) -> str:
        if self.fixed:
            return self.template
        route = ""
        if self.field:
            route = (m.route or {}).get(self.field, "")
            if not route:
                raise Unrouted(said("its route gives no %s for {route} in %r", Said(self.field),
                                    self.template))  # fmt: skip
        key = (m.sync_id, m.provider, m.collection_id, route)
        name = self._rendered.get(key)
        if name is None:
            if len(self._rendered) >= MAX_NAMES:
                self._rendered.clear()
            sub = self.bad.sub
            name = self._rendered[key] = self.template.format(
                stream=self.stream, sync_id=sub("_", m.sync_id),
                provider=sub("_", encode_token(m.provider)),
                collection=sub("_", encode_token(m.collection_id)), route=route,
            )  # fmt: skip
        return name

    def pattern(self, value: str) -> re.Pattern[str]:
        """What the template renders to, with ``value`` a regex for each placeholder."""
        parts = _PLACEHOLDER.split(self.template)[::2]
        return re.compile(value.join(re.escape(p) for p in parts))
