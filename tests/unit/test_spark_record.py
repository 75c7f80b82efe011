"""What the writer posts for a row (spark/sink.py, docs/spark.md “Writing”): a ``data`` text is
read as JSON with its numbers as written, floats JSON cannot hold are capture's strings, and a
row it cannot post is refused naming its record."""

from __future__ import annotations

import pytest
from pyspark.sql import Row

from spark.sink import SinkError, _record


def test_a_data_text_that_is_not_json_is_refused_naming_the_record() -> None:
    with pytest.raises(SinkError) as e:
        _record(Row(collection_id="orders", record_id="7", data="{'total': 1}"))
    assert str(e.value).startswith("record '7' of orders: data is not JSON text")


def test_a_data_text_keeps_its_numbers_and_nan_is_spelled_as_capture_spells_it() -> None:
    row = Row(collection_id="orders", record_id=7, data='{"n": 12345678901234567890123}')
    out = _record(row)
    assert out["record_id"] == "7"
    assert str(out["data"]["n"]) == "12345678901234567890123"
    nested = Row(collection_id="o", record_id="1",
                 data={"avg": float("nan"), "up": [float("inf"), -float("inf"), 1.5]})  # fmt: skip
    assert _record(nested)["data"] == {"avg": "NaN", "up": ["Infinity", "-Infinity", 1.5]}
