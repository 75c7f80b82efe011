"""The commit timestamp capture writes: the same text as ``utc_iso`` for every microsecond
(years below 1000 too, which strftime did not pad)."""

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from core.envelope import utc_iso
from core.sources.pg.stream import _iso

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROS = st.integers(min_value=-62_135_596_800_000_000 + 86_400_000_000,
                     max_value=253_402_300_799_999_999)  # fmt: skip  # years 1 to 9999


def expected(us: int) -> str:
    return utc_iso(EPOCH + timedelta(microseconds=us))


@given(MICROS)
def test_a_commit_time_is_written_as_messages_write_times(us: int) -> None:
    assert _iso(us) == expected(us)
