"""Destination names with placeholders (Kafka topics, SQS queue URLs): one message's
``{stream}``, ``{sync_id}``, ``{provider}`` and ``{collection}``.
"""

from __future__ import annotations

import re

from core.envelope import Message
from core.ids import encode_token

PLACEHOLDERS = ("stream", "sync_id", "provider", "collection")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


def check_template(v: str) -> str:
    """A config validator: only the known placeholders."""
    unknown = [p for p in _PLACEHOLDER.findall(v) if p not in PLACEHOLDERS]
    if unknown:
        raise ValueError(f"unknown placeholder {{{unknown[0]}}}; use {', '.join(PLACEHOLDERS)}")
    return v


class Template:
    """Renders a template per message; ``bad`` matches the characters the destination's names
    cannot hold, which become ``_`` in the substituted values.
    """

    def __init__(self, template: str, stream: str, bad: str) -> None:
        self.template = template
        self.stream = stream
        self.bad = re.compile(bad)
        self.fixed = _PLACEHOLDER.search(template) is None
        self._rendered: dict[tuple[str, str, str], str] = {}  # one entry per collection

    def render(self, m: Message) -> str:
        if self.fixed:
            return self.template
        key = (m.sync_id, m.provider, m.collection_id)
        name = self._rendered.get(key)
        if name is None:
            sub = self.bad.sub
            name = self._rendered[key] = self.template.format(
                stream=self.stream, sync_id=sub("_", m.sync_id),
                provider=sub("_", encode_token(m.provider)),
                collection=sub("_", encode_token(m.collection_id)),
            )  # fmt: skip
        return name

    def pattern(self, value: str) -> re.Pattern[str]:
        """What the template renders to, with ``value`` a regex for each placeholder."""
        parts = _PLACEHOLDER.split(self.template)[::2]
        return re.compile(value.join(re.escape(p) for p in parts))
