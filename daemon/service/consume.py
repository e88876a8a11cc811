"""The consume loop (main thread): input records in, with backpressure; commits; drains.

Delivery is at-least-once: an input offset is committed only after every Kafka
record its updates caused is acknowledged (daemon/service/delivery.py), and never
below an offset committed before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from confluent_kafka import KafkaException, TopicPartition

from csmd.connectors.kafka import KafkaSink, KafkaSource
from csmd.connectors.records import BadRecord, Polled, Record, RecordBlock, decode_updates, plain_runs
from csmd.pipeline.stages import Pipeline
from csmd.service.checkpointer import Checkpointer
from csmd.service.cluster import ClusterMember
from csmd.service.context import DaemonContext, Intake
from csmd.service.control import ControlPlane, Queries
from csmd.service.delivery import DeliveryTracker


class Backpressure:
    """Backpressure: one poll takes no more than the room left, so the records in flight never
    pass `max_pending`; with no room the consumer takes nothing until half of it is free.
    (librdkafka's own pause is not used: it drops what it prefetched and fetches again only at
    its next wake-up, about a second, on every pause.) A cluster's kept window pauses it too
    (daemon/service/cluster.py)."""

    def __init__(self, ctx: DaemonContext, tracker: DeliveryTracker, max_pending: int,
                 cluster: ClusterMember | None = None):
        self.ctx, self.tracker, self.max_pending, self.cluster = ctx, tracker, max_pending, cluster
        self.paused = False  # the consumer takes no records

    def room(self, position: int) -> int:
        """How many records the next poll may take (`position`: the next input offset); 0 while paused."""
        pending = self.tracker.pending()
        room = self.max_pending - pending
        if self.cluster is not None:
            room = min(room, self.cluster.room(position))
        if room <= 0 and not self.paused:
            self.paused = True
            self.ctx.metrics.inc("csmd_consumer_pauses_total")
        elif self.paused and pending <= self.max_pending // 2 and room > 0:
            self.paused = False
        return 0 if self.paused else room


class ConsumeLoop:
    """The main thread: polls the control plane, the cluster and the input, hands the input's
    records on into the pipeline (`intake`), commits, starts checkpoints, drains at the end.
    `next_offsets` (input partition -> next offset to submit) and `committed` (-> the offset
    last committed) are its own, written here only; `str_ids`: the graph's ids are strings."""

    def __init__(self, ctx: DaemonContext, source: KafkaSource, sink: KafkaSink, tracker: DeliveryTracker,
                 intake: Intake, pipe: Pipeline, queries: Queries, next_offsets: dict[int, int],
                 committed: dict[int, int], backpressure: Backpressure, control: ControlPlane,
                 checkpointer: Checkpointer, dead_letter: Callable[[Record, str], None],
                 cluster: ClusterMember | None, str_ids: bool):
        self.ctx, self.source, self.sink, self.tracker, self.intake = ctx, source, sink, tracker, intake
        self.pipe, self.queries, self.next_offsets, self.committed = pipe, queries, next_offsets, committed
        self.backpressure, self.control, self.checkpointer = backpressure, control, checkpointer
        self.dead_letter, self.cluster, self.str_ids = dead_letter, cluster, str_ids
        self._done_at_commit: dict = {}  # the tracker's done prefix when the last commit started

    def _take(self, records: Polled) -> None:
        """A poll's records, into the pipeline in order. Runs of plain text records go
        as one block each (decoded together, one hand-off, one bookkeeping step: what every
        instance of a cluster pays for every record); the others, and every record while
        replayed control changes wait for their position, one at a time."""
        if self.control.scheduled or len(self.source.partitions) > 1 or self.ctx.cfg.graph.time == "event":
            items = records  # a block is of one partition, and holds no event times
        else:
            items = plain_runs(records, self.ctx.cfg.input.format, self.str_ids, self.ctx.carry)
        for item in items:
            if isinstance(item, RecordBlock):
                offsets, updates = item.records()
                self.ctx.metrics.inc("csmd_records_total", len(offsets))
                self.tracker.submitted_run(item.path, item.partition, offsets, updates)
                self.intake.put(item)
                self.next_offsets[item.partition] = int(offsets[-1]) + 1
            else:
                self._submit(item)

    def _submit(self, rec: Record) -> None:
        self.control.release_scheduled(rec)
        cfg = self.ctx.cfg
        self.ctx.metrics.inc("csmd_records_total")
        try:
            updates = decode_updates(rec, cfg.input.format, self.str_ids, cfg.graph.max_id_bytes,
                                     self.ctx.carry, self.ctx.labels, cfg.graph.time == "event")
        except BadRecord as exc:
            self.dead_letter(rec, str(exc))
        else:
            self.tracker.submitted(rec.origin, len(updates))
            for u in updates:
                self.intake.put(u)
        self.next_offsets[rec.partition] = rec.offset + 1

    def run(self, out: threading.Thread) -> None:
        """Until the daemon stops (or `out`, the output thread, does)."""
        cfg = self.ctx.cfg
        d, c = cfg.delivery, cfg.checkpoint
        next_commit = time.monotonic() + d.commit_interval_ms / 1000
        next_ckpt = time.monotonic() + c.interval_s
        while not self.ctx.stopping.is_set():
            if not out.is_alive():
                self.ctx.fail("the pipeline stopped")
                break
            self.control.poll()
            if self.cluster is not None:
                self.cluster.poll(self.next_offsets.get(0, 0))
            room = self.backpressure.room(self.next_offsets.get(0, 0))
            if not room:
                self.sink.poll(0.02)
            else:
                self._take(self.source.poll(min(cfg.input.max_poll_records, room), 0.02))
            self.sink.poll(0)
            now = time.monotonic()
            # a daemon with every record done commits at once, not at the next interval: the end of a
            # burst is delivered (and a cluster's shard progress moves) up to an interval sooner
            done = self.tracker.committable()
            idle = not self.tracker.pending() and done != self._done_at_commit
            if now >= next_commit or idle:
                self._done_at_commit = done
                if self.sink.transactional:  # a transaction ends where no record is half done
                    self.drain()
                    self.commit_all()
                else:
                    self._commit()
                self.gauges()
                next_commit = now + d.commit_interval_ms / 1000
            if c.dir and now >= next_ckpt:
                if self.checkpointer.due(self.next_offsets):
                    self.checkpointer.take(self.next_offsets)
                next_ckpt = now + c.interval_s

    def gauges(self) -> None:
        """Refresh the gauges (main thread only: the consumer must not be called from two threads)."""
        m = self.ctx.metrics
        m.set("csmd_pending_records", self.tracker.pending())
        m.set("csmd_consumer_paused", int(self.backpressure.paused))
        m.set("csmd_queue_depth", self.intake.qsize(), stage="updater")
        for stage, q in self.pipe.queues.items():
            m.set("csmd_queue_depth", q.qsize(), stage=stage)
        ends = self.source.end_offsets()
        for p, hi in ends.items():
            # negative when the daemon is past the topic's end: a sign of trouble, never hidden
            m.set("csmd_consumer_lag", hi - self.next_offsets.get(p, 0), partition=p)
        engine = self.pipe.engine_stats()
        m.set("csmd_gc_live_versions", engine["live_versions"])
        m.set("csmd_device_memory_bytes", engine["memory_bytes"])
        m.set("csmd_seq", self.pipe.next_seq)
        m.set("csmd_queries", len(self.queries.specs))

    def _commit(self, wait: bool = False) -> None:
        topic = self.ctx.cfg.topics.input
        offsets = {p: o for (t, p), o in self.tracker.committable().items() if t == topic}
        if self.cluster is not None:  # progress per shard instead of the input group's offsets
            done = offsets.get(0)
            if done is None and not self.tracker.pending():  # no record since the start: all below it is done
                done = self.next_offsets.get(0)
            self.cluster.sync(done, self.source.end_offsets().get(0))
            return
        # after a restart from an older checkpoint the done prefix starts below the group's
        # offset: committing it would make a later restart re-send what was delivered
        fresh = {p: o for p, o in offsets.items() if o > self.committed.get(p, -1)}
        if fresh:
            try:
                self.source.commit(fresh, wait)
            except KafkaException as exc:  # the broker is away: the next interval tries again
                self.ctx.log.warning("offset commit failed, will retry", reason=str(exc))
                return
            self.committed.update(fresh)
            for p, o in fresh.items():
                self.ctx.metrics.set("csmd_committed_offset", o, partition=p)

    def drain(self) -> None:
        """Wait until every submitted record is done and every control change has passed."""
        while self.ctx.fatal is None:
            markers = self.intake.markers()
            if not self.tracker.pending() and not markers and self.intake.empty():
                break
            self.sink.poll(0.005)
        if not self.sink.flush(60):
            self.ctx.fail("the broker did not acknowledge every record within 60 s")

    def commit_all(self) -> None:
        """After a drain: the input offsets of everything submitted (in the transaction, if any)."""
        topic = self.ctx.cfg.topics.input
        if self.ctx.fatal is not None:
            return
        if self.sink.transactional:
            ahead = {p: o for p, o in self.next_offsets.items() if o > self.committed.get(p, -1)}
            self.sink.commit_transaction([TopicPartition(topic, p, o) for p, o in ahead.items()],
                                         self.source.group_metadata())
            self.committed.update(ahead)
        else:
            self._commit(wait=True)
