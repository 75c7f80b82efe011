"""Table names as the config file and the command line write them
(docs/configuration.md “The config file”):
``schema.table``, with SQL-style double quotes around a name that holds a dot or a double
quote (``public."my.table"``, ``"My Schema".orders``; ``""`` inside quotes is one ``"``).
A name is taken as written, quoted or not: it is not folded to lower case.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from difflib import SequenceMatcher

from core.redact import Said, said

_PART = r'(?:"((?:[^"]|"")+)"|([^."]+))'
_TABLE = re.compile(rf"{_PART}\.{_PART}")


def parse_table(text: str) -> tuple[str, str]:
    """``(schema, table)`` of a configured table name; ValueError says how to write one."""
    m = _TABLE.fullmatch(text)
    if m is None:
        raise ValueError(
            said(
                '%r: tables are written schema.table, with "double quotes" '
                'around a name that holds a dot or a quote (public."my.table")',
                text,
            )
        )
    quoted_schema, schema, quoted_table, table = m.groups()
    return (
        schema if quoted_schema is None else quoted_schema.replace('""', '"'),
        table if quoted_table is None else quoted_table.replace('""', '"'),
    )


def table_name(schema: str, table: str) -> str:
    """How a table is written: what :func:`parse_table` reads back as ``(schema, table)``,
    quoting only a name that needs it. The one spelling config keys are compared in."""
    return ".".join(
        '"' + name.replace('"', '""') + '"' if "." in name or '"' in name else name
        for name in (schema, table)
    )


def closest(name: str, names: Iterable[str]) -> Said:
    """`` (did you mean 'X'?)`` of the name of ``names`` closest to ``name``, told as ``names``
    spell it; nothing when none is close. Compared without case (an option Spark gives in lower
    case finds its documented spelling), then with it (of ``Orders`` and ``orders``, the one
    whose case is nearer), then by the name (the same hint whatever order ``names`` has)."""
    low = name.lower()

    def nearness(n: str) -> tuple[float, float, str]:
        return (SequenceMatcher(None, low, n.lower()).ratio(),
                SequenceMatcher(None, name, n).ratio(), n)  # fmt: skip

    best = max(map(nearness, names), default=None)
    return said(" (did you mean %r?)", best[2]) if best and best[0] >= 0.6 else Said("")
