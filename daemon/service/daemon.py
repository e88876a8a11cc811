"""`csmd run`: the daemon. Kafka in, the GU/EX/GC pipeline, Arrow deltas out.

Threads: the main thread runs the consume loop (daemon/service/consume.py):
input and control records in, offsets committed, checkpoints started; the
pipeline runs GU and EX in its own threads and hands results, in stream order, to
the output thread (daemon/service/output.py), which encodes deltas and produces
them; checkpoints are written by their own thread (checkpointing.py); the admin
endpoint serves HTTP. The control plane (control.py) turns control-topic requests
into markers in the stream.

Delivery is at-least-once: an input offset is committed only after every delta
it caused is acknowledged (daemon/service/delivery.py). On start the daemon
restores the newest checkpoint (or the initial graph; daemon/service/restore.py)
and re-reads the input from the checkpoint's offsets; deltas of records below the
committed offsets were delivered before and are not sent again, so only the
records between the last commit and a crash can be published twice, with the same
delta ids.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time

import numpy as np

from csmd.connectors.kafka import KafkaSink, KafkaSource, arrow_messages, client_config, ensure_topics
from csmd.connectors.records import Carry, load_scanner
from csmd.engine import QueryDeltas, UpdateBatch
from csmd.engines import continuous_engine, resolve_backend, warm_once
from csmd.errors import CsmdError
from csmd.model.formats import Update
from csmd.model.graph import Graph
from csmd.pipeline.deltas import DeltaEncoder
from csmd.pipeline.sequencer import IGNORED_REASONS
from csmd.pipeline.stages import BatchResult, Pipeline
from csmd.service.checkpointing import Checkpointing, content
from csmd.service.cluster import ClusterMember
from csmd.service.config import label_names
from csmd.service.consume import ConsumeLoop
from csmd.service.control import ControlPlane, QueryChange, QuerySpec
from csmd.service.delivery import DeliveryTracker
from csmd.logs import get_logger
from csmd.service.metrics import Metrics
from csmd.service.output import STOP, Output
from csmd.service.restore import read_local, start_state


class Daemon(ControlPlane, ConsumeLoop, Output, Checkpointing):
    """One daemon: its state, start-up and shutdown; each part's methods live in its module."""

    def __init__(self, cfg: dict, log=None):
        self.cfg = cfg
        self.log = log or get_logger()
        self.metrics = Metrics()
        self.stopping = threading.Event()
        self.stop_signal: str | None = None  # SIGTERM or SIGINT, once one arrived
        self.status = "starting"
        self.fatal: str | None = None
        self.paused = False  # backpressure: the consumer takes no records
        self.labels = label_names(cfg)
        self.carry = Carry(tuple(cfg["output"]["carry_headers"]), tuple(cfg["output"]["carry_fields"]),
                           cfg["topics"]["max_message_bytes"] // 2)
        self.specs: dict[str, QuerySpec] = {}  # registered now, as the output thread has seen
        self.removed: set[str] = set()  # removed through the control topic (a restart must not re-add them)
        self.totals: dict[str, list[int]] = {}
        self.control_applied = -1  # highest control request offset whose change has passed the output
        self._inq: queue.Queue = queue.Queue()
        self._markers_in_flight = 0
        self._writer: threading.Thread | None = None  # the checkpoint being written, in the background
        self._checkpoint_marker = False  # a checkpoint marker is in the pipeline
        self._last_checkpoint: dict | None = None  # the newest checkpoint's content (_checkpoint_content)
        self._scheduled: list[QueryChange] = []  # replayed changes waiting for their input position
        self._waiters: dict[int, tuple[threading.Event, dict]] = {}  # admin requests waiting for `applied`
        # the last results nobody waited for yet: a request can take effect before its admin
        # call hears the broker's acknowledgement and starts waiting
        self._unclaimed: dict[int, dict] = {}
        self._next_offsets: dict[int, int] = {}  # input partition -> next offset to submit
        self._suppress: dict[int, int] = {}  # input partition -> deltas below this offset were delivered
        self._committed: dict[int, int] = {}
        self._done_at_commit: dict = {}  # the tracker's done prefix when the last commit started
        self._requests = None  # producer of admin requests (outside any transaction of the daemon's)
        self.cluster: ClusterMember | None = None  # [cluster] enabled: shards of the matching work
        self._error_logged: dict[int, float] = {}  # Kafka error code -> when it was last logged
        self.kafka_up: bool | None = None  # the input consumer's broker connection, as last seen
        self.kafka_since = time.time()  # when kafka_up last changed
        self._lock = threading.Lock()
        self.started = time.time()

    def _conf(self) -> dict:
        return client_config(self.cfg["kafka"]["bootstrap"], self.cfg["kafka"]["client"], self._kafka_error, self.log)

    def _kafka_error(self, err) -> None:
        """error_cb of every Kafka client: counted always, logged once a minute per kind (a broker
        that is down reports the same error many times a second), fatal ones stop the daemon."""
        self.metrics.inc("csmd_kafka_errors_total", code=err.name())
        if err.fatal():
            self._fail(f"Kafka client failed: {err.str()}")
            return
        now = time.monotonic()
        if now - self._error_logged.get(err.code(), -1e9) >= 60:
            self._error_logged[err.code()] = now
            self.log.warning("kafka client error (librdkafka retries)", code=err.name(), reason=err.str())

    def _brokers(self, up: bool) -> None:
        """The input consumer's statistics, each second (main thread): say when Kafka goes away and
        comes back; /health, /stats and csmd_kafka_up show it. The daemon stays up meanwhile (a
        restart would not bring the broker back) and takes up where it was."""
        if up == self.kafka_up:
            return
        was, self.kafka_up, self.kafka_since = self.kafka_up, up, time.time()
        self.metrics.set("csmd_kafka_up", int(up))
        if not up:
            self.log.warning("kafka unreachable: no broker connection is up", bootstrap=self.cfg["kafka"]["bootstrap"])
        elif was is not None:
            self.log.info("kafka reachable again")

    def run(self) -> int:
        t = self.cfg["topics"]
        local = read_local(self.cfg, self.log)  # local files first: their errors are not Kafka's
        conf = self._conf()
        if t["create"]:
            ensure_topics(conf, {t["input"]: t["partitions"], t["output"]: t["partitions"], t["control"]: 1,
                                 t["dead_letter"]: 1}, t["replication"])
        st = start_state(self.cfg, conf, self.log, local)
        g0, seq0, start, specs = st.graph, st.seq, st.offsets, st.specs
        self.removed, self.control_applied = st.removed, st.control_applied
        self._str_ids = g0.str_ids
        bs = self.cfg["pipeline"]
        # the first record does not wait for compiled code to load (numba's cache, the CUDA modules,
        # CuPy's own kernels): a throwaway engine runs a tiny stream before the live one is made,
        # so that on the GPU the device memory it freed stays in CuPy's pool for the live engine
        try:
            warm = warm_once(resolve_backend(bs["backend"], "[pipeline] backend")) + load_scanner()
            engine = continuous_engine(bs["backend"], g0, "[pipeline] backend", threads=bs["threads"] or None)
            self.pipe = Pipeline(g0, engine=engine, batch_size=bs["batch_size"], batch_wait=bs["batch_wait_ms"] / 1000,
                                 queue_depth=bs["queue_depth"], max_batch=bs["max_batch"], first_seq=seq0,
                                 retired=st.retired)  # deleted vertices keep their ids
            for s in specs:
                s.register(self.pipe, self.labels)
            self.pipe.warm()  # the queries' joined tables and the threads: not in the first record's latency
        except CsmdError:
            raise
        except Exception as exc:  # noqa: BLE001 - the device (out of memory, a CUDA error) before any record
            self.log.exception("engine failed at start")
            self.log.error("stopped after a fatal error; nothing was committed", reason=repr(exc))
            return 1
        self.specs = {s.name: s for s in specs}
        for s in specs:
            self.metrics.query(s.name)
        self.metrics.bind("csmd_ignored_updates_total",
                          lambda: {(r,): self.pipe.ignored.get(r, 0) for r in IGNORED_REASONS})
        self.metrics.bind("csmd_gc_released_total", lambda: {(): self.pipe.gc.released})
        self.totals = {s.name: [0, 0] for s in specs}
        self.encoder = DeltaEncoder(self.pipe.vertices, self.carry)
        warm += warm_output(self.pipe.vertices, t["max_message_bytes"])
        self.tracker = DeliveryTracker(on_done=lambda t0: self.metrics.latency.observe(time.monotonic() - np.asarray(t0)))
        k = self.cfg["kafka"]
        self.sink = KafkaSink(conf, t["output"], t["max_message_bytes"], self._fail, self.cfg["delivery"]["timeout_s"],
                              k["transactional_id"] if k["transactions"] else None, k["producer"])
        self.source = KafkaSource(conf, t["input"], k["group"], start, k["offset_reset"], k["consumer"],
                                  on_brokers=self._brokers)
        self.control = KafkaSource(conf, t["control"], k["group"] + ".control", {0: self.control_applied + 1},
                                   settings=k["consumer"])
        if self.cfg["cluster"]["enabled"]:  # each shard's progress replaces the input group's offsets
            self.cluster = ClusterMember(self, conf, start.get(0, 0), st.ends.get(0, 0))
            st.committed = {}
        self._committed = dict(st.committed)
        self._suppress = {p: o for p, o in st.committed.items() if o > start.get(p, 0)}
        self._next_offsets = {p: start.get(p, 0) for p in self.source.partitions}
        if st.checkpoint is not None:
            self._last_checkpoint = content(st.checkpoint)
        self._replay_control(start)
        if self._suppress:
            self.log.info("re-reading records whose deltas were delivered before", up_to=self._suppress)
        self._gauges()  # the gauges hold values before the first commit interval
        for p, hi in st.ends.items():  # the consumer knows the ends only after its first fetch
            self.metrics.set("csmd_consumer_lag", hi - start.get(p, 0), partition=p)
        out = threading.Thread(target=self._run_pipeline, name="csmd-out", daemon=True)
        out.start()
        admin = self._start_admin()
        self.status = "running"
        self.log.info("running", input=t["input"], output=t["output"], seq=seq0,
                      admin=self.cfg["admin"]["listen"] or None, engine=engine.name, warm_up_s=round(warm, 3))
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

    def _fail(self, reason: str) -> None:
        if self.fatal is None:
            self.fatal = reason
            self.log.error("stopping: fatal error", reason=reason)
        self.stopping.set()

    def _shutdown(self, out: threading.Thread) -> int:
        """Drain in-flight batches, flush, commit, checkpoint, close; 0 unless something failed."""
        self.status = "stopping"
        self.log.info("draining", signal=self.stop_signal)
        self._inq.put(STOP)
        while out.is_alive():
            self.sink.poll(0.01)
            out.join(0.01)
        if self.fatal is None:
            self._drain()
        if self._writer is not None:
            self._writer.join()
        if self.fatal is None:
            self._commit_all()
            behind = self.cluster.uncommitted(self._next_offsets.get(0, 0)) if self.cluster is not None else []
            if behind:  # a clean stop leaves every owned shard's progress where its matching is
                self._fail(f"shard progress not committed up to {self._next_offsets.get(0, 0)} for shards "
                           f"{behind} (the broker refused or did not answer): their next owner re-matches from "
                           f"the last committed progress")
            if self.cfg["checkpoint"]["dir"] and self._checkpoint_due():  # the pipeline's graph is the final one
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
        if self.cluster is not None:
            self.cluster.close()
        self.log.info("stopped cleanly", seq=self.pipe.next_seq, committed=self._next_offsets)
        return 0

    def live_graph(self) -> tuple[Graph, int]:
        """The graph now, at a batch boundary, and its timestamp (updates before it are in)."""
        state = self.pipe.graph_state()
        return state.live_graph(), state.seq

    def kafka_state(self) -> dict:
        """The broker connection, for /health and /stats: up, down or unknown (no statistics yet),
        and for how long."""
        state = {None: "unknown", True: "up", False: "down"}[self.kafka_up]
        return {"kafka": state, "kafka_for_s": round(time.time() - self.kafka_since, 1)}

    def stats(self) -> dict:
        lat = self.metrics.latency
        return {
            "status": self.status, "uptime_s": round(time.time() - self.started, 3), **self.kafka_state(),
            "seq": self.pipe.next_seq, "vertices": len(self.pipe.vertices.index),
            "records": self.metrics.get("csmd_records_total"), "updates": self.metrics.get("csmd_updates_total"),
            "updates_per_s": round(self.metrics.updates_rate.per_second(), 3),
            "deltas_per_s": round(self.metrics.deltas_rate.per_second(), 3),
            "latency_p50_s": lat.quantile(0.5), "latency_p99_s": lat.quantile(0.99),
            "pending_records": self.tracker.pending(), "paused": self.paused,
            "batches": self.pipe.stats.batches, "largest_batch": self.pipe.stats.largest,  # grown when behind
            "inline_batches": self.pipe.stats.inline,  # all stages on one thread: the stream was quiet
            "dead_letters": self.metrics.get("csmd_dead_letters_total"),
            "lag": self.metrics.series("csmd_consumer_lag"),
            "ignored": dict(self.pipe.ignored), "gc_live_versions": self.pipe.engine_stats()["live_versions"],
            "offsets": dict(self._next_offsets),  # handed to the pipeline
            # records done (executed, deltas acknowledged), as the next offset of the done prefix
            "acknowledged": {p: o for (topic, p), o in self.tracker.committable().items()
                             if topic == self.cfg["topics"]["input"]},
            "queries": {n: {"positive": t[0], "negative": t[1]} for n, t in self.totals.items() if n in self.specs},
            "cluster": self.cluster.stats() if self.cluster is not None else None,
        }


def warm_output(vertices, max_bytes: int) -> float:
    """Encode one count delta with a throwaway encoder and serialize it as the output does: what
    the first batch's publish would load on first use loads now (pyarrow's lazy imports pull in
    pandas where it is installed: 0.5 s of the first batch's latency on the device host, on every
    instance of a cluster). Returns the seconds it took."""
    t0 = time.monotonic()
    z = np.zeros(0, np.int64)
    batch = UpdateBatch(0, 1, z, z, z, z, z, z, z, z, np.zeros(0, np.int32), 0, {0: Update("e", 0, 1)}, np.array([t0]), 1)
    delta = QueryDeltas("warm-up", np.zeros(1, np.int64), np.ones(1, np.int8), None, 1, 0, np.ones(1, np.int64))
    for _query, record_batch, _origins in DeltaEncoder(vertices).encode(BatchResult(batch, [delta], t0)):
        record_batch.column("sign").to_numpy()
        arrow_messages(record_batch, max_bytes)
    return time.monotonic() - t0


def on_stop_signal(daemon: Daemon, signum: int) -> None:
    """SIGTERM or SIGINT: drain and stop. Nothing here may log or take a lock: the handler runs on
    the main thread between two of its bytecodes, maybe while that thread holds the log's
    non-reentrant write lock (a dead letter being logged), which deadlocked the daemon; the
    drain logs the signal instead."""
    daemon.stop_signal = signal.Signals(signum).name
    daemon.stopping.set()


def run_daemon(cfg: dict) -> int:
    """Run until SIGTERM or SIGINT (which drain and commit) or a fatal error.

    SIGUSR1 prints every thread's stack to stderr (for a daemon that seems stuck).
    """
    import faulthandler

    faulthandler.register(signal.SIGUSR1, all_threads=True)
    daemon = Daemon(cfg)

    signal.signal(signal.SIGTERM, lambda signum, _frame: on_stop_signal(daemon, signum))
    signal.signal(signal.SIGINT, lambda signum, _frame: on_stop_signal(daemon, signum))
    code = daemon.run()
    if daemon.fatal is not None:
        # librdkafka's consumer close (also run when a consumer is freed) waits for requests
        # to a broker that may be gone, for up to a minute; nothing is left to save
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code
