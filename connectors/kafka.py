"""Kafka source and sink (confluent-kafka): the daemon's way in and out.

The source reads every partition of one topic by assignment, not by group
balancing: one daemon holds the whole graph, so it must see every partition in
order. The consumer group exists only to keep the committed offsets. The sink
is the one producer of the daemon: deltas, dead letters and control records all
go through it, so delivery is handled in one place.
"""

from __future__ import annotations

import json
import threading
import time

import pyarrow as pa
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from csmd.errors import CsmdError
from csmd.schemas import ARROW_STREAM, CONTENT_TYPE, DELTAS_VERSION, SCHEMA_HEADER

from .records import Polled, Record


# Settings csmd's guarantees rest on; the user's [kafka] client/consumer/producer tables may not set them.
FIXED = {
    "bootstrap.servers": "[kafka] bootstrap", "group.id": "[kafka] group", "auto.offset.reset": "[kafka] offset_reset",
    "transactional.id": "[kafka] transactional_id", "message.timeout.ms": "[delivery] timeout_s",
    "enable.auto.commit": "csmd (it commits only delivered offsets)", "enable.auto.offset.store": "csmd",
    "isolation.level": "csmd", "enable.idempotence": "csmd", "acks": "csmd",
    "error_cb": "csmd", "logger": "csmd", "stats_cb": "csmd (the broker watch)",
}


def librdkafka_settings(table: dict) -> dict:
    """A TOML table of librdkafka settings as confluent-kafka takes them."""
    return {k: (v if isinstance(v, (str, int, float, bool)) else str(v)) for k, v in table.items()}


class _Log:
    """librdkafka's own log lines, into the structured log at debug level: what matters in them
    reaches error_cb as well, and a broker that is down would otherwise print hundreds of lines."""

    def __init__(self, log):
        self._log = log

    def log(self, _level, fmt, *args):
        if self._log is not None:
            self._log.debug("librdkafka", line=fmt % args if args else fmt)


def client_config(bootstrap: str, extra: dict | None = None, on_error=None, log=None) -> dict:
    """Settings every client gets: the bootstrap address, the user's [kafka] client settings,
    on_error(KafkaError) for the client's errors and librdkafka's log lines into `log`."""
    conf = {"bootstrap.servers": bootstrap, "logger": _Log(log), **librdkafka_settings(extra or {})}
    if on_error is not None:
        conf["error_cb"] = on_error
    return conf


def client(kind, conf: dict):
    """A Consumer, Producer or AdminClient; settings librdkafka refuses together (sasl.* without
    a password, say) are a one-line error, not a traceback."""
    try:
        return kind(conf)
    except KafkaException as exc:
        raise CsmdError(f"Kafka client settings ([kafka] client/consumer/producer): {exc.args[0].str()}") from None


def broker_down(conf: dict, exc) -> CsmdError:
    """The one message for a broker that does not answer, with what to do about it."""
    return CsmdError(f"Kafka at {conf['bootstrap.servers']} does not answer ({exc.args[0].str() if exc.args else exc}); "
                     f"start a broker there (`csmd broker` runs one locally) or set [kafka] bootstrap "
                     f"(CSMD_KAFKA__BOOTSTRAP)")


def ensure_topics(conf: dict, partitions: dict[str, int], replication: int = 1, timeout: float = 15.0) -> None:
    """Create the topics that do not exist yet (brokers may auto-create with the wrong partition count)."""
    admin = client(AdminClient, conf)
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as exc:
        raise broker_down(conf, exc) from None
    new = [NewTopic(t, n, replication) for t, n in partitions.items() if t not in existing]
    for topic, fut in (admin.create_topics(new, operation_timeout=timeout) if new else {}).items():
        try:
            fut.result(timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise CsmdError(f"cannot create topic {topic!r}: {exc}") from None


def topic_partitions(conf: dict, topic: str, timeout: float = 15.0) -> list[int]:
    try:
        md = client(AdminClient, conf).list_topics(topic, timeout=timeout).topics.get(topic)
    except KafkaException as exc:
        raise broker_down(conf, exc) from None
    if md is None or md.error is not None or not md.partitions:
        raise CsmdError(f"topic {topic!r} does not exist (set [topics] create = true, or create it)")
    return sorted(md.partitions)


def input_positions(conf: dict, topic: str, group: str, timeout: float = 15.0) -> tuple[dict[int, int], dict[int, int]]:
    """(end offset, the group's committed offset) of each partition of `topic`; committed is
    absent where the group has none. Ends are the high watermarks of a fetch (some brokers
    answer a direct watermark query wrongly)."""
    parts = topic_partitions(conf, topic)
    c = client(Consumer, {**conf, "group.id": group, "enable.auto.commit": False, "fetch.wait.max.ms": 5})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in parts], timeout=timeout)
        committed = {tp.partition: tp.offset for tp in tps if tp.offset >= 0}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        ends: dict[int, int] = {}
        deadline = time.monotonic() + timeout
        while len(ends) < len(parts):
            if time.monotonic() > deadline:
                raise CsmdError(f"topic {topic!r}: no partition ends from Kafka at {conf['bootstrap.servers']} "
                                f"within {timeout:.0f} s")
            c.consume(1000, 0.05)  # the records are not used: the fetch brings the watermarks
            for p in parts:
                hi = c.get_watermark_offsets(TopicPartition(topic, p), cached=True)[1]
                if hi >= 0:
                    ends[p] = hi
    finally:
        c.close()
    return ends, committed


def brokers_up(stats: str) -> bool:
    """Whether a client's statistics (librdkafka's JSON) show a connection to a broker that is up
    (the bootstrap address's own entry, nodeid -1, aside)."""
    brokers = json.loads(stats).get("brokers", {})
    return any(b.get("state") == "UP" for b in brokers.values() if b.get("nodeid", -1) >= 0)


class KafkaSource:
    """Every partition of `topic`, from `start` offsets (partition -> next offset).

    reset: where a partition without a start offset begins, and where one whose offset
    is out of range continues: "earliest" (the whole topic) or "latest" (only what
    arrives from now). settings: the user's librdkafka consumer settings.
    """

    def __init__(self, conf: dict, topic: str, group: str, start: dict[int, int] | None = None,
                 reset: str = "earliest", settings: dict | None = None, on_brokers=None):
        self.topic = topic
        self.partitions = topic_partitions(conf, topic)
        self._on_error = conf.get("error_cb")
        # on_brokers(up): each second, whether a broker connection is up (librdkafka's statistics;
        # its errors say when brokers go away, nothing says when they are back)
        watch = {"statistics.interval.ms": 1000, "stats_cb": lambda s: on_brokers(brokers_up(s))} if on_brokers else {}
        self.consumer = client(Consumer, {
            **conf, "fetch.wait.max.ms": 5, **librdkafka_settings(settings or {}), **watch, "group.id": group,
            "enable.auto.commit": False, "enable.auto.offset.store": False, "auto.offset.reset": reset,
            "isolation.level": "read_committed",
        })
        start = start or {}
        begin = OFFSET_BEGINNING if reset == "earliest" else OFFSET_END
        self._tps = [TopicPartition(topic, p, start.get(p, begin)) for p in self.partitions]
        self.consumer.assign(self._tps)

    def poll(self, max_records: int = 500, timeout: float = 0.05) -> Polled:
        """Up to max_records records: what is fetched already, else waits up to `timeout` for the first."""
        msgs = self.consumer.consume(max_records, 0)
        if not msgs and timeout > 0:  # consume(n, t) waits for all n: wait for one, then take the rest
            msgs = self.consumer.consume(1, timeout)
            if msgs:
                msgs += self.consumer.consume(max_records - 1, 0)
        if any(m.error() is not None for m in msgs):
            msgs = [m for m in msgs if not self._failed(m.error())]
        return Polled(self.topic, [m.partition() for m in msgs], [m.offset() for m in msgs],
                      [m.value() or b"" for m in msgs], [m.headers() for m in msgs], [m.key() for m in msgs])

    def _failed(self, err) -> bool:
        """Whether a message is an error (reported, or raised when fatal) rather than a record."""
        if err is None:
            return False
        if err.code() != KafkaError._PARTITION_EOF:
            if err.fatal():
                raise CsmdError(f"Kafka consumer failed: {err.str()}")
            if self._on_error is not None:  # transient: librdkafka retries by itself
                self._on_error(err)
        return True

    def commit(self, offsets: dict[int, int], wait: bool = True) -> None:
        """Commit partition -> next offset; wait=False returns at once (the consume loop must not
        stall for a broker round trip; a lost asynchronous commit only means an older offset)."""
        if offsets:
            self.consumer.commit(offsets=[TopicPartition(self.topic, p, o) for p, o in offsets.items()],
                                 asynchronous=not wait)

    def end_offsets(self) -> dict[int, int]:
        """High watermarks as last fetched (cached: some brokers answer fresh queries wrongly)."""
        out = {}
        for p in self.partitions:
            _lo, hi = self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)
            if hi >= 0:
                out[p] = hi
        return out

    def read_to_end(self, idle: float = 0.3, timeout: float = 30.0) -> list[Record]:
        """Everything up to the current end (for replaying a log such as the control topic)."""
        out: list[Record] = []
        deadline = time.monotonic() + timeout
        quiet_since = time.monotonic()
        while time.monotonic() < deadline:
            recs = self.poll(1000, 0.05).records()
            out += recs
            if recs:
                quiet_since = time.monotonic()
                continue
            pos = {tp.partition: tp.offset for tp in self.consumer.position(self._tps)}
            ends = self.end_offsets()
            # an end not known yet (no fetch answered) is not "empty": a slow first fetch read as an empty log
            caught_up = all(p in ends and (pos.get(p, -1) >= ends[p] or ends[p] == 0) for p in self.partitions)
            if caught_up and time.monotonic() - quiet_since >= idle:
                return out
        raise CsmdError(f"could not read topic {self.topic!r} to its end within {timeout:.0f} s")

    def group_metadata(self):
        return self.consumer.consumer_group_metadata()

    def close(self) -> None:
        self.consumer.close()


def producer_config(conf: dict, settings: dict | None, timeout_s: float = 120.0) -> dict:
    """Every producer of the daemon: idempotent, acks from all replicas, the user's producer settings.
    linger.ms 0: a record with deltas goes out at once (2 ms of lingering were 2 ms of its latency);
    under load the records still batch, behind the requests in flight (docs/daemon.md)."""
    return {**conf, "linger.ms": 0, **librdkafka_settings(settings or {}), "enable.idempotence": True, "acks": "all",
            "message.timeout.ms": int(timeout_s * 1000)}


_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # an Arrow IPC stream's end marker
_last_schema: tuple = (None, b"")  # the last schema and its IPC message (a race between threads recomputes it)


def arrow_messages(batch: pa.RecordBatch, max_bytes: int) -> list[bytes]:
    """The batch as Arrow IPC stream messages, each under max_bytes (split by rows where needed).

    A stream is its schema's message, the batch's and the end marker, the bytes a stream writer
    writes; the schema's is kept from the last call, since a writer per message (some 16 us,
    reading an environment variable each time) cost more than the batch for a query's few deltas."""
    global _last_schema
    schema, head = _last_schema
    if schema is None or not batch.schema.equals(schema):
        _last_schema = schema, head = batch.schema, batch.schema.serialize().to_pybytes()
    data = head + batch.serialize().to_pybytes() + _EOS
    if len(data) <= max_bytes:
        return [data]
    if batch.num_rows <= 1:
        raise CsmdError(f"one delta row takes {len(data)} bytes, more than [topics] max_message_bytes = {max_bytes}")
    # pieces of the rows that should fit, by the bytes a row took here (halving would serialize
    # a batch of a million deltas some ten times over); at least two, each checked again
    step = max(1, min(batch.num_rows // 2, batch.num_rows * max_bytes * 9 // (10 * len(data))))
    return [m for lo in range(0, batch.num_rows, step) for m in arrow_messages(batch.slice(lo, step), max_bytes)]


class KafkaSink:
    """The producer: idempotent, optionally transactional; every delivery ends in a defined state.

    on_ack(origins) runs for every produced record once the broker has it (on the
    sink's delivery thread, or in `poll` / `flush`). librdkafka retries a retriable error with backoff for up to
    `timeout_s`; a record still undelivered then, or refused for good (too large,
    not authorized), calls on_failed(reason) instead, once per record: the caller
    stops, and never commits past it, so a restart sends it again.
    """

    def __init__(self, conf: dict, topic: str, max_message_bytes: int, on_failed, timeout_s: float = 120.0,
                 transactional_id: str | None = None, settings: dict | None = None):
        self.topic, self.max_message_bytes = topic, max_message_bytes
        self._on_failed = on_failed
        pconf = producer_config(conf, settings, timeout_s)
        pconf["message.max.bytes"] = max(max_message_bytes + 65536, int(pconf.get("message.max.bytes", 0)))
        if transactional_id:  # librdkafka wants a message's timeout within its transaction's
            pconf.update({"transactional.id": transactional_id,
                          "transaction.timeout.ms": max(60_000, pconf["message.timeout.ms"])})
        self.producer = client(Producer, pconf)
        self.transactional = bool(transactional_id)
        self.extra_headers: dict[str, bytes] = {}  # on every delta record (a cluster instance's name)
        self._in_txn = False
        if self.transactional:
            self.producer.init_transactions(30)
        # delivery reports served as they come, on a thread of their own, not when the consume loop
        # next polls: it waits up to its poll timeout for input, and a record counts as done (its
        # latency, its offset committable) only once its report is served
        self._closing = threading.Event()
        self._reports = threading.Thread(target=self._serve_reports, name="csmd-delivery", daemon=True)
        self._reports.start()

    def _serve_reports(self) -> None:
        while not self._closing.is_set():
            self.producer.poll(0.05)

    def produce(self, topic: str, value: bytes, key: str | bytes | None, headers: dict | list, on_ack, origins) -> None:
        if self.transactional and not self._in_txn:
            self.producer.begin_transaction()
            self._in_txn = True

        def report(err, _msg):
            if err is None:
                on_ack(origins)
            else:
                self._on_failed(f"delivery to {topic!r} failed: {err.str()}")

        while True:
            try:
                self.producer.produce(topic, value=value, key=key, headers=headers, on_delivery=report)
                return
            except BufferError:  # the local queue is full: serve delivery reports, then retry
                self.producer.poll(0.05)
            except KafkaException as exc:  # refused before sending (too large for the producer, ...)
                self._on_failed(f"delivery to {topic!r} failed: {exc.args[0].str()}")
                return

    def write(self, items, on_ack, on_send=None) -> int:
        """Deltas to the output topic: one Arrow IPC record per query and batch (split to fit),
        keyed by query; on_send(origins) runs before each record is produced. Returns the count."""
        n = 0
        headers = {CONTENT_TYPE: ARROW_STREAM, SCHEMA_HEADER: DELTAS_VERSION, **self.extra_headers}
        for query, batch, origins in items:
            for data in arrow_messages(batch, self.max_message_bytes):
                if on_send is not None:
                    on_send(origins)
                self.produce(self.topic, data, query, headers, on_ack, origins)
                n += 1
        return n

    def poll(self, timeout: float = 0.0) -> None:
        self.producer.poll(timeout)

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait for every delivery report; False if some are still outstanding."""
        return self.producer.flush(timeout) == 0

    def commit_transaction(self, offsets: list[TopicPartition], group_metadata) -> None:
        """Deltas so far and the input offsets they cover, atomically (transactions only)."""
        if not self._in_txn:
            self.producer.begin_transaction()
        if offsets:
            self.producer.send_offsets_to_transaction(offsets, group_metadata, 30)
        self.producer.commit_transaction(60)
        self._in_txn = False

    def close(self) -> None:
        self._closing.set()
        self._reports.join()
        self.producer.flush(30)
