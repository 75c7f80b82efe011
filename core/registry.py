"""The connector registry: each package under ``connectors/`` declares itself in its
``__init__.py`` with one :class:`ConnectorSpec` named ``CONNECTOR``: its ``type:``, config model,
sink factory and setup command. The config's connector union, the ``weir <type> setup``
commands and the engine's sinks all come from here, so core names no connector.

A spec names its sink and setup functions as ``"module:function"`` strings, imported when first
used, so a vendor SDK loads only when a connector of its type runs.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

import connectors
from core.config.base import tag_of
from core.config.connector import ConnectorBase
from core.redact import said

if TYPE_CHECKING:
    from core.engine.sink import Sink


@dataclass(frozen=True)
class ConnectorSpec:
    """One connector type. ``sink`` is ``"module:function"`` of a ``function(config) -> Sink``;
    ``setup`` (optional) of an ``async function(config) -> list[str]`` that creates what the
    connector publishes into and says so, one line each; ``setup_help`` is its ``--help`` line.
    """

    config: type[ConnectorBase]
    sink: str
    setup: str | None = None
    setup_help: str = ""

    @property
    def type(self) -> str:
        """The ``type:`` of the YAML, from the config model's ``type: Literal[...]``."""
        return tag_of(self.config, "type")


def _load(ref: str) -> Any:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@cache
def connector_specs() -> tuple[ConnectorSpec, ...]:
    """Every ``connectors/<name>/`` package's spec, in name order."""
    found = []
    for info in pkgutil.iter_modules(connectors.__path__, "connectors."):
        spec = getattr(importlib.import_module(info.name), "CONNECTOR", None)
        if not isinstance(spec, ConnectorSpec):
            raise TypeError(said("%s declares no CONNECTOR = ConnectorSpec(...)", info.name))
        found.append(spec)
    return tuple(found)


def spec_of(type_: str) -> ConnectorSpec:
    for spec in connector_specs():
        if spec.type == type_:
            return spec
    raise KeyError(said("no connector of type %r", type_))


def make_sink(connector: ConnectorBase) -> Sink:
    """The sink of a connector config (not connected yet)."""
    factory: Callable[[Any], Sink] = _load(spec_of(connector.type).sink)
    return factory(connector)


Setup = Callable[[Any], Coroutine[Any, Any, list[str]]]


def setup_of(spec: ConnectorSpec) -> Setup:
    """The spec's setup function; only called for specs that have one."""
    assert spec.setup is not None
    setup: Setup = _load(spec.setup)
    return setup
