"""Properties of the forwarding engine over random streams, batch sizes and scripted broker
faults (in-memory store and broker, no server): every message reaches the broker once, in its
group's order, except exactly the ones that must go to the failed list; and a restart from any
cursor the engine ever saved sends nothing the broker already has.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.engine.sink import FatalError, RetryableError
from tests.helpers.fake_sink import FakeBroker
from tests.helpers.fake_store import FakeStore
from tests.helpers.forwarding import connector, forward, unsafe_saves

# What the broker does to a message: nothing, fail it retryably 1 or 2 times, refuse it for
# ever, or drop the connection the first time it comes.
FAULTS = st.sampled_from(["none", "none", "none", "retry1", "retry2", "fatal", "drop"])


@dataclass
class Case:
    changes: list[tuple[int, int, str]]  # (source, record, fault)
    max_messages: int
    max_in_flight: int
    max_attempts: int | None


CASES = st.builds(
    Case,
    changes=st.lists(st.tuples(st.integers(0, 1), st.integers(0, 3), FAULTS), max_size=30),
    max_messages=st.integers(1, 6),
    max_in_flight=st.integers(1, 3),
    max_attempts=st.sampled_from([None, 3]),  # above the 2 retryable failures scripted
)


def script(case: Case) -> tuple[FakeStore, FakeBroker, set[str]]:
    """The store and broker of a case (two broker streams), and the keys that must fail."""
    store = FakeStore(sources=2)
    broker = FakeBroker(route=lambda m: f"stream{m.seq % 2}")
    fatal = set()
    for source, record, fault in case.changes:
        m = store.append(f"r{record}", source)
        if fault.startswith("retry"):
            broker.fail(m.key, RetryableError("busy"), times=int(fault[-1]))
        elif fault == "fatal":
            broker.fail(m.key, FatalError("refused"), times=None)
            fatal.add(m.key)
        elif fault == "drop":
            broker.fail(m.key, ConnectionError("reset"), times=1)
    return store, broker, fatal


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CASES)
def test_every_message_once_in_group_order_and_exactly_the_refused_ones_failed(
    case: Case,
) -> None:
    store, broker, fatal = script(case)
    cfg = connector(max_messages=case.max_messages, max_in_flight=case.max_in_flight,
                    max_attempts=case.max_attempts)  # fmt: skip
    unsafe = unsafe_saves(store, broker)
    asyncio.run(forward(cfg, store, broker))
    every = [m for rows in store.rows.values() for m in rows]
    keys = broker.stored_keys()
    assert len(keys) == len(set(keys)), "a message reached the broker twice"
    assert set(keys) == {m.key for m in every} - fatal
    for group, seqs in broker.by_group().items():
        assert seqs == sorted(seqs), f"group {group} out of order"
    assert {f.key for f in store.failed.values()} == fatal
    assert unsafe == []


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CASES)
def test_a_restart_from_any_saved_cursor_sends_nothing_the_broker_has(case: Case) -> None:
    """A crash (SIGKILL) loses what the engine did after its last save: whichever save that
    was, the next start reads back what the broker took after the saved marks and skips it."""
    store, broker, _ = script(case)
    cfg = connector(max_messages=case.max_messages, max_in_flight=case.max_in_flight,
                    max_attempts=case.max_attempts)  # fmt: skip
    asyncio.run(forward(cfg, store, broker))
    before = list(broker.stored)
    cursors: dict[str, tuple[int, dict[str, object]]] = {}
    crash_points = []
    for sync_id, seq, state in store.saves:
        cursors[sync_id] = (seq, state)
        if len(cursors) == len(store.sync_ids):  # each source saved a mark at least once
            crash_points.append(dict(cursors))
    for saved in crash_points[:: max(1, len(crash_points) // 5)]:
        store.cursors = dict(saved)  # type: ignore[arg-type]
        asyncio.run(forward(cfg, store, broker))
        assert broker.stored == before, f"resent after a restart from {saved}"
