"""The Kafka sink's delivery reports settle a batch (connectors/kafka/sink.py): offsets move the
mark, a refusal goes to its message, any other error leaves the batch in doubt. A producer
double answers each message with the report the test gives it; no broker runs. And what the
clients' log says to check after a connection failed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from confluent_kafka import KafkaError

from connectors.kafka.config import KafkaConnector, KafkaSettings
from connectors.kafka.sink import KafkaSink, _ClientLog
from core.engine.sink import BatchError, FatalError, RetryableError
from core.envelope import Message


class Report:
    def __init__(self, topic: str, partition: int, offset: int, key: bytes, value: bytes) -> None:
        self._at = (topic, partition, offset, key, value)

    def topic(self) -> str:
        return self._at[0]

    def partition(self) -> int:
        return self._at[1]

    def offset(self) -> int:
        return self._at[2]

    def key(self) -> bytes:
        return self._at[3]

    def value(self) -> bytes:
        return self._at[4]


class Producer:
    """Reports each message on the next loop turn: with ``errors[i]`` for the i-th produced,
    else stored at the partition's next offset (partition = i % 2)."""

    def __init__(self, errors: dict[int, int]) -> None:
        self.errors = errors
        self.produced = 0
        self.ends = [9, 19]

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery: Any, headers: Any) -> None:
        i, self.produced = self.produced, self.produced + 1
        code = self.errors.get(i)
        partition = i % 2
        if code is None:
            self.ends[partition] += 1
        msg = Report(topic, partition, self.ends[partition], key, value)
        err = None if code is None else KafkaError(code)
        asyncio.get_running_loop().call_soon(on_delivery, err, msg)


def send(errors: dict[int, int], n: int = 5) -> tuple[KafkaSink, BaseException | None]:
    cfg = KafkaConnector.model_validate({"name": "k", "type": "kafka", "stream": "events"})
    sink = KafkaSink(cfg)
    sink._producer = Producer(errors)  # type: ignore[assignment]
    batch = [Message("s", "postgres", i + 1, "public:t", "insert", f"s.postgres.public:t.{i}",
                     f"s:1:{i}", b"{}") for i in range(n)]  # fmt: skip

    async def write() -> BaseException | None:
        try:
            await sink.write_batch(batch)
        except Exception as e:
            return e
        return None

    return sink, asyncio.run(write())


def test_offsets_delivered_move_the_mark() -> None:
    sink, err = send({})
    assert err is None
    assert sink.mark() == {"sequin-events:0": 12, "sequin-events:1": 21}


def test_a_refused_message_fails_alone_and_the_others_count() -> None:
    sink, err = send({1: KafkaError.MSG_SIZE_TOO_LARGE, 4: KafkaError.UNKNOWN_TOPIC_OR_PART})
    assert isinstance(err, BatchError)
    assert sorted(err.failed) == [1, 4]
    assert isinstance(err.failed[1], FatalError)
    assert isinstance(err.failed[4], RetryableError)
    assert sink.mark() == {"sequin-events:0": 11, "sequin-events:1": 20}


def test_a_report_in_doubt_makes_the_batch_in_doubt() -> None:
    _, err = send({2: KafkaError._MSG_TIMED_OUT, 3: KafkaError.MSG_SIZE_TOO_LARGE})
    assert isinstance(err, ConnectionError)
    assert "1 kafka deliveries in doubt" in str(err)


@pytest.mark.parametrize("n", [1, 500])
def test_every_message_is_waited_for(n: int) -> None:
    sink, err = send({}, n)
    assert err is None
    assert sink.mark()["sequin-events:0"] == 9 + (n + 1) // 2  # the last of the batch


def test_a_mechanism_the_broker_lacks_is_named_where_the_config_gives_it() -> None:
    """A broker without the SASL mechanism turns the connector away for good, and the line
    names the key that gives the mechanism as the file writes it: librdkafka:'s under either
    of librdkafka's names for it, which wins over kafka.sasl's (it named kafka.sasl.mechanism)."""
    broker = "sasl_plaintext://127.0.0.1:9/bootstrap"
    line = (f"[thrd:{broker}]: {broker}: SASL OAUTHBEARER mechanism handshake failed: "
            "Broker: Unsupported SASL mechanism: broker's supported mechanisms: PLAIN")  # fmt: skip
    sasl = {"username": "u", "password": "p"}
    jwt = {"enable.sasl.oauthbearer.unsecure.jwt": True, "sasl.oauthbearer.config": "sub=weir"}
    for kafka, key in [
        ({"sasl": sasl}, "kafka.sasl.mechanism"),
        ({"sasl": sasl, "librdkafka": {"sasl.mechanism": "OAUTHBEARER"} | jwt},
         "kafka.librdkafka.sasl.mechanism"),
        ({"librdkafka": {"security.protocol": "SASL_PLAINTEXT",
                         "sasl.mechanisms": "OAUTHBEARER"} | jwt},
         "kafka.librdkafka.sasl.mechanisms"),
    ]:  # fmt: skip
        logs = _ClientLog(KafkaSettings.model_validate(kafka))
        logs.log(3, "%s", "FAIL", "rdkafka#producer-1", line)
        assert logs.check() == (key, True)
