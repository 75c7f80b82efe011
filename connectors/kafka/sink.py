"""The Kafka sink: an idempotent producer (acks=all) whose delivery reports settle batches.

librdkafka serves delivery reports from ``poll()``, which the sink calls on the event loop. The
broker's position (``mark``) is the last offset per partition that delivery reports showed, so
that a restart reads the partitions back from there (docs/design.md “Guarantees”).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from connectors.kafka.config import KafkaConnector, KafkaSettings
from core.engine.sink import BatchError, FatalError, RetryableError
from core.envelope import BrokerMark, Message, key_prefixes
from core.failures import Unreachable
from core.redact import Said, said
from core.templates import Unrouted

log = logging.getLogger("weir.kafka")

# Refusals that say the message was not stored; any other delivery error leaves it in doubt.
TOO_LARGE = {KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE,
             KafkaError.INVALID_MSG_SIZE, KafkaError.INVALID_RECORD}  # fmt: skip
NOT_STORED = {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC,
              KafkaError._UNKNOWN_PARTITION, KafkaError.TOPIC_AUTHORIZATION_FAILED,
              KafkaError.TOPIC_EXCEPTION}  # fmt: skip
REPEAT_QUIET = 60.0  # seconds in which librdkafka's same log line is logged once
librdkafka_log = logging.getLogger("weir.kafka.client")  # librdkafka's own log lines
POLL_BUSY = 0.001  # seconds between polls for delivery reports while batches wait
POLL_IDLE = 1.0  # and while none does
METADATA_WAIT = 10  # seconds the brokers have to answer a new session, asked each second
READ_BACK_STALL = 30.0  # seconds without progress before a read-back gives up


class _Once(logging.Filter):
    """Lets a line through once per REPEAT_QUIET seconds: librdkafka logs a refused connection
    at every reconnect, a few times a second, and the numbers in it change every time.
    """

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        line = re.sub(r"\d+", "#", record.getMessage())
        now = time.monotonic()
        if now - self.seen.get(line, -REPEAT_QUIET) < REPEAT_QUIET:
            return False
        if len(self.seen) > 1000:
            self.seen.clear()
        self.seen[line] = now
        return True


librdkafka_log.addFilter(_Once())


class _Lines:
    """The ``logger`` of a client: passes librdkafka's lines on to ``librdkafka_log``, the
    client's name as Weir's own: its client.id (``weir-NAME``, from the config) and the
    instance librdkafka adds (``#producer-2``). A password ``weir`` read ``[***-NAME#…]``
    (found by an outside tester); what librdkafka says is masked as a log line's values are.
    """

    def log(self, level: int, fmt: str, facility: str, client: str, line: str) -> None:
        librdkafka_log.log(level, fmt, facility, Said(client), line)


class _ClientLog(_Lines):
    """The ``logger`` of a sink's clients: passes librdkafka's lines on (:class:`_Lines`)
    and keeps the last connection failure, often the only place librdkafka says why it cannot
    reach a broker (a refused SASL login, a TLS handshake, a closed connection).
    """

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self.failure: str | None = None

    def log(self, level: int, fmt: str, facility: str, client: str, line: str) -> None:
        if facility == "FAIL":
            self.failure = line.split("]: ", 1)[-1]  # without librdkafka's thread name
        super().log(level, fmt, facility, client, line)

    def check(self) -> tuple[str, bool]:
        """What the user should check after the last failure, and whether it is for good:
        the broker refused the SASL credentials or lacks the mechanism, which trying again
        cannot change. The mechanism is named where the config gives it (librdkafka: may)."""
        failure = self.failure or ""
        if "SASL authentication error" in failure:
            return "kafka.sasl's username and password", True
        if "Unsupported SASL mechanism" in failure:  # the broker takes others
            return self.settings.key_of("sasl.mechanism"), True
        if "SASL" in failure or "SSL" in failure:
            return "kafka.sasl and kafka.tls", False
        return "kafka.bootstrap_servers", False


def client_config(s: KafkaSettings, name: str) -> dict[str, Any]:
    """Connection properties shared by the producer, the read-back consumer and the admin."""
    return s.client_properties(name) | {"logger": _Lines()}


def producer_config(s: KafkaSettings, name: str) -> dict[str, Any]:
    return s.producer_properties(name) | {"logger": _Lines()}


@dataclass(eq=False)
class _Batch:
    """A batch waiting for its delivery reports. ``report`` is the delivery callback of its
    messages, each bound to its place in the batch (a report's key or value may be another
    message's too: a route's key, a steps' payload), and what it keeps of a report is what
    settling the batch needs, the last offset per partition and the failures.
    """

    fut: asyncio.Future[None]
    remaining: int
    ends: dict[tuple[str, int], int] = field(default_factory=dict)  # last offset, by partition
    errors: list[tuple[int, KafkaError]] = field(default_factory=list)  # by place in the batch

    def report(self, at: int, err: KafkaError | None, msg: Any) -> None:
        if self.fut.done():  # the batch was given up (overdue, or the sink closed)
            return
        if err is None:
            self.ends[(msg.topic(), msg.partition())] = msg.offset()
        else:
            self.errors.append((at, err))
        self.count_down()

    def count_down(self) -> None:
        self.remaining -= 1
        if self.remaining == 0:
            self.fut.set_result(None)


class KafkaSink:
    """One connector's producer (see core/engine/sink.py for the contract)."""

    def __init__(self, cfg: KafkaConnector) -> None:
        self.cfg = cfg
        self.settings = cfg.kafka
        self.topics = cfg.places()
        self._producer: Producer | None = None
        self._poller: asyncio.Task[None] | None = None
        self._mark: BrokerMark = {}
        self._broken: KafkaError | None = None
        self._pending: set[_Batch] = set()  # batches waiting for delivery reports
        self._headers: dict[tuple[str, str | None], list[tuple[str, str | bytes | None]]] = {}
        self._waiting = asyncio.Event()  # set while there are any

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            raise RuntimeError("KafkaSink used before connect()")
        return self._producer

    async def connect(self) -> None:
        logs = _ClientLog(self.settings)
        conf = producer_config(self.settings, self.cfg.name)
        self._producer = Producer(conf | {"logger": logs, "error_cb": self._on_error})
        self.admin = AdminClient(client_config(self.settings, self.cfg.name) | {"logger": logs})
        self._poller = asyncio.create_task(self._poll(), name=f"kafka-{self.cfg.name}")
        try:
            for waited in range(METADATA_WAIT):  # a second at a time: a refusal ends it at once
                try:
                    await asyncio.to_thread(self.admin.list_topics, timeout=1)
                    break
                except KafkaException:
                    if logs.check()[1] or waited == METADATA_WAIT - 1:
                        raise
            self._mark = await asyncio.to_thread(self._ends)
        except KafkaException as e:  # librdkafka's own reason says more (SASL, TLS, refused)
            if logs.failure is None:
                raise
            check, refused = logs.check()
            if refused:
                where = self.settings.bootstrap_servers
                raise Unreachable("Kafka", where, logs.failure, check, for_good=True) from e
            raise ConnectionError(said("cannot reach the brokers: %s", logs.failure)) from e

    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():  # the idempotent producer cannot go on: a new session, a new producer
            self._broken = err
        log.debug("connector %s: kafka: %s", self.cfg.name, err)

    def _partitions(self) -> list[TopicPartition]:
        """Every partition of the topics this connector produces to, as far as they exist."""
        topics = self.admin.list_topics(timeout=10).topics
        pattern = self.topics.pattern("[A-Za-z0-9._-]+")
        names = [t for t in topics if pattern.fullmatch(t)]
        return [TopicPartition(t, p) for t in names for p in topics[t].partitions]

    def _ends(self) -> BrokerMark:
        """The last offset of every partition now. A broker that answers low (as some
        Kafka-protocol brokers do, by a batch) only makes a later read-back read a little more.
        """
        tps = self._partitions()
        if not tps:
            return {}
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        offsets = self.admin.list_offsets({tp: latest for tp in tps}, request_timeout=10)
        return {_key(tp.topic, tp.partition): f.result(timeout=15).offset - 1
                for tp, f in offsets.items()}  # fmt: skip

    async def _poll(self) -> None:
        """Serve delivery reports on the event loop, so that a report needs no hand-off of the
        GIL between threads: busy while batches wait for reports, once a second otherwise (for
        librdkafka's errors and logs).
        """
        producer, waiting = self.producer, self._waiting
        while True:
            if producer.poll(0):
                await asyncio.sleep(0)
            elif waiting.is_set():
                await asyncio.sleep(POLL_BUSY)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(waiting.wait(), POLL_IDLE)

    def _forget(self, state: _Batch) -> None:
        self._pending.discard(state)
        if not self._pending:
            self._waiting.clear()

    async def write_batch(self, batch: Sequence[Message]) -> None:
        if self._broken is not None:
            raise ConnectionError(said("kafka producer failed: %s", self._broken.str()))
        producer = self.producer
        state = _Batch(asyncio.get_running_loop().create_future(), len(batch))
        self._pending.add(state)
        self._waiting.set()
        failed: dict[int, Exception] = {}
        topic_of, shared, report = self.topics.render, self._headers, state.report
        for i, m in enumerate(batch):
            # The headers a collection's (events: and action's) messages share, made once.
            common = shared.get((m.collection_id, m.action))
            if common is None:
                common = [("collection_id", m.collection_id.encode())]
                if m.action is not None:
                    common.append(("action", m.action.encode()))
                shared[(m.collection_id, m.action)] = common
            headers: list[tuple[str, str | bytes | None]] = [
                ("idempotency_key", m.key.encode()), *common]  # fmt: skip
            while True:
                try:
                    key = m.group if m.route is None else m.route.get("key", m.group)
                    producer.produce(topic_of(m), m.payload, key.encode(),
                                     on_delivery=partial(report, i), headers=headers)  # fmt: skip
                    break
                except BufferError:  # the local queue is full: wait for reports to free it
                    await asyncio.sleep(POLL_BUSY)
                except KafkaException as e:
                    failed[i] = _refused(e.args[0])
                    state.count_down()
                    break
                except Unrouted as e:
                    failed[i] = FatalError(str(e))
                    state.count_down()
                    break
        timeout = self.settings.delivery_timeout.total_seconds() + 10
        try:
            await asyncio.wait_for(state.fut, timeout)
        except TimeoutError:
            raise ConnectionError(
                said("kafka delivery reports overdue after %ss", format(timeout, ".0f"))
            ) from None
        finally:
            self._forget(state)
        mark = self._mark
        for (topic, partition), offset in state.ends.items():
            key = _key(topic, partition)
            if offset > mark.get(key, -1):
                mark[key] = offset
        if state.errors:
            in_doubt: list[KafkaError] = []
            for at, err in state.errors:
                if err.code() in TOO_LARGE or err.code() in NOT_STORED:
                    failed[at] = _refused(err)
                else:
                    in_doubt.append(err)
            if in_doubt:  # maybe stored, maybe not: a new session reads the partitions back
                raise ConnectionError(
                    said("%s kafka deliveries in doubt: %s", len(in_doubt), in_doubt[0].str())
                )
        if failed:
            raise BatchError(failed)

    def mark(self) -> BrokerMark:
        return dict(self._mark)

    async def read_back(self, mark: BrokerMark, sync_ids: Sequence[str]) -> set[str]:
        prefixes = tuple(p for s in sync_ids for p in key_prefixes(s))
        return await asyncio.to_thread(self._read_back, mark, prefixes)

    def _read_back(self, mark: BrokerMark, prefixes: tuple[str, ...]) -> set[str]:
        """Idempotency keys of these sources' messages after ``mark``, up to each partition's
        end (a partition missing from the mark is read from its start).
        """
        tps = [TopicPartition(t.topic, t.partition, mark.get(_key(t.topic, t.partition), -1) + 1)
               for t in self._partitions()]  # fmt: skip
        keys: set[str] = set()
        if not tps:
            return keys
        consumer = Consumer(client_config(self.settings, self.cfg.name) | {
            "group.id": f"weir-read-back-{self.cfg.name}", "enable.auto.commit": False,
            "enable.partition.eof": True, "auto.offset.reset": "earliest",
        })  # fmt: skip
        try:
            consumer.assign(tps)
            left = {(tp.topic, tp.partition) for tp in tps}
            last = time.monotonic()
            while left:
                msgs = consumer.consume(1000, timeout=0.1)
                if msgs:
                    last = time.monotonic()
                elif time.monotonic() - last > READ_BACK_STALL:
                    raise ConnectionError(said("kafka read-back stalled on %s", sorted(left)[:3]))
                for msg in msgs:
                    if (err := msg.error()) is not None:
                        if err.code() != KafkaError._PARTITION_EOF:
                            raise KafkaException(err)
                        left.discard((msg.topic(), msg.partition()))
                        continue
                    headers: list[tuple[str, Any]] = msg.headers() or []  # type: ignore[assignment]
                    for name, value in headers:
                        if name == "idempotency_key" and isinstance(value, bytes):
                            key = value.decode()
                            if key.startswith(prefixes):
                                keys.add(key)
            return keys
        finally:
            consumer.close()

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
        for state in self._pending:  # given up: flush() below serves their reports elsewhere
            state.fut.cancel()
        if self._producer is not None:
            await asyncio.to_thread(self._producer.flush, 5.0)


def _key(topic: str, partition: int) -> str:
    """A partition's entry in the mark (a topic name never holds ':')."""
    return f"{topic}:{partition}"


def _refused(err: KafkaError) -> Exception:
    """A message the broker did not store: too large never fits, the rest may later."""
    text = f"Kafka {err.name()}: {err.str()}"
    return FatalError(text) if err.code() in TOO_LARGE else RetryableError(text)


def make_sink(cfg: KafkaConnector) -> KafkaSink:
    return KafkaSink(cfg)
