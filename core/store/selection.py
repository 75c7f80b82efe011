"""Message selection as SQL: collection patterns, actions and column filters (DESIGN.md section 9).

One place for it: connectors and the Consume API select messages with these clauses.
Values are always bound parameters, never spliced into the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
from psycopg import sql

from core.config.base import Action, Filter

_COMPARE = {"=": "=", "!=": "<>", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


def like_pattern(glob: str) -> str:
    """``public:*`` → ``public:%``; LIKE's own wildcards in the glob are taken literally."""
    escaped = glob.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped.replace("*", "%")


def selection(
    collections: Sequence[str],
    actions: Sequence[Action] | None,
    filters: Sequence[Filter],
    record_ids: Sequence[str] = ("*",),
    stream: str = "events",
) -> tuple[sql.Composable, list[Any]]:
    """A SQL condition (``TRUE`` when nothing filters) on a row of ``stream``, and its
    parameters. ``collections`` and ``record_ids`` are ``*`` patterns. Column filters apply
    to the ``record`` JSON: a missing field is null.
    """
    parts: list[sql.Composable] = []
    params: list[Any] = []
    # The records stream keeps a long record id whole beside its key (core/envelope.py).
    record_id = "coalesce(full_record_id, record_id)" if stream == "records" else "record_id"
    for column, patterns in (("collection_id", collections), (record_id, record_ids)):
        if "*" not in patterns:
            parts.append(sql.SQL(column + " LIKE ANY(%s)"))
            params.append([like_pattern(p) for p in patterns])
    if actions is not None:
        parts.append(sql.SQL("action = ANY(%s)"))
        params.append(list(actions))
    for f in filters:
        field = sql.SQL("(record -> {})").format(sql.Literal(f.column))
        if f.op == "is_null":
            parts.append(sql.SQL("coalesce({} = 'null'::jsonb, true)").format(field))
        elif f.op == "is_not_null":
            parts.append(sql.SQL("coalesce({} <> 'null'::jsonb, false)").format(field))
        elif f.op == "like":
            parts.append(sql.SQL("(record ->> {}) LIKE %s").format(sql.Literal(f.column)))
            params.append(f.value)
        elif f.op in ("in", "not_in"):
            test = "= ANY" if f.op == "in" else "<> ALL"
            parts.append(sql.SQL("coalesce({} " + test + "(%s::jsonb[]), false)").format(field))
            params.append([orjson.dumps(v).decode() for v in f.value])
        else:
            # jsonb compares numbers numerically and text (so ISO timestamps) as text; across
            # types jsonb has an order of its own, so a field of another type never matches.
            parts.append(
                sql.SQL(
                    "coalesce(jsonb_typeof({f}) = jsonb_typeof(%s::jsonb) AND {f} "
                    + _COMPARE[f.op]
                    + " %s::jsonb, false)"
                ).format(f=field)
            )
            value = orjson.dumps(f.value).decode()
            params += [value, value]
    if not parts:
        return sql.SQL("TRUE"), []
    return sql.SQL(" AND ").join(parts), params
