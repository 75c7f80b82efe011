"""Config building blocks shared by core and every connector package
(docs/configuration.md “The config file”).

Connector packages import these to declare their settings; ``core.config.model`` assembles the file.
"""

from __future__ import annotations

import os
import re
import stat
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Self, get_args
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    SecretStr,
    WithJsonSchema,
    model_validator,
)

from core.redact import Said, said
from core.tables import parse_table, table_name

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_LONGEST = 999_999 * 86400.0  # seconds: timedelta ends at 999,999,999 days; this is plenty


def _duration(v: Any) -> Any:
    """``7d``, ``12h``, ``30m``, ``10s``, ``250ms`` or a number of seconds."""
    if isinstance(v, str):
        m = _DURATION.match(v)
        if not m:
            raise ValueError("expected a duration like 250ms, 10s, 30m, 12h or 7d")
        v = float(m.group(1)) * _UNITS[m.group(2)]
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if not 0 <= v <= _LONGEST:  # (also NaN) beyond it timedelta overflows
            raise ValueError(
                said("expected a duration from 0 to %sd", format(_LONGEST // 86400, ".0f"))
            )
        return timedelta(seconds=v)
    return v


def duration_text(v: timedelta) -> str:
    """A duration as the config writes it, in the largest unit it is a whole number of (``7d``,
    ``12h``, ``30s``, ``1500ms``; less than a millisecond: ``0.5ms``): what the API shows of a
    config can be sent back as it is."""
    us = v // timedelta(microseconds=1)
    if us == 0:
        return "0s"
    for unit in ("d", "h", "m", "s", "ms"):
        step = round(_UNITS[unit] * 1_000_000)
        if us % step == 0:
            return f"{us // step}{unit}"
    return f"{us / 1000}ms"


Duration = Annotated[
    timedelta,
    BeforeValidator(_duration),
    PlainSerializer(duration_text, return_type=str, when_used="json"),
    # as the config writes it, not pydantic's ISO 8601 (which _duration refuses)
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": _DURATION.pattern},
                {"type": "number", "minimum": 0, "maximum": _LONGEST},
            ]
        }
    ),
]


def _no_nul(v: str) -> str:
    if "\x00" in v:
        raise ValueError("must not contain the NUL character (Postgres cannot store it)")
    return v


Text = Annotated[str, AfterValidator(_no_nul)]
# schema.table, in the one spelling of core.tables, so that names compare equal as text
TableName = Annotated[str, AfterValidator(lambda t: table_name(*parse_table(t)))]


def tag_of(model: type[BaseModel], field: str) -> str:
    """The one value a union member's discriminator ``field`` (a ``Literal``) may take: a
    connector's ``type``, a source's ``kind``."""
    return str(get_args(model.model_fields[field].annotation)[0])


def check_pair(model: BaseModel, a: str, b: str) -> None:
    """A config validator: fields ``a`` and ``b`` are both given or both left out."""
    if (getattr(model, a) is None) != (getattr(model, b) is None):
        raise ValueError(said("%s and %s go together", Said(a), Said(b)))  # keys: Weir's words


def check_http_url(v: str, example: str) -> str:
    """A config validator: an http:// or https:// URL with a host and a numeric port, if any
    (``example`` shows one): one that cannot be parsed was taken, and retried for ever as if
    the receiver were away (found by an outside tryout)."""
    if not v.startswith(("https://", "http://")):
        raise ValueError(said("expected an http:// or https:// URL, like %s", Said(example)))
    try:
        parts = urlsplit(v)
        parts.port  # noqa: B018 (it raises when the port is not a number)
    except ValueError as e:
        raise ValueError(said("not a URL (%s), expected one like %s", e, Said(example))) from None
    if not parts.hostname:
        raise ValueError(said("the URL has no host, expected one like %s", Said(example)))
    return v


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="after")
    def _no_nul(self) -> Self:
        """No setting holds a NUL character: Postgres keeps none in text (a connector or
        consumer made over the API is kept there). Nested models checked themselves."""
        for name in type(self).model_fields:
            stack = [getattr(self, name)]
            while stack:
                v = stack.pop()
                if isinstance(v, SecretStr):
                    v = v.get_secret_value()
                if isinstance(v, str) and "\x00" in v:
                    raise ValueError(
                        said(
                            "%s: holds a NUL character (\\u0000), which no setting may", Said(name)
                        )
                    )
                if isinstance(v, dict):
                    stack += [*v.keys(), *v.values()]
                elif isinstance(v, (list, tuple)):
                    stack += v
        return self


def _readable(path: Path) -> Path:
    """A file the config names (a CA, a key, credentials) is one this process can read: said
    at load with its key, not at each connect as a server that cannot be reached. Looked at,
    not opened: opening a FIFO waits for a writer, and held the API and every connector (found
    by an outside tryout). ``~`` is the user's home; a relative path is the working
    directory's."""
    if not str(path).strip() or str(path) == ".":
        raise ValueError("is empty: give a file's path")
    try:
        path = path.expanduser()
    except RuntimeError:  # "~name" for a user this machine does not have
        raise ValueError(said("cannot read %s: no home directory for its ~", path)) from None
    try:
        mode = path.stat().st_mode
    except OSError as e:
        raise ValueError(said("cannot read %s: %s", path, (e.strerror or str(e)).lower())) from None
    if not stat.S_ISREG(mode):
        kind = Said("a directory" if stat.S_ISDIR(mode) else "not a regular file")
        raise ValueError(said("cannot read %s: it is %s", path, kind))
    if not os.access(path, os.R_OK):
        raise ValueError(said("cannot read %s: permission denied", path))
    return path


ReadableFile = Annotated[Path, AfterValidator(_readable)]


class TlsFiles(Model):
    """TLS to a broker: a CA to trust and, for mutual TLS, a client certificate and key."""

    ca_file: ReadableFile | None = Field(None, description="CA certificates to trust (PEM)")
    cert_file: ReadableFile | None = Field(
        None, description="client certificate (PEM) for mutual TLS, with key_file"
    )
    key_file: ReadableFile | None = Field(None, description="the client certificate's key (PEM)")

    @model_validator(mode="after")
    def _pair(self) -> Self:
        check_pair(self, "cert_file", "key_file")
        return self
