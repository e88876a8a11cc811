"""`csmd run`: the daemon. Kafka in, the GU/EX/GC pipeline, Arrow deltas out.

Threads: the main thread consumes input and control records, decodes them and
feeds the pipeline, commits offsets and takes checkpoints; the pipeline runs
GU and EX in its own threads and hands results, in stream order, to the output
thread, which encodes deltas and produces them; the admin endpoint serves HTTP.

Delivery is at-least-once: an input offset is committed only after every delta
it caused is acknowledged (daemon/delivery.py). On start the daemon restores
the newest checkpoint (or the initial graph) and re-reads the input from the
checkpoint's offsets; deltas of records below the committed offsets were
delivered before and are not sent again, so only the records between the last
commit and a crash can be published twice, with the same delta ids.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from confluent_kafka import KafkaException

from csmd.connectors.kafka import KafkaSink, KafkaSource, client_config, ensure_topics
from csmd.connectors.records import BadRecord, Record, decode_updates
from csmd.schemas import JSON, CONTENT_TYPE

from csmd.service.checkpoint import read_checkpoint, write_checkpoint
from csmd.pipeline.deltas import DeltaEncoder
from csmd.service.delivery import DeliveryTracker
from csmd.errors import CsmdError, InputError, NotYetApplied
from csmd.model.formats import parse_query_text, query_files, read_graph
from csmd.model.graph import Graph
from csmd.service.logs import get_logger
from csmd.service.metrics import Metrics
from csmd.engines import continuous_engine
from csmd.pipeline.stages import Marker, Pipeline

_STOP = object()


@dataclass
class QuerySpec:
    """A registered query as it is persisted: its text, so checkpoints and the control log can rebuild it."""

    name: str
    text: str
    count_only: bool = False

    def register(self, pipe: Pipeline) -> None:
        pipe.add_query(self.name, parse_query_text(self.text, self.name), self.count_only)


class QueryChange(Marker):
    """A control request taking effect between two input records.

    `request` is its control-topic offset; `at` the input position it takes effect
    before (partition -> offset); `announce` says whether the daemon still has to
    write the `applied` record (not when replaying one that was written before).
    """

    def __init__(self, action: str, spec: QuerySpec, request: int, at: dict[int, int], announce: bool):
        self.action, self.spec, self.request, self.at, self.announce = action, spec, request, at, announce
        self.error: str | None = None
        self._query = parse_query_text(spec.text, spec.name) if action == "add" else None

    def at_executor(self, pipe: Pipeline) -> None:
        if self.action == "add":
            pipe.add_query(self.spec.name, self._query, self.spec.count_only)
        elif not pipe.remove_query(self.spec.name):
            self.error = f"no query named {self.spec.name!r}"


class CheckpointMarker(Marker):
    """Where a checkpoint is taken: the graph is copied in the updater stage, exactly after
    the records before the marker (`offsets`: the next offset of each partition), without
    draining the pipeline; the queries are those registered when it reaches the output."""

    def __init__(self, offsets: dict[int, int]):
        self.offsets = dict(offsets)
        self.graph = None

    def at_updater(self, pipe: Pipeline) -> None:
        self.graph = pipe.graph_state()


def control_request(body: bytes, source: str) -> dict:
    """A control message, checked; InputError(source, None, reason) when it is malformed."""
    try:
        msg = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(source, None, f"control message is not valid JSON: {exc}") from None
    if not isinstance(msg, dict) or msg.get("op") not in ("add", "remove", "applied"):
        raise InputError(source, None, "control message needs \"op\": \"add\", \"remove\" or \"applied\"")
    if not isinstance(msg.get("name"), str) or not msg["name"]:
        raise InputError(source, None, "control message needs a non-empty \"name\"")
    if msg["op"] == "add":
        if not isinstance(msg.get("query"), str):
            raise InputError(source, None, "\"add\" needs \"query\": the query graph as text")
        if not isinstance(msg.get("count_only", False), bool):
            raise InputError(source, None, "\"count_only\" must be true or false")
        parse_query_text(msg["query"], f"{source} query {msg['name']}")  # refuses bad graphs with their line
    if msg["op"] == "applied" and not (isinstance(msg.get("request"), int) and isinstance(msg.get("at"), dict)):
        raise InputError(source, None, "\"applied\" needs \"request\" and \"at\"")
    return msg


class Daemon:
    def __init__(self, cfg: dict, log=None):
        self.cfg = cfg
        self.log = log or get_logger()
        self.metrics = Metrics()
        self._describe_metrics()
        self.stopping = threading.Event()
        self.status = "starting"
        self.fatal: str | None = None
        self.paused = False  # backpressure: the consumer takes no records
        self.specs: dict[str, QuerySpec] = {}  # registered now, as the output thread has seen
        self.removed: set[str] = set()  # removed through the control topic (a restart must not re-add them)
        self.totals: dict[str, list[int]] = {}
        self.control_applied = -1  # highest control request offset whose change has passed the output
        self._inq: queue.Queue = queue.Queue()
        self._markers_in_flight = 0
        self._writer: threading.Thread | None = None  # the checkpoint being written, in the background
        self._scheduled: list[QueryChange] = []  # replayed changes waiting for their input position
        self._waiters: dict[int, tuple[threading.Event, dict]] = {}  # admin requests waiting for `applied`
        self._next_offsets: dict[int, int] = {}  # input partition -> next offset to submit
        self._suppress: dict[int, int] = {}  # input partition -> deltas below this offset were delivered
        self._committed: dict[int, int] = {}
        self._requests = None  # producer of admin requests (outside any transaction of the daemon's)
        self._lock = threading.Lock()
        self.started = time.time()

    # ---- set-up ---------------------------------------------------------------------------------
    def _describe_metrics(self) -> None:
        m = self.metrics
        for name, kind, text in [
            ("csmd_records_total", "counter", "Input records consumed"),
            ("csmd_updates_total", "counter", "Updates applied to the graph"),
            ("csmd_deltas_total", "counter", "Match deltas published, by query and sign"),
            ("csmd_output_records_total", "counter", "Kafka records of deltas produced"),
            ("csmd_dead_letters_total", "counter", "Input or control records sent to the dead-letter topic"),
            ("csmd_ignored_updates_total", "counter", "Updates that changed nothing, by reason"),
            ("csmd_queue_depth", "gauge", "Items waiting in front of each pipeline stage"),
            ("csmd_pending_records", "gauge", "Input records not yet done (executed and acknowledged)"),
            ("csmd_consumer_paused", "gauge", "1 while backpressure pauses the input consumer"),
            ("csmd_consumer_pauses_total", "counter", "Times backpressure paused the input consumer"),
            ("csmd_consumer_lag", "gauge", "Input records behind the end of each partition"),
            ("csmd_committed_offset", "gauge", "Input offset committed, by partition"),
            ("csmd_gc_live_versions", "gauge", "Neighbor-array versions alive in the multi-version graph"),
            ("csmd_gc_released_total", "counter", "Versions released by the garbage collector"),
            ("csmd_device_memory_bytes", "gauge", "GPU memory in use by the engine (0 on the CPU engine)"),
            ("csmd_checkpoints_total", "counter", "Checkpoints written"),
            ("csmd_checkpoint_seq", "gauge", "Sequence number of the last checkpoint"),
            ("csmd_seq", "gauge", "Next update sequence number"),
            ("csmd_queries", "gauge", "Registered queries"),
        ]:
            m.describe(name, kind, text)

    def _conf(self) -> dict:
        return client_config(self.cfg["kafka"]["bootstrap"], self.cfg["kafka"]["client"])

    def _initial_graph(self) -> Graph:
        path = self.cfg["graph"]["initial"]
        if not path:
            return Graph.from_edges(np.zeros(0, np.int32), [], [])
        return read_graph(path)

    def _config_specs(self) -> list[QuerySpec]:
        paths = self.cfg["queries"]["paths"]
        files = query_files(paths) if paths else []
        specs = []
        for p in files:
            text = Path(p).read_text(encoding="utf-8", errors="replace")
            parse_query_text(text, str(p))  # refuse a bad query file before starting
            specs.append(QuerySpec(p.stem, text, self.cfg["queries"]["count_only"]))
        return specs

    # ---- the run -------------------------------------------------------------------------------------
    def run(self) -> int:
        t = self.cfg["topics"]
        conf = self._conf()
        if t["create"]:
            ensure_topics(conf, {t["input"]: t["partitions"], t["output"]: t["partitions"], t["control"]: 1,
                                 t["dead_letter"]: 1}, t["replication"])
        ckpt = read_checkpoint(self.cfg["checkpoint"]["dir"], self.log) if self.cfg["checkpoint"]["dir"] else None
        if ckpt is not None:
            g0, seq0, state = ckpt.graph, int(ckpt.state["seq"]), ckpt.state
            start = {int(p): o for p, o in state["offsets"].items()}
            specs = [QuerySpec(**q) for q in state["queries"]]
            self.removed = set(state["removed"])
            self.control_applied = state["control_applied"]
            known = {s.name for s in specs} | self.removed
            specs += [s for s in self._config_specs() if s.name not in known]
            self.log.info("restored checkpoint", seq=seq0, offsets=start, queries=len(specs))
        else:
            g0, seq0, start, specs = self._initial_graph(), 0, {}, self._config_specs()
            self.log.info("starting from the initial graph", vertices=g0.n, edges=g0.num_edges, queries=len(specs))
        ext = g0.ext_ids
        self._str_ids = getattr(ext, "dtype", None) is not None and ext.dtype.kind in "OUS"
        bs = self.cfg["pipeline"]
        engine = continuous_engine(bs["backend"], g0, "[pipeline] backend")
        self.pipe = Pipeline(g0, engine=engine, batch_size=bs["batch_size"], batch_wait=bs["batch_wait_ms"] / 1000,
                             queue_depth=bs["queue_depth"], first_seq=seq0,
                             retired=ckpt.retired if ckpt is not None else None)  # deleted vertices keep their ids
        for s in specs:
            s.register(self.pipe)
        self.specs = {s.name: s for s in specs}
        self.totals = {s.name: [0, 0] for s in specs}
        self.encoder = DeltaEncoder(self.pipe.vertices)
        self.tracker = DeliveryTracker(on_done=lambda t0: self.metrics.latency.observe([time.monotonic() - t0]))
        k = self.cfg["kafka"]
        self.sink = KafkaSink(conf, t["output"], t["max_message_bytes"], self._fail, self.cfg["delivery"]["timeout_s"],
                              k["transactional_id"] if k["transactions"] else None)
        self.source = KafkaSource(conf, t["input"], k["group"], start)
        self.control = KafkaSource(conf, t["control"], k["group"] + ".control", {0: self.control_applied + 1})
        committed = self.source.committed()
        self._committed = dict(committed)
        self._suppress = {p: o for p, o in committed.items() if o > start.get(p, 0)}
        self._next_offsets = {p: start.get(p, 0) for p in self.source.partitions}
        self._replay_control(start)
        if self._suppress:
            self.log.info("re-reading records whose deltas were delivered before", up_to=self._suppress)
        out = threading.Thread(target=self._run_pipeline, name="csmd-out", daemon=True)
        out.start()
        admin = self._start_admin()
        self.status = "running"
        self.log.info("running", input=t["input"], output=t["output"], seq=seq0,
                      admin=self.cfg["admin"]["listen"] or None)
        try:
            self._loop(out)
        finally:
            code = self._shutdown(out)
            if admin is not None:
                admin.shutdown()
        return code

    def _start_admin(self):
        if not self.cfg["admin"]["listen"]:
            return None
        from csmd.service.admin import AdminServer

        server = AdminServer(self, self.cfg["admin"]["listen"])
        server.start()
        return server

    # ---- control ---------------------------------------------------------------------------------------
    def _replay_control(self, start: dict[int, int]) -> None:
        """Requests logged since the checkpoint: replay those already applied at their recorded
        positions; apply the rest now."""
        requests, applied = {}, {}
        for rec in self.control.read_to_end():
            try:
                msg = control_request(rec.value, rec.source)
            except InputError as exc:
                self.log.warning("malformed control record skipped", record=rec.source, reason=exc.reason)
                continue
            if msg["op"] == "applied":
                applied[msg["request"]] = msg
            else:
                requests[rec.offset] = msg
        for offset, msg in sorted(requests.items()):
            spec = QuerySpec(msg["name"], msg.get("query", ""), msg.get("count_only", False))
            done = applied.get(offset)
            if done is not None:
                at = {int(p): o for p, o in done["at"].items()}
                self._scheduled.append(QueryChange(msg["op"], spec, offset, at, announce=False))
            else:
                self._enqueue_marker(QueryChange(msg["op"], spec, offset, dict(self._next_offsets), announce=True))
        self._release_scheduled(None)

    def _release_scheduled(self, rec: Record | None) -> None:
        """Enqueue replayed changes due before `rec` (all due at the start when rec is None)."""
        while self._scheduled:
            ch = self._scheduled[0]
            due = all(self._next_offsets.get(p, 0) >= o for p, o in ch.at.items()) or \
                (rec is not None and rec.offset >= ch.at.get(rec.partition, 1 << 62))
            if not due:
                return
            self._enqueue_marker(self._scheduled.pop(0))

    def _enqueue_marker(self, marker: Marker) -> None:
        with self._lock:
            self._markers_in_flight += 1
        self._inq.put(marker)

    def _poll_control(self) -> None:
        for rec in self.control.poll(100, 0):
            try:
                msg = control_request(rec.value, rec.source)
            except InputError as exc:
                self._dead_letter(rec, exc.reason)
                continue
            if msg["op"] == "applied" or rec.offset <= self.control_applied:
                continue  # our own announcements, or requests replayed at start
            spec = QuerySpec(msg["name"], msg.get("query", ""), msg.get("count_only", False))
            self._enqueue_marker(QueryChange(msg["op"], spec, rec.offset, dict(self._next_offsets), announce=True))

    def _changed(self, ch: QueryChange) -> None:
        """A query change passed the output stage: record it, announce it, wake an admin waiting for it."""
        if ch.error is None:
            if ch.action == "add":
                self.specs[ch.spec.name] = ch.spec
                self.totals[ch.spec.name] = [0, 0]
                self.removed.discard(ch.spec.name)
            else:
                self.specs.pop(ch.spec.name, None)
                self.removed.add(ch.spec.name)
        self.control_applied = max(self.control_applied, ch.request)
        result = {"op": "applied", "request": ch.request, "name": ch.spec.name, "action": ch.action,
                  "at": {str(p): o for p, o in ch.at.items()}, "seq": ch.seq, "error": ch.error}
        self.log.info("query change applied", **{k: v for k, v in result.items() if k != "op"})
        if ch.announce:
            self.sink.produce(self.cfg["topics"]["control"], json.dumps(result).encode(), ch.spec.name,
                              {CONTENT_TYPE: JSON}, _unwatched, ())
        waiter = self._waiters.pop(ch.request, None)
        if waiter is not None:
            waiter[1].update(result)
            waiter[0].set()

    def request_change(self, msg: dict, timeout: float = 30.0) -> dict:
        """Write a control request (from the admin endpoint) and wait until it takes effect."""
        control_request(json.dumps(msg).encode(), "request")  # refuse bad requests before logging them
        done = threading.Event()
        offset: list = []

        def delivered(err, m):
            offset.append(err or m.offset())
            done.set()

        from confluent_kafka import Producer

        with self._lock:
            if self._requests is None:
                self._requests = Producer({**self._conf(), "enable.idempotence": True, "acks": "all"})
        self._requests.produce(self.cfg["topics"]["control"], json.dumps(msg).encode(), msg["name"],
                               headers={CONTENT_TYPE: JSON}, on_delivery=delivered)
        self._requests.flush(timeout)
        if not done.wait(timeout) or not isinstance(offset[0], int):
            raise CsmdError(f"the control topic did not take the request: {offset[0] if offset else 'timeout'}")
        event, result = threading.Event(), {}
        self._waiters[offset[0]] = (event, result)
        if not event.wait(timeout):
            raise NotYetApplied("the request was logged but has not taken effect yet (the daemon is busy)")
        return result

    # ---- input -----------------------------------------------------------------------------------------
    def _submit(self, rec: Record) -> None:
        self._release_scheduled(rec)
        self.metrics.inc("csmd_records_total")
        try:
            updates = decode_updates(rec, self.cfg["input"]["format"], self._str_ids)
        except BadRecord as exc:
            self._dead_letter(rec, str(exc))
        else:
            self.tracker.submitted(rec.origin, len(updates))
            for u in updates:
                self._inq.put(u)
        self._next_offsets[rec.partition] = rec.offset + 1

    def _dead_letter(self, rec: Record, reason: str) -> None:
        """Send a refused record to the dead-letter topic; an input record is done once it is there."""
        tracked = rec.input == self.cfg["topics"]["input"]
        if tracked and rec.offset < self._suppress.get(rec.partition, -1):
            self.log.debug("dead letter sent before the restart, not again", record=rec.source)
            self.tracker.submitted(rec.origin, 0)
            return
        self.metrics.inc("csmd_dead_letters_total")
        self.log.warning("dead letter", record=rec.source, reason=reason)
        headers = dict(rec.headers)
        headers.update({"csmd-error": reason.encode(), "csmd-input": rec.input.encode(),
                        "csmd-partition": str(rec.partition).encode(), "csmd-offset": str(rec.offset).encode()})
        if tracked:
            self.tracker.submitted(rec.origin, 0, sends=1)
        self.sink.produce(self.cfg["topics"]["dead_letter"], rec.value, None, headers,
                          self.tracker.acked if tracked else _unwatched, [rec.origin] if tracked else ())

    def _items(self):
        """The pipeline's source: updates and markers from the input queue; None when idle."""
        wait = self.cfg["pipeline"]["batch_wait_ms"] / 1000
        busy = False
        while True:
            try:
                item = self._inq.get(timeout=wait if busy else 0.05)
            except queue.Empty:
                busy = False
                yield None
                continue
            if item is _STOP or self.fatal is not None:  # after a fatal error nothing more is worth doing
                return
            busy = True
            yield item

    # ---- output ----------------------------------------------------------------------------------------
    def _run_pipeline(self) -> None:
        try:
            self.pipe.run(self._items(), self._on_result)
        except BaseException as exc:  # an engine failure: stop the daemon, commit nothing more
            self.log.exception("pipeline failed")
            self._fail(f"pipeline failed: {exc!r}")

    def _on_result(self, result) -> None:
        if isinstance(result, Marker):
            if isinstance(result, QueryChange):
                self._changed(result)
            else:
                self._write_in_background(result)
            with self._lock:
                self._markers_in_flight -= 1
            return
        for d in result.deltas:
            tot = self.totals.setdefault(d.name, [0, 0])
            tot[0] += d.positive
            tot[1] += d.negative
        items = self._unsuppressed(self.encoder.encode(result))
        for query, batch, _origins in items:  # what is published (not what a restart holds back)
            sign, count = batch.column("sign").to_numpy(), batch.column("count").to_numpy()
            pos, neg = int(count[sign > 0].sum()), int(count[sign < 0].sum())
            if pos:
                self.metrics.inc("csmd_deltas_total", pos, query=query, sign="+")
            if neg:
                self.metrics.inc("csmd_deltas_total", neg, query=query, sign="-")
            self.metrics.deltas_rate.add(pos + neg)
        n = self.sink.write(items, self.tracker.acked, self.tracker.sending)
        self.metrics.inc("csmd_output_records_total", n)
        b = result.batch
        self.tracker.executed(b.records)
        self.metrics.inc("csmd_updates_total", b.records)
        self.metrics.updates_rate.add(b.records)
        self.metrics.set("csmd_gc_released_total", self.pipe.gc.released)

    def _unsuppressed(self, items):
        """Drop deltas of records below the committed offsets: they were delivered before a restart."""
        if not self._suppress:
            return items
        out = []
        for query, batch, origins in items:
            limit = np.array([self._suppress.get(p, -1) for p in batch.column("partition").to_numpy()])
            keep = batch.column("offset").to_numpy() >= limit
            if keep.all():
                out.append((query, batch, origins))
            elif keep.any():
                kept = {o for o in origins if o[2] >= self._suppress.get(o[1], -1)}
                out.append((query, batch.filter(keep), [o for o in origins if o in kept]))
        last = {}
        for _q, batch, _o in items:
            for p, o in zip(batch.column("partition").to_numpy().tolist(), batch.column("offset").to_numpy().tolist()):
                last[p] = max(last.get(p, -1), o)
        for p, o in last.items():  # past the committed offset: nothing more to hold back there
            if o >= self._suppress.get(p, 1 << 62):
                self._suppress.pop(p, None)
        return out

    # ---- the main loop ---------------------------------------------------------------------------------
    def _fail(self, reason: str) -> None:
        if self.fatal is None:
            self.fatal = reason
            self.log.error("stopping: fatal error", reason=reason)
        self.stopping.set()

    def _loop(self, out: threading.Thread) -> None:
        d, c = self.cfg["delivery"], self.cfg["checkpoint"]
        max_pending = self.cfg["pipeline"]["max_pending_records"]
        next_commit = time.monotonic() + d["commit_interval_ms"] / 1000
        next_ckpt = time.monotonic() + c["interval_s"]
        while not self.stopping.is_set():
            if not out.is_alive():
                self._fail("the pipeline stopped")
                break
            self._poll_control()
            # Backpressure: one poll takes no more than the room left, so the records in flight
            # never pass the limit; with no room the consumer takes nothing until half of it is
            # free. (librdkafka's own pause is not used: it drops what it prefetched and fetches
            # again only at its next wake-up, about a second, on every pause.)
            pending = self.tracker.pending()
            room = max_pending - pending
            if room <= 0 and not self.paused:
                self.paused = True
                self.metrics.inc("csmd_consumer_pauses_total")
            elif self.paused and pending <= max_pending // 2:
                self.paused = False
            if self.paused:
                self.sink.poll(0.02)
            else:
                for rec in self.source.poll(min(self.cfg["input"]["max_poll_records"], room), 0.02):
                    self._submit(rec)
            self.sink.poll(0)
            now = time.monotonic()
            if now >= next_commit:
                if self.sink.transactional:  # a transaction ends where no record is half done
                    self._drain()
                    self._commit_all()
                else:
                    self._commit()
                self._gauges()
                next_commit = now + d["commit_interval_ms"] / 1000
            if c["dir"] and now >= next_ckpt and not self._checkpointing():
                self._enqueue_marker(CheckpointMarker(self._next_offsets))
                next_ckpt = now + c["interval_s"]

    def _gauges(self) -> None:
        """Refresh the gauges (main thread only: the consumer must not be called from two threads)."""
        m = self.metrics
        m.set("csmd_pending_records", self.tracker.pending())
        m.set("csmd_consumer_paused", int(self.paused))
        m.set("csmd_queue_depth", self._inq.qsize(), stage="updater")
        for stage, q in self.pipe.queues.items():
            m.set("csmd_queue_depth", q.qsize(), stage=stage)
        ends = self.source.end_offsets()
        for p, hi in ends.items():
            m.set("csmd_consumer_lag", max(0, hi - self._next_offsets.get(p, 0)), partition=p)
        engine = self.pipe.engine_stats()
        m.set("csmd_gc_live_versions", engine["live_versions"])
        m.set("csmd_device_memory_bytes", engine["memory_bytes"])
        m.set("csmd_seq", self.pipe.next_seq)
        m.set("csmd_queries", len(self.specs))
        for reason, n in list(self.pipe.ignored.items()):
            m.set("csmd_ignored_updates_total", n, reason=reason)

    def _commit(self, wait: bool = False) -> None:
        topic = self.cfg["topics"]["input"]
        offsets = {p: o for (t, p), o in self.tracker.committable().items() if t == topic}
        # after a restart from an older checkpoint the done prefix starts below the group's
        # offset: committing it would make a later restart re-send what was delivered
        fresh = {p: o for p, o in offsets.items() if o > self._committed.get(p, -1)}
        if fresh:
            try:
                self.source.commit(fresh, wait)
            except KafkaException as exc:  # the broker is away: the next interval tries again
                self.log.warning("offset commit failed, will retry", reason=str(exc))
                return
            self._committed.update(fresh)
            for p, o in fresh.items():
                self.metrics.set("csmd_committed_offset", o, partition=p)

    def _drain(self) -> None:
        """Wait until every submitted record is done and every control change has passed."""
        while self.fatal is None:
            with self._lock:
                markers = self._markers_in_flight
            if not self.tracker.pending() and not markers and self._inq.empty():
                break
            self.sink.poll(0.005)
        if not self.sink.flush(60):
            self._fail("the broker did not acknowledge every record within 60 s")

    def _commit_all(self) -> None:
        """After a drain: the input offsets of everything submitted (in the transaction, if any)."""
        from confluent_kafka import TopicPartition

        topic = self.cfg["topics"]["input"]
        if self.fatal is not None:
            return
        if self.sink.transactional:
            ahead = {p: o for p, o in self._next_offsets.items() if o > self._committed.get(p, -1)}
            self.sink.commit_transaction([TopicPartition(topic, p, o) for p, o in ahead.items()],
                                         self.source.group_metadata())
            self._committed.update(ahead)
        else:
            self._commit(wait=True)

    def _checkpoint_state(self, graph, offsets: dict[int, int]) -> dict:
        return {"seq": graph.seq, "offsets": {str(p): o for p, o in offsets.items()},
                "control_applied": self.control_applied, "removed": sorted(self.removed),
                "queries": [dict(vars(s)) for s in self.specs.values()], "input": self.cfg["topics"]["input"],
                "written": time.time()}

    def _checkpointing(self) -> bool:
        """Whether a checkpoint is on its way (one at a time: a slow disk skips intervals)."""
        return self._writer is not None and self._writer.is_alive()

    def _write_in_background(self, marker: CheckpointMarker) -> None:
        """A checkpoint marker reached the output: write it without holding the pipeline."""
        state = self._checkpoint_state(marker.graph, marker.offsets)
        self._writer = threading.Thread(target=self._write_checkpoint, args=(marker.graph, state),
                                        name="csmd-checkpoint", daemon=True)
        self._writer.start()

    def _write_checkpoint(self, graph, state: dict) -> None:
        t0 = time.monotonic()
        c = self.cfg["checkpoint"]
        try:
            path = write_checkpoint(c["dir"], graph, state, c["keep"])
        except OSError as exc:  # the previous checkpoint stays; the next interval tries again
            self.log.error("checkpoint failed", dir=c["dir"], reason=exc.strerror or str(exc))
            return
        self.metrics.inc("csmd_checkpoints_total")
        self.metrics.set("csmd_checkpoint_seq", state["seq"])
        self.log.info("checkpoint written", path=str(path), seq=state["seq"], seconds=round(time.monotonic() - t0, 3))

    def _shutdown(self, out: threading.Thread) -> int:
        """Drain in-flight batches, flush, commit, checkpoint, close; 0 unless something failed."""
        self.status = "stopping"
        self.log.info("draining")
        self._inq.put(_STOP)
        while out.is_alive():
            self.sink.poll(0.01)
            out.join(0.01)
        if self.fatal is None:
            self._drain()
        if self._writer is not None:
            self._writer.join()
        if self.fatal is None:
            self._commit_all()
            if self.cfg["checkpoint"]["dir"]:  # the pipeline has stopped: its graph is the final one
                graph = self.pipe.graph_state()
                self._write_checkpoint(graph, self._checkpoint_state(graph, self._next_offsets))
        self.sink.close()
        self.status = "stopped"
        if self.fatal is not None:  # the consumers are left open: see run_daemon
            self.log.error("stopped after a fatal error; offsets were committed only up to delivered deltas",
                           reason=self.fatal)
            return 1
        self.source.close()
        self.control.close()
        self.log.info("stopped cleanly", seq=self.pipe.next_seq, committed=self._next_offsets)
        return 0

    # ---- views for the admin endpoint ----------------------------------------------------------------------
    def live_graph(self) -> tuple[Graph, int]:
        """The graph now, at a batch boundary, and its timestamp (updates before it are in)."""
        state = self.pipe.graph_state()
        return state.live_graph(), state.seq

    def stats(self) -> dict:
        lat = self.metrics.latency
        return {
            "status": self.status, "uptime_s": round(time.time() - self.started, 3),
            "seq": self.pipe.next_seq, "vertices": len(self.pipe.vertices.index),
            "records": self.metrics.get("csmd_records_total"), "updates": self.metrics.get("csmd_updates_total"),
            "updates_per_s": round(self.metrics.updates_rate.per_second(), 3),
            "deltas_per_s": round(self.metrics.deltas_rate.per_second(), 3),
            "latency_p50_s": lat.quantile(0.5), "latency_p99_s": lat.quantile(0.99),
            "pending_records": self.tracker.pending(), "paused": self.paused,
            "dead_letters": self.metrics.get("csmd_dead_letters_total"),
            "lag": self.metrics.snapshot().get("csmd_consumer_lag", {}),
            "ignored": dict(self.pipe.ignored), "gc_live_versions": self.pipe.engine_stats()["live_versions"],
            "offsets": dict(self._next_offsets),
            "queries": {n: {"positive": t[0], "negative": t[1]} for n, t in self.totals.items() if n in self.specs},
        }


def _unwatched(_origins) -> None:
    """on_ack of records no input offset waits for (control announcements, dead letters of control records)."""


def run_daemon(cfg: dict) -> int:
    """Run until SIGTERM or SIGINT (which drain and commit) or a fatal error.

    SIGUSR1 prints every thread's stack to stderr (for a daemon that seems stuck).
    """
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True)
    daemon = Daemon(cfg)

    def stop(signum, _frame):
        daemon.log.info("signal received, draining", signal=signal.Signals(signum).name)
        daemon.stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    code = daemon.run()
    if daemon.fatal is not None:
        # librdkafka's consumer close (also run when a consumer is freed) waits for requests
        # to a broker that may be gone, for up to a minute; nothing is left to save
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
