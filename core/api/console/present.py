"""How the console shows numbers and states: the templates' filters, one place for each."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from core.steps.payload import dump

UNKNOWN = "\u2013"  # an en dash


def count(n: int | float | None) -> str:
    """``12 345``; a dash when unknown."""
    return UNKNOWN if n is None else f"{round(n):,}".replace(",", "\u202f")


def rate(r: float | None) -> str:
    """Messages a second, with a decimal below 10."""
    if r is None:
        return UNKNOWN
    return f"{r:.1f}/s" if r < 10 else f"{count(r)}/s"


def seconds(s: float | None) -> str:
    """A lag as a person reads it: ``0 s``, ``4.2 s``, ``3 min``, ``5.1 h``."""
    if s is None:
        return UNKNOWN
    if s < 10:
        return f"{s:.1f} s" if s else "0 s"
    if s < 120:
        return f"{s:.0f} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def size(b: int | None) -> str:
    """Bytes of WAL, binary units."""
    if b is None:
        return UNKNOWN
    value = float(b)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def tone(state: str | None) -> str:
    """The badge colour of a state: ok, busy (on its way), warn (stopped or behind), bad."""
    s = (state or "").lower()
    if s in ("streaming", "running", "delivering", "idle", "capturing", "caught up"):
        return "ok"
    if s in ("failed", "error"):
        return "bad"
    if s in ("paused", "not running", "waiting", "retrying", "reconnecting", "stopped"):
        return "warn"
    return "busy"


def connector_state(c: dict[str, Any]) -> str:
    """One state for a connector: paused, its shards' common state, or the worst of them."""
    if c.get("paused"):
        return "paused"
    states = [str(s["state"]) for s in c.get("shards", [])]
    if not states:
        return "not running"
    order = {"bad": 0, "warn": 1, "busy": 2, "ok": 3}
    return min(states, key=lambda st: order[tone(st)])


def totals(c: dict[str, Any]) -> dict[str, float]:
    """A connector's lag and rate over its shards: lags and rates add, the age is the oldest."""
    shards = c.get("shards", [])
    return {
        "lag_messages": sum(s["lag_messages"] or 0 for s in shards),
        "lag_seconds": max((s["lag_seconds"] or 0 for s in shards), default=0),
        "rate": sum(s["rate"] or 0 for s in shards),
    }


def when(at: str | datetime | None) -> str:
    """A time to the second, ``2026-11-24 16:38:45 UTC`` (the store's are UTC)."""
    if at is None:
        return UNKNOWN
    t = datetime.fromisoformat(at) if isinstance(at, str) else at
    utc = t.utcoffset() is not None and not t.utcoffset()
    return t.strftime("%Y-%m-%d %H:%M:%S") + (" UTC" if utc else "")


def shard(key: str) -> str:
    """A shard by its place in the split (``1/2``); the connector's name when it is unsplit."""
    return key.partition("#")[2] or key


def step(s: dict[str, Any]) -> str:
    """A step of a connector as one line: its kind, then its expression or its keys."""
    kind, spec = next(iter(s.items()))
    if isinstance(spec, str):
        return f"{kind}: {spec}"
    given = ", ".join(f"{k}: {dump(v).decode()}" for k, v in spec.items()
                      if v not in (None, [], {}, False))  # fmt: skip
    return f"{kind}: {given}"


FILTERS = {
    f.__name__: f
    for f in (count, rate, seconds, size, tone, connector_state, totals, shard, when, step)
}
