"""The forwarding engine's rules through a running Forwarder, against an in-memory store and
broker (tests/helpers/fake_store.py, fake_sink.py): what reaches the broker, in which order,
how often, what lands on the failed list, and where the cursor stands. No server runs.

Every run also checks each cursor save: it never passes a message the broker has not taken
(``unsafe_saves``).
"""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from typing import Any
from unittest.mock import patch

import pytest

from core.engine import session
from core.engine.forwarder import Forwarder, Refused
from core.engine.session import SAVE_EVERY
from core.engine.sink import FatalError, RetryableError
from core.failures import Unreachable
from tests.helpers.fake_sink import FakeBroker
from tests.helpers.fake_store import Failed, FakeStore
from tests.helpers.forwarding import connector, forward, unsafe_saves, until


def run(store: FakeStore, broker: FakeBroker, **kw: object) -> None:
    """Forward ``store`` to ``broker`` until caught up; no save may have been unsafe."""
    unsafe = unsafe_saves(store, broker)
    asyncio.run(forward(store=store, broker=broker, **kw))  # type: ignore[arg-type]
    assert unsafe == []


def written(broker: FakeBroker) -> Counter[str]:
    """How many times each key was written to the broker."""
    return Counter(key for batch in broker.writes for key in batch)


def test_every_message_reaches_the_broker_once_in_seq_order() -> None:
    store, broker = FakeStore(), FakeBroker()
    msgs = [store.append(f"r{i % 4}") for i in range(23)]
    run(store, broker, cfg=connector(max_messages=3))
    assert broker.stored_keys() == [m.key for m in msgs]
    assert store.cursor() == 23
    assert store.failed == {}


@pytest.mark.parametrize(("stream", "sent"), [("records", [1, 3]), ("events", [1, 2, 3])])
def test_records_stream_sends_only_the_latest_version_waiting_behind_one_in_flight(
    stream: str, sent: list[int]
) -> None:
    store, broker = FakeStore(stream), FakeBroker()
    first = store.append("r1")
    held = broker.hold(first.key)

    async def during() -> None:
        await until(lambda: len(broker.writes) == 1)  # version 1 is out, unanswered
        store.append("r1")
        store.append("r1")
        other = store.append("r2")
        store.commit()
        await until(lambda: other.key in broker.stored_keys())  # versions 2 and 3 were read
        held.set()

    run(store, broker, cfg=connector(stream), during=during)
    assert broker.by_group()[first.group] == sent
    assert len(broker.stored_keys()) == len(sent) + 1
    assert store.cursor() == 4  # the skipped version is settled too


def test_a_partial_batch_error_retries_only_the_failed_message() -> None:
    store, broker = FakeStore(), FakeBroker()
    msgs = [store.append(f"r{i}") for i in range(6)]
    broker.fail_batch({2: RetryableError("busy")})
    run(store, broker, cfg=connector())
    keys = [m.key for m in msgs]
    assert broker.writes == [keys, [keys[2]]]
    assert broker.stored_keys() == keys[:2] + keys[3:] + [keys[2]]


def test_a_whole_failed_batch_is_sent_again_and_nothing_else_twice() -> None:
    store, broker = FakeStore(), FakeBroker()
    msgs = [store.append(f"r{i % 3}") for i in range(6)]
    broker.fail_batch(None)  # the first write: every message fails, retryably
    run(store, broker, cfg=connector())
    keys = [m.key for m in msgs]
    assert broker.writes[0] == keys[:3]  # one message per record out at a time
    assert sorted(broker.writes[1]) == sorted(keys[:3])
    assert written(broker) == Counter({k: 2 for k in keys[:3]} | {k: 1 for k in keys[3:]})
    assert broker.by_group() == {m.group: [m.seq, m.seq + 3] for m in msgs[:3]}


def test_later_messages_of_a_group_wait_behind_a_failed_one_while_others_go_on() -> None:
    store, broker = FakeStore(), FakeBroker()
    a1, b1, a2, b2, a3 = (store.append(r) for r in ["a", "b", "a", "b", "a"])
    broker.fail(a1.key, RetryableError("busy"), times=2)
    run(store, broker, cfg=connector(backoff=0.02))
    assert broker.by_group() == {a1.group: [1, 3, 5], b1.group: [2, 4]}
    assert broker.stored_keys()[:2] == [b1.key, b2.key]  # b did not wait for a's backoff
    assert written(broker) == Counter({a1.key: 3, b1.key: 1, a2.key: 1, b2.key: 1, a3.key: 1})


def test_a_fatal_failure_goes_to_the_failed_list_at_once_and_its_group_goes_on() -> None:
    store, broker = FakeStore(), FakeBroker()
    a1, b1, a2 = (store.append(r) for r in ["a", "b", "a"])
    broker.fail(a1.key, FatalError("message of 2 MB is over max_payload"), times=None)
    run(store, broker, cfg=connector())
    assert store.failed == {
        (a1.sync_id, 1): Failed(a1.key, 1, "FatalError: message of 2 MB is over max_payload")
    }
    assert broker.stored_keys() == [b1.key, a2.key]
    assert written(broker)[a1.key] == 1
    assert store.cursor() == 3


def test_a_message_failing_max_attempts_times_goes_to_the_failed_list() -> None:
    store, broker = FakeStore(), FakeBroker()
    a1, a2 = store.append("a"), store.append("a")
    broker.fail(a1.key, RetryableError("stream unavailable"), times=None)
    run(store, broker, cfg=connector(max_attempts=3))
    assert store.failed == {
        (a1.sync_id, 1): Failed(a1.key, 3, "RetryableError: stream unavailable")
    }
    assert written(broker)[a1.key] == 3
    assert broker.stored_keys() == [a2.key]
    assert store.cursor() == 2


def test_a_retried_failed_message_goes_out_behind_its_group_and_leaves_the_list() -> None:
    store, broker = FakeStore(), FakeBroker()
    a1, a2 = store.append("a"), store.append("a")
    broker.fail(a1.key, FatalError("refused"), times=1)
    held = broker.hold(a2.key)

    async def during() -> None:
        await until(lambda: (a1.sync_id, 1) in store.failed)  # a2 is out, unanswered
        store.retry.add((a1.sync_id, 1))  # an operator's retry
        await asyncio.sleep(0.05)
        assert written(broker)[a1.key] == 1  # not beside a2, which its group has out
        held.set()
        await until(lambda: store.failed == {})

    with patch.object(session, "POLL", 0.01):
        run(store, broker, cfg=connector(), during=during)
    assert broker.stored_keys() == [a2.key, a1.key]  # the group's order: a1 after what was out
    assert written(broker)[a1.key] == 2
    assert store.cursor() == 2  # the cursor never went back


def test_a_retried_message_failing_again_stays_on_the_list_with_its_new_error() -> None:
    store, broker = FakeStore(), FakeBroker()
    a1 = store.append("a")
    broker.fail(a1.key, FatalError("refused"), times=2)

    async def during() -> None:
        await until(lambda: (a1.sync_id, 1) in store.failed)
        store.retry.add((a1.sync_id, 1))
        await until(lambda: written(broker)[a1.key] == 2 and not store.retry)
        await asyncio.sleep(0.05)

    with patch.object(session, "POLL", 0.01):
        run(store, broker, cfg=connector(), during=during)
    assert store.failed == {(a1.sync_id, 1): Failed(a1.key, 1, "FatalError: refused")}
    assert written(broker)[a1.key] == 2  # asked once, sent once more


def test_the_cursor_never_passes_a_message_in_flight() -> None:
    store, broker = FakeStore(), FakeBroker()
    a1 = store.append("a")
    others = [store.append(f"b{i}") for i in range(5)]
    held = broker.hold(a1.key)

    async def during() -> None:
        await until(lambda: broker.stored_keys() == [m.key for m in others])
        await asyncio.sleep(3 * SAVE_EVERY)  # saves had their chance after the others' acks
        # Flush, then commit: 2-6 are acknowledged, but 1 is not, so the cursor stays before
        # it, with the broker's position from before 1 was sent.
        assert store.cursors[a1.sync_id] == (0, {"mark": {}})
        held.set()

    run(store, broker, cfg=connector(max_messages=1), during=during)
    assert store.cursors[a1.sync_id] == (6, {"mark": {"main": 6}})


def test_a_dropped_connection_resends_nothing_the_broker_took() -> None:
    store, broker = FakeStore(), FakeBroker()
    msgs = [store.append(f"r{i}") for i in range(5)]
    broker.drop_connection(stored=2)  # stores two, then no ack comes for any
    run(store, broker, cfg=connector())
    assert broker.connects == 2
    assert broker.stored_keys() == [m.key for m in msgs]  # the two stored are read back


def test_a_sink_that_cannot_read_its_broker_sends_again_what_was_not_acknowledged() -> None:
    """A webhook's receiver or an SQS queue cannot say what it took: a new session sends again
    everything not acknowledged (the receiver deduplicates by the idempotency key), nothing
    that was, and no mark is kept for it."""
    store, broker = FakeStore(), FakeBroker()
    msgs = [store.append(f"r{i}") for i in range(5)]
    broker.drop_connection(stored=2)  # stores two, then no ack comes for any
    run(store, broker, cfg=connector(), blind=True)
    assert broker.connects == 2
    assert broker.stored_keys() == [m.key for m in msgs[:2]] + [m.key for m in msgs]
    more = store.append("r5")
    run(store, broker, cfg=connector(), blind=True)
    assert broker.stored_keys()[-1:] == [more.key]  # acknowledged ones never go twice
    assert list(store.cursors.values()) == [(6, {"mark": {}})]


def test_what_a_restart_skipped_is_not_resent_after_the_next_restart() -> None:
    # Session 1 stores 1 and 4, then loses the connection on 2. Session 2 reads 4 back and
    # skips it, stores 2, and loses the connection on 3 with its cursor at 2: the mark saved
    # with that cursor must still be from before 4 was stored, or session 3 sends 4 again.
    store, broker = FakeStore(), FakeBroker()
    m1, m2, m3, m4 = (store.append(r) for r in ["a", "a", "a", "b"])
    broker.fail(m2.key, ConnectionError("reset"))
    broker.fail(m3.key, ConnectionError("reset"))
    run(store, broker, cfg=connector(max_messages=1, max_in_flight=1))
    assert broker.connects == 3
    assert broker.stored_keys() == [m1.key, m4.key, m2.key, m3.key]


def test_a_message_that_keeps_dropping_the_connection_is_charged_with_it() -> None:
    store, broker = FakeStore(), FakeBroker()
    a1, b1, c1 = (store.append(r) for r in ["a", "b", "c"])
    broker.fail(a1.key, ConnectionError("connection reset"), times=None)
    run(store, broker, cfg=connector())
    assert store.failed == {
        (a1.sync_id, 1): Failed(
            a1.key, 1, "FatalError: the broker dropped the connection (or never answered) "
            "each of the 3 times this message was sent alone; last: ConnectionError: "
            "connection reset"
        )
    }  # fmt: skip
    assert broker.stored_keys() == [b1.key, c1.key]
    assert written(broker)[a1.key] == 4  # once in the batch, then three times alone


def test_start_position_end_sends_only_what_comes_after_the_first_start() -> None:
    store, broker = FakeStore(), FakeBroker()
    store.append("a")
    store.append("b")

    async def during() -> None:
        await until(lambda: store.cursor() == 2 and len(store.saves) > 0)
        store.append("c")
        store.commit()

    cfg = connector().model_copy(update={"start_position": "end"})
    run(store, broker, cfg=cfg, during=during)
    assert broker.stored_keys() == [store.rows[store.sync_ids[0]][2].key]


def test_a_crash_before_the_first_periodic_save_resends_nothing() -> None:
    """Every message reaches the broker before the first periodic cursor save, then a SIGKILL:
    what the store holds then (the mark saved before anything was sent) makes the next
    session read the messages back instead of sending them again."""
    store, broker = FakeStore(), FakeBroker()
    msgs = [store.append(f"r{i}") for i in range(5)]

    async def until_the_crash() -> dict[str, Any]:
        fw = Forwarder(connector(), store.sources, None, store, open_sink=broker.sink,
                       open_reader=store.reader)  # fmt: skip
        stop = asyncio.Event()
        with patch.object(session, "SAVE_EVERY", 3600.0):  # no periodic save in time
            task = asyncio.create_task(fw.run(stop))
            async with asyncio.timeout(10):
                await until(lambda: len(broker.stored_keys()) == len(msgs))
            left = copy.deepcopy(store.cursors)  # what a SIGKILL now leaves in the store
            stop.set()
            await task
        return left

    store.cursors = asyncio.run(until_the_crash())
    run(store, broker, cfg=connector())
    assert broker.stored_keys() == [m.key for m in msgs]


def test_a_connector_whose_cursor_was_deleted_stops_and_never_starts_again() -> None:
    """A cursor gone under a running session means the connector was deleted (a delete over
    the API): the next session stops instead of sending the stream again from its start."""
    store, broker = FakeStore(), FakeBroker()
    msgs = [store.append(f"r{i}") for i in range(5)]

    async def during() -> None:
        await until(lambda: store.cursor() == 5)
        store.cursors.clear()
        msgs.append(store.append("r5"))  # read and sent before the session finds out

    fw = asyncio.run(forward(connector(), store, broker, during=during))
    assert broker.stored_keys() == [m.key for m in msgs]  # each once: nothing from the start
    assert store.cursors == {}  # no cursor made anew
    assert fw.state == "deleted"


def test_nothing_is_sent_once_the_store_ended_the_fenced_session() -> None:
    """A process that resumes after the store cut its sessions (another owner may be sending)
    dispatches nothing it read ahead; it sends once it has its fence again, each message once."""
    store, broker = FakeStore(), FakeBroker()
    store.fence_lost = True
    msgs = [store.append(f"r{i}") for i in range(5)]

    async def during() -> None:
        await asyncio.sleep(0.3)
        assert broker.stored_keys() == []
        store.fence_lost = False

    run(store, broker, cfg=connector(), during=during)
    assert broker.stored_keys() == [m.key for m in msgs]


def _refused() -> Unreachable:
    return Unreachable("NATS", "h:4222", "it refused the credentials", "nats.user", for_good=True)


def test_a_file_connector_turned_away_for_good_at_its_first_connect_ends_the_run() -> None:
    store, broker = FakeStore(), FakeBroker()
    store.append("r0")
    broker.refusals[1] = _refused()
    with pytest.raises(Refused, match=r"it refused the credentials; check nats\.user"):
        asyncio.run(forward(connector(), store, broker))
    assert broker.connects == 1 and broker.stored == []


@pytest.mark.parametrize("made", [True, False], ids=["made-over-the-api", "ran-before"])
def test_a_refusal_for_good_is_retried_by_a_connector_that_may_not_end_the_run(made: bool) -> None:
    """One made over the API (a client may not end the service), or one that ran (credentials
    turned away since may be restored): each retries, and delivers once let in."""
    store, broker = FakeStore(), FakeBroker()
    msgs = [store.append(f"r{i}") for i in range(5)]
    cfg = connector().made(1) if made else connector()
    if not made:
        broker.drop_connection(stored=1)
    first = 1 if made else 2
    broker.refusals |= {first: _refused(), first + 1: _refused()}
    run(store, broker, cfg=cfg)
    assert broker.connects == first + 2
    assert broker.stored_keys() == [m.key for m in msgs]
