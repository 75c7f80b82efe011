"""How instances share works out (core/runtime/leases.py), with the store's side in memory:
locks held by other instances, and the number of live instances of the group."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from core.metrics import SHARED_DIR
from core.runtime import leases as leases_module
from core.runtime.connectors import first_in_run
from core.runtime.leases import ORPHAN_POLLS, REBALANCE, Leases


class FakeStore:
    schema = "weir"
    url = "postgresql://unused"

    def table(self, name: str) -> sql.Composable:
        return sql.Identifier(self.schema, name)


class FakeOwners:
    """The advisory locks of every instance, and how many instances are alive."""

    def __init__(self) -> None:
        self.locked: dict[str, str] = {}  # work -> instance
        self.live = 1

    def connect(self) -> Any:
        return self  # a connection that stays up

    closed = False

    def heartbeat(self, conn: Any) -> None:
        pass

    def peers(self, conn: Any) -> int:
        return self.live

    paused_connectors: set[str] = set()

    def operated(self, conn: Any) -> tuple[set[str], str]:
        return self.paused_connectors, "0/"

    def take(self, conn: Any, work: str) -> bool:
        if self.gone:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return self.locked.setdefault(work, "me") == "me"

    def release(self, conn: Any) -> None:
        pass

    def close(self) -> None:
        pass

    gone = False  # the lease connection was cut

    def give_up(self, conn: Any, work: str) -> None:
        del self.locked[work]


WORKS = ["source:a", "connector:x#0/2", "connector:x#1/2", "connector:y"]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(leases_module.time, "monotonic", lambda: now[0])
    return now


def make(owners: FakeOwners) -> Leases:
    leases = Leases(FakeStore(), len(WORKS))  # type: ignore[arg-type]
    leases._owners = owners  # type: ignore[assignment]
    return leases


def poll(leases: Leases) -> list[str]:
    """One poll of the lease loop: the works taken."""
    assert leases.alive()
    return [w for w in WORKS if w not in leases.held and leases.take(w)]


def test_alone_an_instance_takes_every_work(clock: list[float]) -> None:
    leases = make(FakeOwners())
    assert poll(leases) == WORKS


def test_with_a_peer_it_takes_its_share_and_an_orphan_after_a_while(clock: list[float]) -> None:
    owners = FakeOwners()
    owners.live = 2
    owners.locked["connector:y"] = "peer"  # the peer holds one: two are left free
    leases = make(owners)
    assert poll(leases) == WORKS[:2]  # its share: ceil(4 / 2)
    for _ in range(ORPHAN_POLLS - 1):
        assert poll(leases) == []  # left to the peer
    assert poll(leases) == ["connector:x#1/2"]  # nobody took it: taken regardless, and kept
    clock[0] += REBALANCE
    assert leases.surplus() == []


def test_a_new_peer_gets_what_is_past_the_share_and_a_dead_ones_share_is_taken_at_once(
    clock: list[float],
) -> None:
    owners = FakeOwners()
    leases = make(owners)
    assert poll(leases) == WORKS
    owners.live = 2  # a new instance starts
    assert leases.alive()
    assert leases.surplus() == []  # not within REBALANCE of the start
    clock[0] += REBALANCE
    given = leases.surplus()
    assert given == WORKS[2:]  # the last taken
    for work in given:
        leases.give_up(work)
        owners.locked[work] = "peer"
    clock[0] += REBALANCE
    assert leases.surplus() == []
    owners.live = 1  # the peer dies: its locks went with its connection
    for work in given:
        del owners.locked[work]
    assert poll(leases) == WORKS[2:]  # no orphan wait


def test_a_lease_connection_cut_while_taking_stops_every_work_at_the_next_poll(
    clock: list[float],
) -> None:
    owners = FakeOwners()
    leases = make(owners)
    assert leases.alive()
    assert leases.take(WORKS[0])
    owners.gone = True
    assert not leases.take(WORKS[1])  # no traceback, and no lease
    assert leases.held == []
    assert not leases.alive()  # the caller stops what it ran under the lost leases
    owners.gone = False
    assert poll(leases) == WORKS  # a new connection, and the works again


def test_every_shard_of_a_paused_connector_is_paused_and_nothing_else() -> None:
    owners = FakeOwners()
    owners.paused_connectors = {"x"}
    leases = make(owners)
    assert leases.alive()
    assert [w for w in WORKS if leases.paused(w)] == ["connector:x#0/2", "connector:x#1/2"]
    owners.paused_connectors = set()  # resumed: seen at the next poll
    assert leases.alive()
    assert not any(leases.paused(w) for w in WORKS)


def test_a_refusal_is_said_by_one_process_of_a_run(tmp_path: Path, monkeypatch: Any) -> None:
    """Each worker process of a run that meets a connector's refusal asks whether it is the
    first to say it; one is, for the whole run, however late the others ask (a store lock
    ended with the first worker, and a worker refused a second later said it again)."""
    script = ("import sys; from core.runtime.connectors import first_in_run; "
              "print(first_in_run(sys.argv[1]))")  # fmt: skip
    env = {**os.environ, SHARED_DIR: str(tmp_path), "PYTHONPATH": str(Path(__file__).parents[2])}
    said = [subprocess.run([sys.executable, "-c", script, what], env=env, text=True,
                           capture_output=True, check=True).stdout.strip()
            for what in ("refused:a", "refused:a", "refused:b", "refused:a")]  # fmt: skip
    assert said == ["True", "False", "True", "False"]
    monkeypatch.delenv(SHARED_DIR, raising=False)
    assert first_in_run("refused:a") and first_in_run("refused:a")  # a process on its own
