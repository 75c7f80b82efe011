"""Sharded connectors (docs/operations.md “Scaling out”): a connector with ``shards: N`` is N units
of work, each with its own cursor, broker mark and read-back, and a lease of its own, so that one
connector spreads over worker processes and ``weir run`` instances.

A record always lives in one shard: :func:`shard_of` hashes what its group key is made of (its
collection and its record id as the stream stores it), so that the messages of one group key
are sent by one shard, one at a time, in ``seq`` order, whatever runs where. The store computes
the same hash in SQL (``shard_of`` in core/store/functions.py) to read a shard's messages only.

When N changes, the shards of the new split start where the old ones left off (see
core/store/cursors.py): from the lowest of the old cursors, skipping what an old shard had
delivered (a :class:`Resplit`) and, by the read-back from the earliest of the old broker marks,
what it sent after its cursor.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

SEPARATOR = "#"  # connector names never hold it (core/config/base.py)


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of a connector split into ``of`` shards."""

    index: int = 0
    of: int = 1

    def key(self, connector: str) -> str:
        """What names the shard's cursor and, after ``connector:``, its lease: the connector's
        own name when it is not split, so that an unsharded connector's cursor stays as it was."""
        return connector if self.of == 1 else f"{connector}{SEPARATOR}{self.index}/{self.of}"

    def __str__(self) -> str:
        return f"shard {self.index}/{self.of}"


UNSPLIT = Shard()


def split(shards: int) -> list[Shard]:
    """The shards of a connector split ``shards`` ways."""
    return [Shard(i, shards) for i in range(shards)]


def shard_named(key: str, connector: str) -> Shard | None:
    """The shard of ``connector`` whose key is ``key`` (None when it names no shard of it)."""
    if key == connector:
        return Shard()
    head, sep, tail = key.partition(SEPARATOR)
    index, slash, of = tail.partition("/")
    if head != connector or not sep or not slash or not index.isdigit() or not of.isdigit():
        return None
    shard = Shard(int(index), int(of))
    return shard if shard.index < shard.of and shard.key(connector) == key else None


def shard_of(collection_id: str, record_id: str | None, shards: int) -> int:
    """The shard of a record: the first 32 bits of the MD5 of ``collection/record_id``, mod
    ``shards``. The store's SQL function of the same name computes the same."""
    text = f"{collection_id}/{record_id or ''}".encode()
    return int.from_bytes(hashlib.md5(text, usedforsecurity=False).digest()[:4], "big") % shards


@dataclass(frozen=True)
class Resplit:
    """What an earlier split of a connector had delivered when it was re-split: a message of
    the stream at or below ``seqs[shard_of(..., shards)]`` was sent by its old shard."""

    shards: int
    seqs: tuple[int, ...]

    def as_json(self) -> dict[str, Any]:
        return {"shards": self.shards, "seqs": list(self.seqs)}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Resplit:
        return cls(int(value["shards"]), tuple(int(s) for s in value["seqs"]))
