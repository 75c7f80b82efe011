"""Writing from Spark into an ``http`` source of Weir (docs/spark.md “Writing”): what a Spark job
computes goes out through Weir's connectors like records an API sync pushes.

    df.writeStream.format("weir").option("config", "weir.yaml").option("source", "computed")

Each task posts its rows to ``weir run``'s ingest route (``POST /v1/sources/NAME/records``) in
batches, so they pass the same checks and the same version guard as any push: a record is
stored only when its version is newer than the stored one and its data differs. A micro-batch
Spark writes again after a failure therefore stores nothing twice when its rows carry a
``version`` (a seq, a window's end: anything that grows with the data); without one, a record's
version is the time of ingest and a replay stores only what changed.

Columns: ``collection_id`` and ``record_id`` (text), ``data`` (a JSON text or a struct),
optional ``deleted`` (boolean) and ``version`` (a whole number).
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import (
    BooleanType,
    IntegralType,
    MapType,
    StringType,
    StructType,
    TimestampType,
)

from core.redact import said
from core.sources.pg.values import json_float
from core.steps.payload import dump, load
from core.tables import closest

BATCH = 1_000  # records a request
# Seconds between the tries of a post that may pass later: about a minute in all.
RETRY_WAITS = (0.5, 1, 2, 4, 8, 15, 30)
NEEDED = ("collection_id", "record_id", "data")
# What each column takes: Spark types, and how to say so.
_TAKES: dict[str, tuple[tuple[type, ...], str]] = {
    "collection_id": ((StringType,), "text"),
    "record_id": ((StringType, IntegralType), "text or a whole number"),
    "data": ((StringType, StructType, MapType), "a JSON text, a struct or a map"),
    "deleted": ((BooleanType,), "true or false"),
    "version": ((IntegralType, TimestampType), "a whole number or a timestamp "
                "(its microseconds since 1970)"),
}  # fmt: skip


class SinkError(RuntimeError):
    """The rows cannot be written as asked; the message says what to do."""


_OPTIONS = ("config", "source", "url")  # a weir write's (docs/spark.md “Writing”)
_SPARKS = ("checkpointlocation", "queryname")  # Spark's own, given to a stream writer too


@dataclass(frozen=True)
class Target:
    """Where the tasks post: plain data, pickled by Spark."""

    url: str  # .../v1/sources/NAME/records
    token: str
    source: str


def target_of(options: dict[str, str], schema: StructType) -> Target:
    """The ingest route of the http source the options name (read from the config, on the
    driver), after checking the rows' columns."""
    from core.config.load import load_config
    from core.config.sources import HttpSource

    missing = [c for c in NEEDED if c not in schema.fieldNames()]
    if missing:
        raise SinkError(f"the rows need the columns {', '.join(NEEDED)}: {', '.join(missing)} "
                        "missing (deleted and version are optional)")  # fmt: skip
    for f in schema.fields:
        takes = _TAKES.get(f.name)
        if takes is None:  # dropped, it would take its meaning with it (a version, a delete)
            raise SinkError(f'no column "{f.name}" is written{closest(f.name, _TAKES)}:'
                            f" the rows' columns are {', '.join(_TAKES)}")  # fmt: skip
        if not isinstance(f.dataType, takes[0]):
            raise SinkError(f'column "{f.name}" is {f.dataType.simpleString()}: it takes '
                            f"{takes[1]}")  # fmt: skip
        if isinstance(f.dataType, MapType) and not isinstance(f.dataType.keyType, StringType):
            raise SinkError(f'column "{f.name}" is {f.dataType.simpleString()}: a JSON '
                            "object's keys are strings (cast the keys to string)")  # fmt: skip
    for key in options:
        if key.lower() not in _OPTIONS and key.lower() not in _SPARKS:
            raise SinkError(f"no option {key!r} of a weir write{closest(key, _OPTIONS)}: "
                            "docs/spark.md lists them")  # fmt: skip
    path = options.get("config")
    if not path:
        raise SinkError('option "config" is required: the path of the weir YAML file')
    cfg = load_config(path)
    http = [s.name for s in cfg.sources if isinstance(s, HttpSource)]
    name = options.get("source") or (http[0] if len(http) == 1 else None)
    if name not in http:
        raise SinkError(f'option "source": one of the config\'s http sources '
                        f"({', '.join(http) or 'none'})")  # fmt: skip
    if cfg.api is None:
        raise SinkError("the config has no api: the rows are posted to weir run's API")
    base = options.get("url") or "http://" + cfg.api.listen.replace("0.0.0.0", "127.0.0.1")
    token = cfg.api.tokens[0].get_secret_value()
    return Target(f"{base.rstrip('/')}/v1/sources/{name}/records", token, name)


@dataclass
class Written(WriterCommitMessage):
    accepted: int
    skipped: int


def _post(target: Target, records: list[dict[str, Any]]) -> tuple[int, int]:
    """Post records; (stored, skipped). A body beyond the API's ``max_body_bytes`` (413) goes
    again in halves; an answer that may pass (429, 5xx: weir run restarting, its store not
    answering) and a connection that fails are tried again for about a minute. Sending twice
    is harmless: ingest's version guard stores nothing twice."""
    import httpx

    body = dump({"records": records})
    headers = {"Authorization": f"Bearer {target.token}", "Content-Type": "application/json"}
    why = ""
    for wait in (*RETRY_WAITS, None):
        try:
            r = httpx.post(target.url, content=body, headers=headers, timeout=60)
        except httpx.TransportError as e:
            why = said("%s cannot be reached: %s", target.url, e)  # a URL's password masked
        else:
            if r.status_code == 200:
                answer = r.json()
                return int(answer["accepted"]), int(answer["skipped"])
            if r.status_code == 413 and len(records) > 1:
                half = len(records) // 2
                a1, s1 = _post(target, records[:half])
                a2, s2 = _post(target, records[half:])
                return a1 + a2, s1 + s2
            if r.status_code == 413:
                first = records[0]
                raise SinkError(f"source {target.source}: record {first['record_id']!r} of "
                                f"{first['collection_id']} is {len(body)} bytes as JSON, more "
                                "than the API takes: raise api.max_body_bytes")  # fmt: skip
            why = f"ingest answered {r.status_code}: {r.text[:500]}"
            if r.status_code != 429 and r.status_code < 500:
                raise SinkError(f"source {target.source}: {why}")
        if wait is None:
            break
        time.sleep(wait)
    raise SinkError(f"source {target.source}: {why} (tried {len(RETRY_WAITS) + 1} times in "
                    f"{sum(RETRY_WAITS):.0f} s)")  # fmt: skip


def _record(row: Any) -> dict[str, Any]:
    coll, rid = row["collection_id"], row["record_id"]
    if coll is None or rid is None:
        raise SinkError(f"a row of collection {coll!r} has no "
                        f"{'collection_id' if coll is None else 'record_id'}: every row needs "
                        "both")  # fmt: skip
    data = row["data"]
    if isinstance(data, str):
        try:
            data = load(data.encode())  # every number as written, as ingest takes it
        except ValueError as e:
            raise SinkError(f"record {rid!r} of {coll}: data is not JSON text: {e}") from None
    out = {"collection_id": coll, "record_id": str(rid), "data": _json(data)}
    fields = row.__fields__
    if "deleted" in fields and row["deleted"] is not None:
        out["deleted"] = bool(row["deleted"])
    version = row["version"] if "version" in fields else None
    if isinstance(version, datetime):  # microseconds since 1970, as upstream_updated_at's
        out["version"] = round(version.timestamp() * 1_000_000)  # naive: Spark's local time
    elif version is not None:
        out["version"] = int(version)
    return out


def _json(v: Any) -> Any:
    """A value of ``data`` as JSON's values, written as capture writes Postgres's: a struct (a
    Row, also within a map or an array) an object, NaN and the infinities strings (not JSON's
    null), bytes base64 text (as a ``bytea``); decimals keep their digits (dump writes them)."""
    if type(v) is float:
        return json_float(v)
    if isinstance(v, Row):
        return {k: _json(x) for k, x in v.asDict().items()}
    if isinstance(v, dict):
        return {k: _json(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_json(x) for x in v]
    if isinstance(v, (bytes, bytearray)):
        return base64.b64encode(v).decode()
    return v


def write_rows(target: Target, rows: Iterator[Any]) -> Written:
    """Post the rows a batch at a time; how many were stored and skipped."""
    accepted = skipped = 0
    batch: list[dict[str, Any]] = []
    for row in rows:
        batch.append(_record(row))
        if len(batch) >= BATCH:
            a, s = _post(target, batch)
            accepted, skipped, batch = accepted + a, skipped + s, []
    if batch:
        a, s = _post(target, batch)
        accepted, skipped = accepted + a, skipped + s
    return Written(accepted, skipped)


class BatchWriter(DataSourceWriter):
    def __init__(self, target: Target) -> None:
        self.target = target

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return write_rows(self.target, iterator)


class StreamWriter(DataSourceStreamWriter):
    def __init__(self, target: Target) -> None:
        self.target = target

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return write_rows(self.target, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # each task's rows are stored as it posts them

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # what was stored stays: the batch written again stores nothing twice
