"""One test kit per connector, in ``tests/connectors/<type>/`` (the ``type:`` of its config in
the connector registry): the server its tests run against and the harness that points a
connector at it, prepares its destination and reads back what it holds
(tests/helpers/brokers.py ``Harness``). The contract suite (tests/contract/) runs every kit the
registry names, so a new connector is its package under ``connectors/`` plus its kit here
(docs/contributing.md “Adding a connector”).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import cache
from typing import Any

from core.registry import connector_specs
from tests.helpers.brokers import Harness


@dataclass(frozen=True)
class Kit:
    """A connector's test kit, named ``KIT`` in its package's ``__init__.py``.

    ``server`` starts the connector's test server on loopback (a context manager; once per
    test session, as the session fixture named ``fixture``); ``harness`` is the class that
    follows :class:`~tests.helpers.brokers.Harness` (mypy checks that it does), made from what
    the server's ``with`` gives.
    """

    server: Callable[[], AbstractContextManager[Any]]
    fixture: str
    harness: Callable[[Any], Harness]


# What a harness has, as tests/helpers/brokers.py ``Harness`` declares it.
_MEMBERS = sorted({*Harness.__annotations__, *(n for n in vars(Harness) if not n.startswith("_"))})


@cache
def kits() -> dict[str, Kit]:
    """Every registered connector type's kit; a type without one is an error that says what to
    add."""
    found: dict[str, Kit] = {}
    for spec in connector_specs():
        try:
            module = importlib.import_module(f"{__name__}.{spec.type}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{spec.type}":
                raise
            raise LookupError(
                f"connector type {spec.type!r} has no test kit: add tests/connectors/{spec.type}/"
                "__init__.py with KIT = Kit(...) (docs/contributing.md “Adding a connector”)"
            ) from None
        kit = getattr(module, "KIT", None)
        if not isinstance(kit, Kit):
            raise LookupError(
                f"tests/connectors/{spec.type}/__init__.py declares no KIT = Kit(...)"
            )
        missing = [m for m in _MEMBERS if not hasattr(kit.harness, m)]
        if missing:  # mypy says only that the class is not a Harness
            raise LookupError(f"the {spec.type} kit's harness lacks {', '.join(missing)} "
                              "(tests/helpers/brokers.py Harness)")  # fmt: skip
        found[spec.type] = kit
    return found
