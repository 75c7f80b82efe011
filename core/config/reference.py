"""docs/configuration.md “Keys”: every key of the config file with its type, default and
description, written from the config models (their ``Field(description=...)``) between the
page's markers. ``python -m core.config.schema`` rewrites it with the JSON Schema.
"""

from __future__ import annotations

import inspect
import json
import types
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ByteSize, JsonValue, SecretStr, TypeAdapter
from pydantic.fields import FieldInfo

from core.config.base import TableName, tag_of
from core.config.model import WeirConfig
from core.redact import said

PAGE = Path(__file__).parents[2] / "docs" / "configuration.md"
BEGIN = "<!-- generated from the config models by python -m core.config.schema: edit those -->"
END = "<!-- end of the generated part -->"

# What the page calls a type, by the annotation; TableName before the str it annotates.
NAMES: tuple[tuple[Any, str], ...] = (
    (TableName, "schema.table"),
    (str, "text"),
    (int, "integer"),
    (float, "number"),
    (bool, "boolean"),
    (timedelta, "duration"),
    (ByteSize, "size"),
    (SecretStr, "secret"),
    (Path, "file"),
    (datetime, "ISO-8601"),
    (uuid.UUID, "UUID"),
    (Any, "any"),
    (JsonValue, "JSON"),
)


def type_text(t: Any) -> str:
    """A type as YAML writes it: ``[text]``, ``{schema.table: text}``, ``stop | fail``."""
    for known, name in NAMES:
        if t == known:
            return name
    origin, args = get_origin(t), get_args(t)
    if origin is Annotated:
        return type_text(args[0])
    if origin is Literal:
        return " | ".join(map(str, args))
    if origin in (Union, types.UnionType):
        return " | ".join(type_text(a) for a in args if a is not type(None))
    if origin is list:
        return f"[{type_text(args[0])}]"
    if origin is dict:
        return f"{{{type_text(args[0])}: {type_text(args[1])}}}"
    if isinstance(t, type) and issubclass(t, BaseModel):  # an alternative of a union
        keys = (f"{n}: {type_text(f.annotation)}" for n, f in t.model_fields.items())
        return "{" + ", ".join(keys) + "}"
    raise TypeError(said("the page has no name for the type %r", t))


def models(t: Any) -> list[type[BaseModel]]:
    """The models a key of type ``t`` holds (each a union's member), when it holds nothing
    else: their keys are nested under it."""
    origin, args = get_origin(t), get_args(t)
    if origin in (Annotated, list):
        return models(args[0])
    if origin in (Union, types.UnionType):
        found = [models(a) for a in args if a is not type(None)]
        return [m for ms in found for m in ms] if all(found) else []
    return [t] if isinstance(t, type) and issubclass(t, BaseModel) else []


def tag(model: type[BaseModel]) -> str:
    """The key that tells a union's member from the others: the one it fixes to one value."""
    return next(
        name
        for name, f in model.model_fields.items()
        if get_origin(f.annotation) is Literal and len(get_args(f.annotation)) == 1
    )


def _bounds(f: FieldInfo) -> str:
    """``Field(ge=..., le=...)``: pydantic keeps them as annotated_types' Ge and Le."""
    low, high = (next((getattr(m, b) for m in f.metadata if hasattr(m, b)), None)
                 for b in ("ge", "le"))  # fmt: skip
    if low is not None and high is not None:
        return f" from {low:,} to {high:,}"
    return "" if low is None else f" at least {low:,}"


def _sentence(description: str | None) -> str:
    text = str(description)
    return f"{text[0].upper()}{text[1:]}."


def _default(f: FieldInfo, value: Any) -> str:
    if isinstance(value, ByteSize):
        return value.human_readable()
    v = TypeAdapter(f.rebuild_annotation()).dump_python(value, mode="json")
    return v if isinstance(v, str) else json.dumps(v)


def keys(
    model: type[BaseModel], names: list[str], given: BaseModel | None, depth: int
) -> list[str]:
    """A list item per key of ``model`` in ``names``, with the keys nested under it. ``given``
    is the model's value when its key is left out, whose values are then the defaults."""
    lines = []
    for name in names:
        f = model.model_fields[name]
        nested = models(f.annotation)
        required = given is None and f.is_required()
        if required:
            value = None
        elif given is not None:
            value = getattr(given, name)
        else:
            value = f.get_default(call_default_factory=True)
        if not nested:
            kind = type_text(f.annotation)
        else:
            kind = "[object]" if get_origin(f.annotation) is list else "object"
        about = [f"`{kind}`{_bounds(f)}"]
        if required:
            about.append("required")
        elif value is not None and not isinstance(value, BaseModel):
            about.append(f"default `{_default(f, value)}`")
        lines.append(f"{'  ' * depth}- `{f.alias or name}` ({', '.join(about)}): {f.description}")
        for m in nested:
            inner = value if isinstance(value, m) else None
            lines += keys(m, list(m.model_fields), inner, depth + 1)
    return lines


def reference() -> str:
    """The generated part: a section per top-level key, and per member of a union of models
    (sources' kinds, connectors' types) a subsection of the keys that member adds."""
    out = []
    for name, f in WeirConfig.model_fields.items():
        out += [f"### `{name}`", "", _sentence(f.description), ""]
        given = f.get_default(call_default_factory=True)
        members = models(f.annotation)
        if len(members) == 1:
            m = members[0]
            out += [*keys(m, list(m.model_fields), given if isinstance(given, m) else None, 0), ""]
            continue
        base = next(  # what every member shares is their common base's
            c
            for c in members[0].__mro__
            if issubclass(c, BaseModel) and all(issubclass(m, c) for m in members)
        )
        key = tag(members[0])
        out += [*keys(base, [n for n in base.model_fields if n != key], None, 0), ""]
        for m in members:
            own = [n for n in m.model_fields if n in inspect.get_annotations(m) and n != key]
            about = _sentence(m.model_fields[key].description)
            out += [f"#### `{key}: {tag_of(m, key)}`", "", about, "", *keys(m, own, None, 0), ""]
    return "\n".join(out)


def rewrite(page: str) -> str:
    """``page`` with the part between its markers generated anew."""
    head, begin, rest = page.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not begin or not end:
        raise ValueError(said("%s lacks the lines %s and %s", PAGE, BEGIN, END))
    return f"{head}{BEGIN}\n\n{reference()}\n{END}{tail}"
