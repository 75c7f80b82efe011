"""The shapes of the HTTP API's requests and answers, as its OpenAPI document shows them.

The hot routes (receive) build their JSON from the stored texts and skip response-model
validation: their models here only document them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Path
from pydantic import BaseModel, ConfigDict, Field

from core.api.consume import BATCH, MAX_BATCH, MAX_WAIT_MS
from core.config.model import ConsumerConfig
from core.sources.http import IngestRecord

# A consumer's or source's name in a route's path.
Name = Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


class Out(BaseModel):
    model_config = ConfigDict(extra="allow")


class Info(Out):
    num_pending: int = Field(description="queued and not outstanding: new or nacked")
    num_ack_pending: int = Field(
        description="outstanding: delivered and neither acked nor nacked, also when its"
        " visibility timeout ran out (max_ack_pending caps these)"
    )


class ConsumerOut(ConsumerConfig):
    origin: Literal["api", "config"]
    info: Info | None = Field(None, description="only when one consumer is asked for")
    warnings: list[str] = Field(
        [],
        description="made: what its filters or group_columns name that its sources do not "
        "have (a pattern or column that matches nothing), with the closest name",
    )


class ConsumerList(Out):
    data: list[ConsumerOut]


class NextItem(Out):
    ack_token: str
    record: dict[str, Any]


class NextResponse(Out):
    data: list[NextItem]
    info: Info


class PullItem(Out):
    ack_token: str
    record: dict[str, Any]
    changes: dict[str, Any] | None
    action: str


class PullResponse(Out):
    data: list[PullItem]


class StreamItem(Out):
    ack_id: str
    data: dict[str, Any]


class StreamResponse(Out):
    data: list[StreamItem]


class AckTokens(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ack_tokens: list[str] = Field(min_length=1, max_length=10_000)


class AckIds(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ack_ids: list[str] = Field(min_length=1, max_length=10_000)


class StreamReceive(BaseModel):
    # JSON's own types: true or "2" as a batch size was taken as 1 or 2 (found by an outside
    # tryout); a query string's are text, and read as numbers there
    model_config = ConfigDict(extra="forbid", strict=True)
    batch_size: int | None = Field(
        None, ge=1, le=MAX_BATCH, description=f"messages at most (default {BATCH})"
    )
    max_batch_size: int | None = Field(
        None, ge=1, le=MAX_BATCH, description="Sequin's current name for batch_size"
    )
    wait_for: int = Field(0, ge=0, le=MAX_WAIT_MS)


class Settled(Out):
    success: bool
    count: int = Field(description="tokens that matched a current delivery")


class Deleted(Out):
    success: bool


class IngestBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    records: list[IngestRecord] = Field(min_length=1, max_length=10_000)


class IngestResult(Out):
    accepted: int = Field(description="changes written to the streams")
    skipped: int = Field(description="records not newer than the stored version")


class Refused(Out):
    detail: str = Field(description="why")


class Health(Out):
    status: str


class Ready(Out):
    status: str
    checks: dict[str, str] = Field(description="'ok' or why not, per dependency")
