"""The forwarding engine's bookkeeping rules one by one, without a session (core/engine/rules.py,
core/engine/lane.py): per-group order and version collapse, the cursor, broker marks and how
they merge, and the charge of a message that keeps dropping the connection.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from core.config.connector import RetryPolicy
from core.engine.lane import MAX_MARKS, Lane
from core.engine.rules import STRIKES, Groups, Suspects
from core.engine.sink import FatalError
from core.envelope import Message, earliest
from tests.helpers.fake_sink import FakeBroker
from tests.helpers.fake_store import FakeReader, FakeStore


def msg(seq: int, key: str = "") -> Message:
    return Message("s", "fake", seq, "public:t", None, "g", key or f"k{seq}", b"{}")


def test_a_group_has_one_message_out_and_the_next_waits_for_its_release() -> None:
    groups: Groups[str] = Groups(collapse=False)
    for group, item in [("a", "a1"), ("b", "b1"), ("a", "a2"), ("a", "a3"), ("b", "b2")]:
        assert groups.admit(group, item) is None
    assert list(groups.ready) == ["a1", "b1"]
    groups.ready.clear()
    groups.release("a")
    assert list(groups.ready) == ["a2"]
    groups.release("a")
    groups.release("b")
    assert list(groups.ready) == ["a2", "a3", "b2"]
    groups.release("a")  # a3 settled: the group is idle, its next message goes out at once
    groups.ready.clear()
    assert groups.admit("a", "a4") is None
    assert list(groups.ready) == ["a4"]


def test_records_stream_keeps_only_the_newest_waiting_version_of_a_record() -> None:
    groups: Groups[str] = Groups(collapse=True)
    assert groups.admit("r", "v1") is None  # out
    assert groups.admit("r", "v2") is None  # waits
    assert groups.admit("r", "v3") == "v2"  # replaces v2, which the caller settles unsent
    assert groups.admit("r", "v4") == "v3"
    assert groups.admit("q", "w1") is None  # another record is not touched
    groups.release("r")
    assert list(groups.ready) == ["v1", "w1", "v4"]


def test_lane_cursor_stops_before_the_first_unsettled_seq() -> None:
    lane = Lane(FakeReader(FakeStore(), "s"))
    lane.fetched = 6
    lane.outstanding.extend([3, 4, 5, 6])
    lane.settle(4)
    lane.settle(6)
    assert lane.cursor() == 2  # 3 is out: nothing after it counts yet
    lane.settle(3)
    assert lane.cursor() == 4
    lane.settle(5)
    assert lane.cursor() == 6  # all settled: up to what was read


def test_lane_saves_the_mark_from_before_its_first_unsettled_message_went_out() -> None:
    lane = Lane(FakeReader(FakeStore(), "s"))
    sink = FakeBroker().sink()
    lane.fetched = 30
    lane.outstanding.extend(range(1, 31))
    lane.note_dispatch({"main": 100}, 10)
    lane.note_dispatch({"main": 105}, 8)  # a retry below the top: the earlier mark covers it
    lane.note_dispatch({"main": 110}, 20)
    lane.note_dispatch({"main": 120}, 30)
    assert list(lane.marks) == [({"main": 100}, 10), ({"main": 110}, 20), ({"main": 120}, 30)]
    for seq in range(1, 11):
        lane.settle(seq)
    assert lane.state(sink.mark) == (10, {"mark": {"main": 110}})
    for seq in range(11, 31):
        lane.settle(seq)
    assert lane.state(sink.mark) == (30, {"mark": {}})  # nothing out: the sink's own mark


def test_lane_merges_marks_beyond_its_limit_into_the_earlier_one() -> None:
    lane = Lane(FakeReader(FakeStore(), "s"))
    lane.fetched = MAX_MARKS + 10
    lane.outstanding.extend(range(1, MAX_MARKS + 11))
    for i in range(1, MAX_MARKS + 11):
        lane.note_dispatch({"main": 1000 + i}, i)
    assert len(lane.marks) == MAX_MARKS
    # The last entry kept its mark (the safer, earlier one) and took the highest seq.
    assert lane.marks[-1] == ({"main": 1000 + MAX_MARKS}, MAX_MARKS + 10)
    for seq in range(1, MAX_MARKS):
        lane.settle(seq)
    assert lane.state(FakeBroker().sink().mark)[1] == {"mark": {"main": 1000 + MAX_MARKS}}


def test_the_read_back_starts_at_each_streams_lowest_saved_position() -> None:
    assert earliest([{"a": 10, "b": 7}, {"a": 4, "b": 9}, {"a": 6, "b": 8}]) == {"a": 4, "b": 7}
    assert earliest([{"a": 3}]) == {"a": 3}
    assert earliest([]) == {}


def test_a_stream_one_saved_mark_lacks_is_read_back_from_its_start() -> None:
    # Source 1's mark was taken before topic "t2" existed: its messages may be anywhere in
    # t2, so the read-back must not start at source 2's position there.
    assert earliest([{"t1": 10}, {"t1": 12, "t2": 5}]) == {"t1": 10}


def test_a_suspect_is_charged_once_it_lost_the_connection_alone_often_enough() -> None:
    suspects = Suspects()
    batch = [msg(1), msg(2)]
    suspects.lost_connection(batch, ConnectionError("reset"))
    assert suspects == {"k1": (0, ""), "k2": (0, "")}  # in a batch: nobody is charged
    suspects.lost_connection(batch, ConnectionError("reset"))
    assert suspects == {"k1": (0, ""), "k2": (0, "")}
    for strike in range(1, STRIKES + 1):
        assert suspects.charged("k1", None) is None
        suspects.lost_connection([msg(1)], ConnectionError(f"reset {strike}"))
        assert suspects["k1"] == (strike, f"ConnectionError: reset {strike}")
    charge = suspects.charged("k1", None)
    assert isinstance(charge, FatalError)
    assert str(charge) == (
        f"the broker dropped the connection (or never answered) each of the {STRIKES} times "
        f"this message was sent alone; last: ConnectionError: reset {STRIKES}"
    )
    assert suspects.charged("k2", None) is None
    assert suspects.charged("k1", STRIKES + 1) is None  # max_attempts sets the count


@given(
    st.integers(1, 10**7),
    st.floats(0.0, 0.999),
    st.floats(1.0, 100.0),
    st.sampled_from(["0s", "1ms", "100ms", "5s"]),
    st.sampled_from(["1ms", "10s", "1d"]),
)
def test_a_retry_waits_at_most_max_whatever_the_attempt(
    attempt: int, rand: float, multiplier: float, initial: str, most: str
) -> None:
    """A destination down for hours: the 1,025th doubling overflowed a float and stopped
    weir run (found by an outside tryout). The wait grows to max and stays there."""
    retry = RetryPolicy.model_validate({"initial": initial, "max": most, "jitter": 0.2,
                                        "multiplier": multiplier})  # fmt: skip
    cap, first = retry.max.total_seconds(), retry.initial.total_seconds()
    wait = retry.delay(attempt, rand)
    assert 0 <= wait <= min(first if multiplier == 1.0 else cap, cap) * 1.2 + 1e-12
    if attempt > 10_000 and multiplier >= 1.01 and first > 0:
        assert wait >= cap * 0.8 - 1e-12
