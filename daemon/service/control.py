"""The control plane: query registrations through the control topic.

The control topic is the durable log of registrations. A request takes effect as
a marker in the input stream (between two input records, so at a well-defined
update); the daemon answers it with an `applied` record naming that position, and
a restart replays the log, re-applying each change at exactly the same point.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from csmd.connectors.kafka import KafkaSink, KafkaSource, client, producer_config
from csmd.connectors.records import Record
from csmd.errors import CsmdError, InputError, NotYetApplied
from csmd.model.formats import parse_query_text
from csmd.model.labels import NO_NAMES, LabelNames
from csmd.pipeline.stages import Marker, Pipeline
from csmd.schemas import CONTENT_TYPE, JSON
from csmd.service.context import DaemonContext, Intake
from csmd.service.delivery import unwatched

UNCLAIMED = 64  # results of applied admin requests kept for an admin call that starts waiting late
MAX_NAME = 200  # characters of a query name (the key of its delta records, a label of its metrics)


@dataclass
class QuerySpec:
    """A registered query as it is persisted: its text, so checkpoints and the control log can rebuild it."""

    name: str
    text: str
    count_only: bool = False
    distinct: bool = False  # one delta per subgraph instance (symmetry breaking)

    @classmethod
    def from_message(cls, msg: dict) -> "QuerySpec":
        """The spec of a checked control message (control_request); a remove has no query."""
        return cls(msg["name"], msg.get("query", ""), msg.get("count_only", False), msg.get("distinct", False))

    def register(self, pipe: Pipeline, labels: LabelNames = NO_NAMES, q=None) -> None:
        """Add the query to the pipeline (q: its text parsed already)."""
        q = parse_query_text(self.text, self.name, labels) if q is None else q
        pipe.add_query(self.name, q, self.count_only, self.distinct)


class QueryChange(Marker):
    """A control request taking effect between two input records.

    `request` is its control-topic offset; `at` the input position it takes effect
    before (partition -> offset); `announce` says whether the daemon still has to
    write the `applied` record (not when replaying one that was written before).
    """

    def __init__(self, action: str, spec: QuerySpec, request: int, at: dict[int, int], announce: bool,
                 labels: LabelNames = NO_NAMES):
        self.action, self.spec, self.request, self.at, self.announce = action, spec, request, at, announce
        self.error: str | None = None
        self._query = parse_query_text(spec.text, spec.name, labels) if action == "add" else None

    def at_executor(self, pipe: Pipeline) -> None:
        if self.action == "add":
            if self.spec.name in pipe.queries:  # replacing it would change what its deltas mean mid-stream
                self.error = f"a query named {self.spec.name!r} is registered already (remove it first)"
                return
            try:
                self.spec.register(pipe, q=self._query)
            except CsmdError as exc:  # what the engine refuses (the GPU's time constraints): an answer, not a crash
                self.error = str(exc)
        elif not pipe.remove_query(self.spec.name):
            self.error = f"no query named {self.spec.name!r}"


def control_request(body: bytes, source: str, labels: LabelNames = NO_NAMES) -> dict:
    """A control message, checked (a query's label names against `labels`); InputError(source,
    None, reason) when it is malformed."""
    try:
        msg = json.loads(body)
    except json.JSONDecodeError as exc:
        raise InputError(source, None, f"control message is not valid JSON: {exc}") from None
    except (ValueError, RecursionError) as exc:  # not UTF-8, nested too deep, a number too long: the record's
        # fault; raised past here it stopped the daemon, and every restart that replayed the control log
        raise InputError(source, None, f"control message is not readable JSON: {type(exc).__name__}: {exc}") from None
    if not isinstance(msg, dict) or msg.get("op") not in ("add", "remove", "applied"):
        raise InputError(source, None, "control message needs \"op\": \"add\", \"remove\" or \"applied\"")
    name = msg.get("name")
    if not isinstance(name, str) or not name:
        raise InputError(source, None, "control message needs a non-empty \"name\"")
    if len(name) > MAX_NAME or not name.isprintable() or name != name.strip():
        raise InputError(source, None, f"query name {name[:MAX_NAME]!r}: at most {MAX_NAME} printable characters, "
                                       f"no spaces around it")
    if msg["op"] == "add":
        if not isinstance(msg.get("query"), str):
            raise InputError(source, None, "\"add\" needs \"query\": the query graph as text")
        for flag in ("count_only", "distinct"):
            if not isinstance(msg.get(flag, False), bool):
                raise InputError(source, None, f"\"{flag}\" must be true or false")
        parse_query_text(msg["query"], f"{source} query {msg['name']}", labels)  # refuses bad graphs with their line
    if msg["op"] == "applied":  # read back at every start: a bad one must be refused here, not fail there
        at = msg.get("at")
        if not (_position(msg.get("request")) and isinstance(at, dict)
                and all(p.isascii() and p.isdecimal() and _position(o) for p, o in at.items())):
            raise InputError(source, None, "\"applied\" needs \"request\" (an offset) and \"at\" (partition -> "
                                           "offset)")
    return msg


def _position(x) -> bool:
    """A Kafka offset as JSON gives it: an integer from 0 to 2^63-1 (not a bool, which Python counts as one)."""
    return type(x) is int and 0 <= x < 1 << 63


# Instances of a cluster would each apply a change at their own input position, so shards
# would disagree on where a query starts; until they agree on one, the cluster refuses changes.
NOT_IN_CLUSTER = ("query changes at run time are not supported with [cluster] enabled yet: register the "
                  "queries through [queries] paths and restart the instances")


@dataclass
class Queries:
    """The registered queries as the output thread has seen them, what a checkpoint keeps of the
    control log, and each query's published delta counts."""

    specs: dict[str, QuerySpec] = field(default_factory=dict)  # registered now, as the output thread has seen
    removed: set[str] = field(default_factory=set)  # removed through the control topic (a restart must not re-add them)
    control_applied: int = -1  # highest control request offset whose change has passed the output
    totals: dict[str, list[int]] = field(default_factory=dict)  # query -> [positive, negative] deltas


class ControlPlane:
    """Replays, polls and answers control requests: each becomes a marker handed on into the
    pipeline (`intake`) at the input position `next_offsets` holds then (the consume loop's), and
    is recorded in `queries` and announced once it passes the output."""

    def __init__(self, ctx: DaemonContext, source: KafkaSource, sink: KafkaSink, queries: Queries, intake: Intake,
                 next_offsets: dict[int, int], dead_letter: Callable[[Record, str], None], conf: dict,
                 in_cluster: bool):
        self.ctx, self.source, self.sink, self.queries, self.intake = ctx, source, sink, queries, intake
        self.next_offsets, self.dead_letter, self.conf, self.in_cluster = next_offsets, dead_letter, conf, in_cluster
        self.scheduled: list[QueryChange] = []  # replayed changes waiting for their input position
        self._lock = threading.Lock()  # the admin's requests and waiters, the output thread's results
        self._waiters: dict[int, tuple[threading.Event, dict]] = {}  # admin requests waiting for `applied`
        # the last results nobody waited for yet: a request can take effect before its admin
        # call hears the broker's acknowledgement and starts waiting
        self._unclaimed: dict[int, dict] = {}
        self._requests = None  # producer of admin requests (outside any transaction of the daemon's)

    def _refused_in_cluster(self, rec: Record, msg: dict) -> bool:
        """In a cluster, a request nobody applied yet is logged and left alone (by every instance alike)."""
        if not self.in_cluster:
            return False
        self.ctx.log.error("control request ignored", record=rec.source, name=msg["name"], reason=NOT_IN_CLUSTER)
        return True

    def _change_now(self, op: str, spec: QuerySpec, request: int) -> None:
        """Hand a change on to take effect after the records submitted so far."""
        self.intake.put_marker(QueryChange(op, spec, request, dict(self.next_offsets), True, self.ctx.labels))

    def replay(self) -> None:
        """Requests logged since the checkpoint: replay those already applied at their recorded
        positions; apply the rest now."""
        requests, applied = {}, {}
        for rec in self.source.read_to_end():
            try:
                msg = control_request(rec.value, rec.source, self.ctx.labels)
            except InputError as exc:
                self.ctx.log.warning("malformed control record skipped", record=rec.source, reason=exc.reason)
                continue
            if msg["op"] == "applied":
                applied[msg["request"]] = msg
            else:
                requests[rec.offset] = (rec, msg)
        for offset, (rec, msg) in sorted(requests.items()):
            spec = QuerySpec.from_message(msg)
            done = applied.get(offset)
            if done is not None:
                at = {int(p): o for p, o in done["at"].items()}
                self.scheduled.append(QueryChange(msg["op"], spec, offset, at, False, self.ctx.labels))
            elif not self._refused_in_cluster(rec, msg):
                self._change_now(msg["op"], spec, offset)
        self.release_scheduled(None)

    def release_scheduled(self, rec: Record | None) -> None:
        """Enqueue replayed changes due before `rec` (all due at the start when rec is None)."""
        while self.scheduled:
            ch = self.scheduled[0]
            due = all(self.next_offsets.get(p, 0) >= o for p, o in ch.at.items()) or \
                (rec is not None and rec.offset >= ch.at.get(rec.partition, 1 << 62))
            if not due:
                return
            self.intake.put_marker(self.scheduled.pop(0))

    def poll(self) -> None:
        """New requests on the control topic (the consume loop, before each poll of the input)."""
        for rec in self.source.poll(100, 0):
            try:
                msg = control_request(rec.value, rec.source, self.ctx.labels)
            except InputError as exc:
                self.dead_letter(rec, exc.reason)
                continue
            if msg["op"] == "applied" or rec.offset <= self.queries.control_applied or \
                    self._refused_in_cluster(rec, msg):
                continue  # our own announcements, or requests replayed at start
            self._change_now(msg["op"], QuerySpec.from_message(msg), rec.offset)

    def changed(self, ch: QueryChange) -> None:
        """A query change passed the output stage: record it, announce it, wake an admin waiting for it."""
        q = self.queries
        if ch.error is None:
            if ch.action == "add":
                q.specs[ch.spec.name] = ch.spec
                q.totals[ch.spec.name] = [0, 0]
                self.ctx.metrics.query(ch.spec.name)
                q.removed.discard(ch.spec.name)
            else:
                q.specs.pop(ch.spec.name, None)
                q.removed.add(ch.spec.name)
        q.control_applied = max(q.control_applied, ch.request)
        result = {"op": "applied", "request": ch.request, "name": ch.spec.name, "action": ch.action,
                  "at": {str(p): o for p, o in ch.at.items()}, "seq": ch.seq, "error": ch.error}
        self.ctx.log.info("query change applied", **{k: v for k, v in result.items() if k != "op"})
        if ch.announce:
            self.sink.produce(self.ctx.cfg.topics.control, json.dumps(result).encode(), ch.spec.name,
                              {CONTENT_TYPE: JSON}, unwatched, ())
        with self._lock:
            waiter = self._waiters.pop(ch.request, None)
            if waiter is None:
                self._unclaimed[ch.request] = result
                if len(self._unclaimed) > UNCLAIMED:
                    self._unclaimed.pop(next(iter(self._unclaimed)))
        if waiter is not None:
            waiter[1].update(result)
            waiter[0].set()

    def request_change(self, msg: dict, timeout: float = 30.0) -> dict:
        """Write a control request (from the admin endpoint) and wait until it takes effect."""
        cfg = self.ctx.cfg
        control_request(json.dumps(msg).encode(), "request", self.ctx.labels)  # refuse bad requests before logging them
        if self.in_cluster:
            raise CsmdError(NOT_IN_CLUSTER)
        done = threading.Event()
        offset: list = []

        def delivered(err, m):
            offset.append(err or m.offset())
            done.set()

        from confluent_kafka import Producer

        with self._lock:
            if self._requests is None:
                self._requests = client(Producer, producer_config(self.conf, cfg.kafka.producer))
        self._requests.produce(cfg.topics.control, json.dumps(msg).encode(), msg["name"],
                               headers={CONTENT_TYPE: JSON}, on_delivery=delivered)
        self._requests.flush(timeout)
        if not done.wait(timeout) or not isinstance(offset[0], int):
            raise CsmdError(f"the control topic did not take the request: {offset[0] if offset else 'timeout'}")
        event, result = threading.Event(), {}
        with self._lock:
            if offset[0] in self._unclaimed:
                return self._unclaimed.pop(offset[0])
            self._waiters[offset[0]] = (event, result)
        if not event.wait(timeout):
            raise NotYetApplied("the request was logged but has not taken effect yet (the daemon is busy)")
        return result

    def close(self) -> None:
        self.source.close()
