"""A ``weir`` Spark read's options (docs/spark.md “Reading”), read once on the driver into a
:class:`Spec` that executors get pickled."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import StructType

from core.store import Store
from core.tables import closest
from spark.typed import MODES, SourceError


@dataclass(frozen=True)
class Spec:
    """What executors need to read a source's stream: plain data, pickled by Spark."""

    store: Store
    sync_id: str
    provider: str
    stream: str
    collections: tuple[str, ...]
    actions: tuple[str, ...] | None
    partitions: int
    split: str  # hash: a record's messages in one partition; seq: ranges of seqs
    start: Any  # beginning | end | SeqStart | TimeStart
    name: str | None
    max_per_trigger: int | None
    source: str = ""  # the config's name of it
    schema: str | None = None  # the schema option: typed columns of the record (spark/typed.py)
    permissive: bool = False  # schemaMode: a value that does not fit is null, not an error
    typed: StructType | None = None  # the schema's fields, as Spark parsed them


def spec_of(options: dict[str, str]) -> Spec:
    """The spec of a reader's options, reading the config file (on the driver)."""
    from pydantic import TypeAdapter, ValidationError

    from core.config.connector import StartPosition
    from core.config.load import load_config

    # Spark's options are case-insensitive: dict() of them has the keys in lower case.
    for key in options:
        if key.lower() not in _KNOWN:
            raise SourceError(f"no option {key!r} of a weir read{closest(key, _KNOWN.values())}: "
                              "docs/spark.md lists them")  # fmt: skip
    options = {key.lower(): value for key, value in options.items()}
    path = options.get("config")
    if not path:
        raise SourceError('option "config" is required: the path of the weir YAML file')
    cfg = load_config(path, api=False)
    name = options.get("source")
    pg = [s for s in cfg.sources if name is None or s.name == name]
    if len(pg) != 1:
        names = ", ".join(s.name for s in cfg.sources)
        what = "name one of" if name is None else f"no source {name!r} among"
        raise SourceError(f'option "source": {what} the config\'s sources ({names})')
    src = pg[0]
    stream = options.get("stream", "events")
    if stream not in ("events", "records"):
        raise SourceError(f'option "stream": events or records, not {stream!r}')
    start_text = options.get("start", "beginning")
    start: Any = start_text
    if start_text.startswith("seq:"):
        start = {"seq": start_text[4:]}
    elif start_text not in ("beginning", "end"):
        start = {"time": start_text}
    try:
        start = TypeAdapter(StartPosition).validate_python(start)
    except ValidationError:
        raise SourceError(f'option "start": beginning, end, seq:N or an ISO time, not '
                          f"{start_text!r}") from None  # fmt: skip
    split = options.get("split", "hash")
    if split not in ("hash", "seq"):
        raise SourceError(f'option "split": hash or seq, not {split!r}')
    actions = options.get("actions")
    wrong = set(_listed(actions)) - {"insert", "update", "delete", "truncate"}
    if wrong or (actions and stream != "events"):
        raise SourceError('option "actions": insert, update, delete or truncate, of the events '
                          f"stream ({', '.join(sorted(wrong)) or stream} given)")  # fmt: skip
    schema = options.get("schema")
    if schema is not None and not schema.strip():
        raise SourceError('option "schema": a Spark DDL schema ("id BIGINT, total DECIMAL(10,2)")')
    mode = options.get("schemamode", "failfast").lower()
    if mode not in MODES:
        raise SourceError(f'option "schemaMode": failfast or permissive, not {mode!r}')
    return Spec(
        store=Store(cfg.store_url, cfg.store.schema_),
        sync_id=str(src.sync_id),
        provider=src.provider,
        stream=stream,
        collections=tuple(_listed(options.get("collections")) or ("*",)),
        actions=tuple(_listed(actions)) if actions else None,
        partitions=_positive(options, "partitions", MOST_PARTITIONS) or 2,
        split=split,
        start=start,
        name=options.get("name"),
        max_per_trigger=_positive(options, "maxMessagesPerTrigger"),
        source=src.name,
        schema=schema,
        permissive=mode == "permissive",
    )


MOST_PARTITIONS = 10_000  # read tasks a micro-batch: the planner makes a bucket each

# The options of a weir read (docs/spark.md “Reading”), by their lower-case names.
_KNOWN = {o.lower(): o for o in ("config", "source", "stream", "collections", "actions", "start",
                                  "partitions", "split", "maxMessagesPerTrigger", "name",
                                  "schema", "schemaMode")}  # fmt: skip


def _listed(text: str | None) -> list[str]:
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def _positive(options: dict[str, str], key: str, most: int | None = None) -> int | None:
    text = options.get(key.lower())
    if text is None:
        return None
    if not (text.isascii() and text.isdigit()) or int(text) < 1:
        raise SourceError(f'option "{key}": a whole number of at least 1, not {text!r}')
    if most is not None and int(text) > most:
        raise SourceError(f'option "{key}": {most} at most, not {text}')
    return int(text)
