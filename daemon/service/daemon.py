"""`csmd run`: the daemon. Kafka in, the GU/EX/GC pipeline, Arrow deltas out.

Threads: the main thread runs the consume loop (ConsumeLoop, daemon/service/consume.py,
with its Backpressure): input and control records in, offsets committed, checkpoints
started; it hands updates and markers on through the Intake (context.py) to the
pipeline, which runs GU and EX in its own threads and hands results, in stream order,
to the output thread (Output, daemon/service/publish.py), whose Publisher encodes deltas
and produces them; checkpoints are written by their own thread (Checkpointer,
checkpointer.py); the admin endpoint serves HTTP. The control plane (ControlPlane,
control.py) turns control-topic requests into markers in the stream. Each part gets
what it uses in its constructor, and a DaemonContext (context.py) for what all share;
the Daemon below builds them and wires them together.

Delivery is at-least-once: an input offset is committed only after every delta
it caused is acknowledged (daemon/service/delivery.py). On start the daemon
restores the newest checkpoint (or the initial graph; daemon/service/restore.py)
and re-reads the input from the checkpoint's offsets; deltas of records below the
committed offsets were delivered before and are not sent again, so only the
records between the last commit and a crash can be published twice, with the same
delta ids.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time

from csmd.connectors.kafka import KafkaSink, KafkaSource, client_config, ensure_topics
from csmd.connectors.records import load_scanner
from csmd.backends import continuous_engine, resolve_backend, warm_once
from csmd.errors import CsmdError
from csmd.logs import get_logger
from csmd.model.graph import Graph
from csmd.pipeline.deltas import DeltaEncoder
from csmd.pipeline.sequencer import IGNORED_REASONS, LATE
from csmd.pipeline.shards import ShardChange
from csmd.pipeline.stages import Pipeline
from csmd.service.brokers import BrokerWatch
from csmd.service.checkpointer import CheckpointMarker, Checkpointer, content
from csmd.service.cluster import ClusterMember, DaemonLinks
from csmd.service.config import Config
from csmd.service.consume import Backpressure, ConsumeLoop
from csmd.service.context import STOP, DaemonContext, Intake
from csmd.service.control import ControlPlane, Queries, QueryChange
from csmd.service.delivery import DeliveryTracker
from csmd.service.publish import DeadLetters, Output, Publisher, warm_output
from csmd.service.restore import read_local, start_state


class Daemon:
    """One daemon: its parts, built from the restored state and wired together; their start and shutdown.
    The admin endpoint reads it (status, stats, specs, live_graph) and asks it for query changes."""

    def __init__(self, cfg: Config, log=None):
        self.ctx = DaemonContext(cfg, log or get_logger())
        self.cfg, self.log, self.metrics, self.labels = cfg, self.ctx.log, self.ctx.metrics, self.ctx.labels
        self.stop_signal: str | None = None  # SIGTERM or SIGINT, once one arrived
        self.status = "starting"
        self.brokers = BrokerWatch(self.ctx)
        self.queries = Queries()
        self.cluster: ClusterMember | None = None  # [cluster] enabled: shards of the matching work
        self.started = time.time()

    # the parts, made by run() once the state is restored (_start_pipeline, _wire)
    pipe: Pipeline
    tracker: DeliveryTracker
    sink: KafkaSink
    source: KafkaSource
    intake: Intake
    next_offsets: dict[int, int]  # input partition -> next offset the consume loop hands on
    publisher: Publisher
    control: ControlPlane
    checkpointer: Checkpointer
    backpressure: Backpressure
    consume: ConsumeLoop

    @property
    def stopping(self) -> threading.Event:
        return self.ctx.stopping

    @property
    def fatal(self) -> str | None:
        return self.ctx.fatal

    @property
    def specs(self) -> dict:
        return self.queries.specs

    def run(self) -> int:
        t = self.cfg.topics
        local = read_local(self.cfg, self.log)  # local files first: their errors are not Kafka's
        conf = client_config(self.cfg.kafka.bootstrap, self.cfg.kafka.client, self.brokers.error, self.log)
        if t.create:
            ensure_topics(conf, {t.input: t.partitions, t.output: t.partitions, t.control: 1,
                                 t.dead_letter: 1}, t.replication)
        st = start_state(self.cfg, conf, self.log, local)
        started = self._start_pipeline(st)
        if started is None:
            return 1
        engine, warm = started
        warm += warm_output(self.pipe.vertices, t.max_message_bytes)
        output = self._wire(conf, st)
        self.control.replay()
        if self.publisher.suppress:
            self.log.info("re-reading records whose deltas were delivered before", up_to=self.publisher.suppress)
        self.consume.gauges()  # the gauges hold values before the first commit interval
        for p, hi in st.ends.items():  # the consumer knows the ends only after its first fetch
            self.metrics.set("csmd_consumer_lag", hi - st.offsets.get(p, 0), partition=p)
        out = threading.Thread(target=output.run, name="csmd-out", daemon=True)
        out.start()
        admin = self._start_admin()
        self.status = "running"
        self.log.info("running", input=t.input, output=t.output, seq=st.seq,
                      admin=self.cfg.admin.listen or None, engine=engine.name, warm_up_s=round(warm, 3))
        try:
            self.consume.run(out)
        finally:
            code = self._shutdown(out)
            if admin is not None:
                admin.shutdown()
        return code

    def _start_pipeline(self, st):
        """The engine and the pipeline over the restored graph, its queries registered and warm
        (self.pipe); the engine and the seconds the warm-up took, or None (logged) when the device
        failed."""
        bs = self.cfg.pipeline
        # the first record does not wait for compiled code to load (numba's cache, the CUDA modules,
        # CuPy's own kernels): a throwaway engine runs a tiny stream before the live one is made,
        # so that on the GPU the device memory it freed stays in CuPy's pool for the live engine
        try:
            warm = warm_once(resolve_backend(bs.backend, "[pipeline] backend"), bs.gpus, "[pipeline] gpus") + load_scanner()
            engine = continuous_engine(bs.backend, st.graph, "[pipeline] backend", threads=bs.threads or None,
                                       timed=self.cfg.graph.event_time() is not None, gpus=bs.gpus,
                                       gpus_setting="[pipeline] gpus")
            self.pipe = Pipeline(st.graph, engine=engine, batch_size=bs.batch_size,
                                 batch_wait=bs.batch_wait_ms / 1000, queue_depth=bs.queue_depth,
                                 max_batch=bs.max_batch, first_seq=st.seq,
                                 retired=st.retired,  # deleted vertices keep their ids
                                 event_time=self.cfg.graph.event_time())  # the clock starts from st.graph's ts
            for s in st.specs:
                s.register(self.pipe, self.labels)
            self.pipe.warm()  # the queries' joined tables and the threads: not in the first record's latency
        except CsmdError:
            raise
        except Exception as exc:  # noqa: BLE001 - the device (out of memory, a CUDA error) before any record
            self.log.exception("engine failed at start")
            self.log.error("stopped after a fatal error; nothing was committed", reason=repr(exc))
            return None
        return engine, warm

    def _wire(self, conf: dict, st) -> Output:
        """The parts, from the restored state `st`, each given what it uses; the output thread's to start."""
        ctx, cfg, pipe, start = self.ctx, self.cfg, self.pipe, st.offsets
        t, k = cfg.topics, cfg.kafka
        queries = self.queries = Queries({s.name: s for s in st.specs}, st.removed, st.control_applied,
                                         {s.name: [0, 0] for s in st.specs})
        for s in st.specs:
            self.metrics.query(s.name)
        self.metrics.bind("csmd_ignored_updates_total", lambda: {(r,): pipe.ignored.get(r, 0) for r in IGNORED_REASONS})
        self.metrics.bind("csmd_gc_released_total", lambda: {(): pipe.gc.released})
        clock = pipe.sequencer.clock
        if clock is not None:
            self.metrics.bind("csmd_expired_updates_total", lambda: {(): clock.expired})
            self.metrics.bind("csmd_watermark", lambda: {(): math.nan if clock.watermark is None else clock.watermark})
        tracker = self.tracker = DeliveryTracker(on_done=self.metrics.records_done)
        sink = self.sink = KafkaSink(conf, t.output, t.max_message_bytes, ctx.fail, cfg.delivery.timeout_s,
                                     k.transactional_id if k.transactions else None, k.producer)
        source = self.source = KafkaSource(conf, t.input, k.group, start, k.offset_reset, k.consumer,
                                           on_brokers=self.brokers.seen)
        control_source = KafkaSource(conf, t.control, k.group + ".control", {0: st.control_applied + 1},
                                     settings=k.consumer)
        # what several parts share besides the context: the queue into the pipeline, the input position
        # the consume loop has handed on (partition -> next offset), and the records whose deltas were
        # delivered before a restart (partition -> the committed offset, where above the input's start)
        intake = self.intake = Intake()
        offsets = self.next_offsets = {p: start.get(p, 0) for p in source.partitions}
        # each shard's progress replaces the input group's offsets
        committed = {} if cfg.cluster.enabled else dict(st.committed)
        suppress = {p: o for p, o in committed.items() if o > start.get(p, 0)}
        dead_letters = DeadLetters(ctx, sink, tracker, suppress)
        publisher = self.publisher = Publisher(ctx, DeltaEncoder(pipe.vertices, ctx.carry), sink, queries, suppress)
        if cfg.cluster.enabled:
            links = DaemonLinks(position=lambda: offsets.get(0, 0),
                                done=lambda: tracker.committable().get((t.input, 0)), hand_on=intake.put_marker,
                                publish=publisher.publish, kafka_error=self.brokers.error)
            self.cluster = ClusterMember(ctx, conf, start.get(0, 0), st.ends.get(0, 0), partitions=source.partitions,
                                         pipe=pipe, sink=sink, specs=queries.specs.values(), links=links)
        cluster = self.cluster
        control = self.control = ControlPlane(ctx, control_source, sink, queries, intake, offsets, dead_letters.send,
                                              conf, in_cluster=cluster is not None)
        checkpointer = self.checkpointer = Checkpointer(
            ctx, queries, intake, content(st.checkpoint) if st.checkpoint is not None else None,
            cluster.lowest if cluster is not None else None)
        backpressure = self.backpressure = Backpressure(ctx, tracker, cfg.pipeline.max_pending_records, cluster)
        self.consume = ConsumeLoop(ctx, source, sink, tracker, intake, pipe, queries, offsets, committed, backpressure,
                                   control, checkpointer, dead_letters.send, cluster, st.graph.str_ids)
        markers = {QueryChange: control.changed, CheckpointMarker: checkpointer.write_in_background}
        if cluster is not None:
            markers[ShardChange] = cluster.changed
        return Output(ctx, pipe, intake, tracker, publisher, markers)

    def _start_admin(self):
        if not self.cfg.admin.listen:
            return None
        from csmd.service.admin import AdminServer

        server = AdminServer(self, self.cfg.admin.listen)
        server.start()
        return server

    def _shutdown(self, out: threading.Thread) -> int:
        """Drain in-flight batches, flush, commit, checkpoint, close; 0 unless something failed."""
        self.status = "stopping"
        self.log.info("draining", signal=self.stop_signal)
        self.intake.put(STOP)
        while out.is_alive():
            self.sink.poll(0.01)
            out.join(0.01)
        if self.fatal is None:
            self.consume.drain()
        self.checkpointer.wait()
        if self.fatal is None:
            self.consume.commit_all()
            behind = self.cluster.uncommitted(self.next_offsets.get(0, 0)) if self.cluster is not None else []
            if behind:  # a clean stop leaves every owned shard's progress where its matching is
                self.ctx.fail(f"shard progress not committed up to {self.next_offsets.get(0, 0)} for shards "
                              f"{behind} (the broker refused or did not answer): their next owner re-matches from "
                              f"the last committed progress")
            if self.cfg.checkpoint.dir and self.checkpointer.due(self.next_offsets):
                graph = self.pipe.graph_state()  # the pipeline's graph is the final one
                self.checkpointer.write(graph, self.checkpointer.state(graph, self.next_offsets))
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
        self.log.info("stopped cleanly", seq=self.pipe.next_seq, committed=self.next_offsets)
        return 0

    def request_change(self, msg: dict, timeout: float = 30.0) -> dict:
        """Write a control request (from the admin endpoint) and wait until it takes effect."""
        return self.control.request_change(msg, timeout)

    def live_graph(self) -> tuple[Graph, int]:
        """The graph now, at a batch boundary, and its timestamp (updates before it are in)."""
        state = self.pipe.graph_state()
        return state.live_graph(), state.seq

    def kafka_state(self) -> dict:
        return self.brokers.state()

    def stats(self) -> dict:
        lat, pipe, tracker, queries = self.metrics.latency, self.pipe, self.tracker, self.queries
        return {
            "status": self.status, "uptime_s": round(time.time() - self.started, 3), **self.kafka_state(),
            "seq": pipe.next_seq, "vertices": len(pipe.vertices.index),
            "records": self.metrics.get("csmd_records_total"), "updates": self.metrics.get("csmd_updates_total"),
            "updates_per_s": round(self.metrics.updates_rate.per_second(), 3),
            "deltas_per_s": round(self.metrics.deltas_rate.per_second(), 3),
            "latency_p50_s": lat.quantile(0.5), "latency_p99_s": lat.quantile(0.99),
            # the records with deltas alone (most records have none): what a consumer of alerts waits
            **{f"delta_latency_p{q}_s": self.metrics.delta_latency.quantile(q / 100) for q in (50, 99)},
            # per update, from its batch's forming: matched (deltas ready), produced (handed to the producer)
            **{f"{k}_p{q}_s": h.quantile(q / 100) for k, h in (("matched", pipe.stats.latency),
                                                              ("produced", self.metrics.produced)) for q in (50, 99)},
            "pending_records": tracker.pending(), "paused": self.backpressure.paused,
            "batches": pipe.stats.batches, "largest_batch": pipe.stats.largest,  # grown when behind
            "inline_batches": pipe.stats.inline,  # all stages on one thread: the stream was quiet
            "dead_letters": self.metrics.get("csmd_dead_letters_total"),
            "lag": self.metrics.series("csmd_consumer_lag"),
            "ignored": dict(pipe.ignored), "gc_live_versions": pipe.engine_stats()["live_versions"],
            **self._event_time_stats(),
            "offsets": dict(self.next_offsets),  # handed to the pipeline
            # records done (executed, deltas acknowledged), as the next offset of the done prefix
            "acknowledged": {p: o for (topic, p), o in tracker.committable().items()
                             if topic == self.cfg.topics.input},
            "queries": {n: {"positive": t[0], "negative": t[1]} for n, t in queries.totals.items()
                        if n in queries.specs},
            "cluster": self.cluster.stats() if self.cluster is not None else None,
        }


    def _event_time_stats(self) -> dict:
        """Under event time: the watermark, and the updates expired and ignored as late."""
        clock = self.pipe.sequencer.clock
        if clock is None:
            return {}
        return {"watermark": clock.watermark, "expired": clock.expired, "late": self.pipe.ignored.get(LATE, 0)}


def on_stop_signal(daemon: Daemon, signum: int) -> None:
    """SIGTERM or SIGINT: drain and stop. Nothing here may log or take a lock: the handler runs on
    the main thread between two of its bytecodes, maybe while that thread holds the log's
    non-reentrant write lock (a dead letter being logged), which deadlocked the daemon; the
    drain logs the signal instead."""
    daemon.stop_signal = signal.Signals(signum).name
    daemon.stopping.set()


def run_daemon(cfg: Config) -> int:
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
