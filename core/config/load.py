"""Reading the YAML config file: ${VAR} substitution, then the models of core/config/model.py,
with errors that name the file, line and key path of every problem
(docs/configuration.md “The config file”).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import ValidationError

from core.config.base import tag_of
from core.config.model import WeirConfig
from core.redact import Said, masked, own, raw_secrets, redact, remember, remember_config, said
from core.registry import connector_specs
from core.steps import functions


class ConfigError(Exception):
    """A config file is invalid; ``str()`` lists every problem as ``file:line: key: message``."""

    def __init__(self, path: Path | str, problems: list[str]) -> None:
        self.path = str(path)
        self.problems = problems
        super().__init__("\n".join(f"{self.path}:{p}" for p in problems))


# -- YAML with line numbers and ${VAR} substitution -------------------------------------------

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
Lines = dict[tuple[str | int, ...], int]


class _Loader(yaml.SafeLoader):
    """YAML 1.2's core schema for plain scalars: ``true``/``false`` are booleans, numbers are
    decimal, and ``yes``, ``no``, ``on``, ``off``, ``010``, ``0x1F``, ``1:30`` and
    ``2026-11-22`` stay text (YAML 1.1 reads them as booleans, octal, hex, base 60 and dates: a
    filter's ``value: NO`` compared with false, its ``value: 010`` with 8). Models parse
    booleans, numbers and times from text where they expect them."""


_RESOLVED = ("bool", "int", "float", "timestamp")
_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag.rpartition(":")[2] not in _RESOLVED]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
for _tag, _rx, _first in (
    ("bool", r"true|True|TRUE|false|False|FALSE", "tTfF"),
    ("int", r"[-+]?(?:0|[1-9][0-9]*)", "-+0123456789"),
    ("float", r"[-+]?(?:(?:0|[1-9][0-9]*)(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
     r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN)", "-+0123456789."),
):  # fmt: skip
    _Loader.add_implicit_resolver(f"tag:yaml.org,2002:{_tag}", re.compile(f"^(?:{_rx})$"),
                                  list(_first))  # fmt: skip
_SCALARS = _Loader("")


Errors = list[tuple[tuple[str | int, ...], str]]  # where, and the line to print


def _to_python(node: yaml.Node, path: tuple[str | int, ...], lines: Lines, errs: Errors) -> Any:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for k, v in node.value:
            key = str(k.value)
            lines[(*path, key)] = k.start_mark.line + 1
            if key in out:
                errs.append(
                    (path, f"{k.start_mark.line + 1}: {_dotted((*path, key))}: duplicate key")
                )
            out[key] = _to_python(v, (*path, key), lines, errs)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(v, (*path, i), lines, errs) for i, v in enumerate(node.value)]
    assert isinstance(node, yaml.ScalarNode)
    value = _SCALARS.construct_object(node)  # resolves int, bool, null, ... as YAML does
    if isinstance(value, str) and "${" in value:

        def sub(m: re.Match[str]) -> str:
            found = os.environ.get(m.group(1))
            if found is not None:
                return found
            if m.group(2) is not None:
                return m.group(2)
            errs.append((path, f"{node.start_mark.line + 1}: {_dotted(path)}: environment "
                         f"variable {m.group(1)} is not set (write ${{{m.group(1)}:-default}} for "
                         "a default)"))  # fmt: skip
            return ""

        return _VAR.sub(sub, value)  # substituted text stays text; pydantic converts it
    return value


def _dotted(path: tuple[str | int, ...]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top)"


def without_tags(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """An error's location without the tags pydantic puts after a discriminated union's place
    (no key of the file or of an API body): a source's or a connector's kind after
    ``sources[i]``, ``connectors[i]`` or a connector body's ``body``; and the tag of a union
    whose tag is the key it holds, before that key (a step's kind, a start position's
    ``seq`` or ``time``: ``steps[1].filter``, not ``steps[1].filter.filter``)."""
    out = list(loc)
    if len(out) > 2 and out[0] in ("sources", "connectors") and isinstance(out[1], int):
        del out[2]
    elif len(out) > 2 and out[0] == "body" and out[1] in {c.type for c in connector_specs()}:
        del out[1]
    return tuple(p for i, p in enumerate(out) if i + 1 == len(out) or out[i + 1] != p)


def _line_of(loc: tuple[str | int, ...], lines: Lines, data: Any) -> tuple[int, tuple[Any, ...]]:
    """The YAML line of a pydantic error location (whose union tags we drop)."""
    path: list[str | int] = []
    node = data
    for part in loc:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            continue  # a union tag (e.g. 'postgres') or a missing key: stay on the parent
        path.append(part)
    while tuple(path) not in lines and path:
        path.pop()
    return lines.get(tuple(path), 1), tuple(path)


def _tags(loc: tuple[str | int, ...], disc: str) -> list[str]:
    """The values ``disc`` may take in the list field ``loc[0]`` of the config (a union of
    models told apart by it: sources by ``kind``, connectors by ``type``)."""
    (item,) = get_args(WeirConfig.model_fields[str(loc[0])].annotation)
    return sorted(tag_of(m, disc) for m in get_args(get_args(item)[0]))


# What a command that does not serve the API reads instead of the file's ``api:`` (so that its
# variables, the tokens, need not be set where ``weir status`` runs).
_API_UNREAD = {"listen": "127.0.0.1:0", "tokens": ["not-read-by-this-command"]}


def use_functions_dir(path: Path, data: dict[str, Any]) -> None:
    """The functions' directory, relative to the config file's, for the steps' checks (which
    import them) and their runs; before the config is validated."""
    given = data.get("functions")
    where = given.get("dir") if isinstance(given, dict) else None
    functions.use_dir((path.parent / where).resolve() if isinstance(where, str) else None)


def error_text(err: Any, also: list[str] | None = None) -> str:
    """A pydantic error's message as Weir says it (the file's and the API's refusals): a
    validator's own sentence (a :class:`~core.redact.Said`, its values masked each on its
    own); or pydantic's words with what the models put in them (the allowed values, the tags)
    as written and only what the input put in them masked, by the secrets known and ``also``'s
    forms (a password ``events`` read ``Input should be 'records' or '***'``: a tryout). A
    validator's other errors (a library's) are masked whole."""
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "value_error":
        own_text = own(err.get("ctx", {}).get("error"))
        return own_text if own_text is not None else masked(redact(msg), also or [])
    why = err.get("ctx", {}).get("error")  # a parser's reason (json_invalid's, say): the input's
    if why is not None and str(why) not in msg:
        msg = f"{msg}: {why}"
    values = (err.get("input"), err.get("ctx", {}).get("tag"), why)
    given = {str(v) for v in values if isinstance(v, (str, int, float, Exception))
             and not isinstance(v, bool) and str(v)}  # fmt: skip
    if not given:
        return Said(msg)
    parts = re.split("(" + "|".join(map(re.escape, sorted(given, key=len, reverse=True))) + ")",
                     msg)  # fmt: skip
    template = "".join(p.replace("%", "%%") if i % 2 == 0 else "%s" for i, p in enumerate(parts))
    return said(template, *(masked(p, also or []) for p in parts[1::2]))


def load_config(path: str | Path, *, api: bool = True) -> WeirConfig:
    """Read and validate a config file; raises :class:`ConfigError` listing every problem.
    ``api=False``: the ``api:`` section is not read (a command that does not serve it)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(path, [f"0: cannot read the file: {e.strerror}"]) from None
    try:
        root = yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark else 1
        raise ConfigError(path, [f"{line}: invalid YAML: {getattr(e, 'problem', e)}"]) from None
    lines: Lines = {}
    errs: Errors = []
    data = _to_python(root, (), lines, errs) if root is not None else {}
    if not api:
        errs = [(where, e) for where, e in errs if where[:1] != ("api",)]
    if errs:
        raise ConfigError(path, [e for _, e in errs])
    if not isinstance(data, dict):
        raise ConfigError(path, ["1: the file must be a mapping (store:, sources:, ...)"])
    if not api and "api" in data:
        data["api"] = _API_UNREAD
    use_functions_dir(path, data)
    # Its secrets are known before the validators run: a validator's message (core/redact.py
    # said()) masks each value it quotes as it is made, and its words are printed as written.
    remember(raw_secrets(data, WeirConfig))
    try:
        cfg = WeirConfig.model_validate(data)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            loc = without_tags(tuple(err["loc"]))
            line, where = _line_of(loc, lines, data)
            rest = [p for p in loc[len(where) :] if p not in where]
            key = _dotted((*where, *rest)) if err["loc"] else "(top)"
            msg = error_text(err)
            if err["type"] == "extra_forbidden":
                msg = "unknown key"
            elif err["type"] == "union_tag_not_found":  # e.g. a connector without type:
                disc = str(err.get("ctx", {}).get("discriminator", "")).strip("'")
                msg = f"{disc}: is required (one of {', '.join(_tags(loc, disc))})"
            problems.append(f"{line}: {key}: {redact(msg)}")  # the file's path and keys as written
        raise ConfigError(path, problems) from None
    remember_config(cfg)
    return cfg
