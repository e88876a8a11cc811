"""Scale-out: this instance's part in a cluster that shares the matching work through Kafka.

Every instance consumes every input record in the same order (one input partition)
and holds the whole graph; the matching of each record belongs to one of
`[cluster] shards` shards (pipeline/shards.py). Kafka decides who owns which shard:
the coordination topic "<group>.shards" has one partition per shard, every instance
subscribes to it in the consumer group `[cluster] group`, and the cooperative-sticky
assignor hands its partitions out, so joining, leaving and crashed instances move
shards through ordinary rebalances. Nothing is written to it but the deployment: what
every instance must agree on (service/deployment.py), checked before joining.

A shard's progress is the input offset below which its deltas are delivered,
committed as the offset of its partition in the group. The owner commits its done
prefix (service/delivery.py) for every shard it owns once the shard's re-match is
acknowledged; a new owner starts from the committed progress (a ShardChange re-matches
the records between it and the gain). A commit never moves a progress back: it is
checked against the group's offsets read just before (an instance that was paused may
wake up still believing it owns a shard that moved on, and this broker does not fence
its commits).

Each instance keeps the batches (and the GC the versions) since the lowest progress
of any shard, so any instance can take over any shard. The shard with the lowest
progress holds that window open: at `[cluster] max_retained_updates` the input pauses
(nothing is lost, memory stays bounded) and a warning names the shard, until its owner
moves on or Kafka hands it to another instance.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from csmd.connectors.kafka import KafkaSink, client, ensure_topics, librdkafka_settings, topic_partitions
from csmd.errors import CsmdError
from csmd.pipeline.shards import ShardChange, ShardWork
from csmd.pipeline.stages import Marker, Pipeline
from csmd.service import deployment
from csmd.service.config import Config
from csmd.service.context import DaemonContext

# a commit that races a rebalance: after it the shards still owned commit again
_RACED = (KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID, KafkaError.REBALANCE_IN_PROGRESS)


def lowest_progress(conf: dict, cfg: Config) -> int:
    """The lowest committed progress of any shard of the deployment (0 for a shard with none): a
    restarted instance must be able to re-match every shard from there, so it restores no
    checkpoint above it."""
    c = cfg.cluster
    topic = f"{c.group}.shards"
    reader = client(Consumer, {**conf, "group.id": c.group, "enable.auto.commit": False})
    try:
        tps = reader.committed([TopicPartition(topic, s) for s in range(c.shards)], timeout=15)
    except KafkaException as exc:
        raise CsmdError(f"coordination topic {topic!r}: cannot read the shards' progress ({exc})") from None
    finally:
        reader.close()
    return min(max(tp.offset, 0) if tp.error is None else 0 for tp in tps)


@dataclass(frozen=True)
class DaemonLinks:
    """All a cluster member asks of the daemon it is part of, besides the context."""

    position: Callable[[], int]  # the next input offset the consume loop submits
    done: Callable[[], int | None]  # the done prefix of the input (records whose deltas are all delivered)
    hand_on: Callable[[Marker], None]  # a marker into the pipeline, after the records submitted so far
    publish: Callable  # publish(result, on_ack, on_send): a re-match's deltas, as the output publishes a batch's
    kafka_error: Callable  # the error_cb of the daemon's Kafka clients


class ClusterMember:
    """The daemon's membership: shards owned, progress committed, the kept window bounded.

    start_offset: where this instance's graph starts in the input (its checkpoint, or 0);
    join_at: the input offset to catch up to before joining (the end at start), so a new
    instance takes shards only once it can match them at once. `partitions`: the input's;
    `specs`: the queries registered at start; the pipeline's shard work and the sink's
    headers are set here.
    """

    def __init__(self, ctx: DaemonContext, conf: dict, start_offset: int, join_at: int, *, partitions: list[int],
                 pipe: Pipeline, sink: KafkaSink, specs, links: DaemonLinks):
        self.ctx, self.links = ctx, links
        c, t = ctx.cfg.cluster, ctx.cfg.topics
        if partitions != [0]:
            raise CsmdError(f"[cluster] enabled needs one input partition (every instance must apply the same "
                            f"update order); topic {t.input!r} has {len(partitions)}")
        self.shards, self.topic = c.shards, f"{c.group}.shards"
        self.instance = c.instance or f"{socket.gethostname()}-{os.getpid()}"
        self.limit = c.max_retained_updates
        self.join_at = join_at
        self.work = ShardWork(self.shards, pipe.next_seq, start_offset)
        pipe.shards = self.work
        sink.extra_headers = {"csmd-instance": self.instance.encode()}
        if t.create:
            ensure_topics(conf, {self.topic: self.shards}, t.replication)
        have = len(topic_partitions(conf, self.topic))
        if have != self.shards:
            raise CsmdError(f"coordination topic {self.topic!r} has {have} partitions but [cluster] shards = "
                            f"{self.shards}: the number of shards is fixed for the life of a deployment")
        deployment.check(conf, self.topic, c.group, deployment.describe(ctx.cfg, specs, self.instance), ctx.log)
        timeout = c.session_timeout_ms
        self.consumer = client(Consumer, {
            **conf, **librdkafka_settings(ctx.cfg.kafka.consumer), "group.id": c.group,
            "partition.assignment.strategy": "cooperative-sticky", "session.timeout.ms": timeout,
            "heartbeat.interval.ms": max(100, timeout // 10), "enable.auto.commit": False,
            "enable.auto.offset.store": False})
        self.joined = self._closing = False
        self._lock = threading.Lock()  # owned / live / gains: the main thread, the output thread, delivery reports
        self.owned: set[int] = set()  # assigned to this instance by Kafka
        self.live: set[int] = set()  # re-matched up to the gain and matched since: committed while owned
        self._held: set[int] = set()  # lost, but still matched here until the next assignment (_lost)
        self._gaining: set[int] = set()  # assigned, progress not read yet
        self._gains: dict[int, ShardChange] = {}  # shard -> its latest gain
        self._unacked: dict[ShardChange, int] = {}  # gain -> Kafka records of its re-match not acknowledged
        self.progress: dict[int, int] = {}  # the group's committed progress, as last read
        self.rebalances = 0
        self._paused_for: int | None = None  # the shard the input waits for (window full), once warned
        m = ctx.metrics
        for s in range(self.shards):
            m.set("csmd_cluster_shard_lag", 0, shard=s)
        self.sync(None, None)  # the window starts at the lowest progress before the first batch

    # -- the main thread ------------------------------------------------------------------------
    def poll(self, position: int) -> None:
        """Serve the group protocol (rebalance callbacks run here); join once caught up to `position`."""
        if not self.joined and position >= self.join_at:
            self.consumer.subscribe([self.topic], on_assign=self._assigned, on_revoke=self._revoked,
                                    on_lost=self._lost)
            self.joined = True
            self.ctx.log.info("joining the cluster", instance=self.instance, topic=self.topic, at=position)
        msg = self.consumer.poll(0)
        if msg is not None and msg.error() is not None and msg.error().code() != KafkaError._PARTITION_EOF:
            self.links.kafka_error(msg.error())
        if self._gaining:
            self._take_up()

    def room(self, position: int) -> int:
        """Updates the kept window may still take, the records on their way to it (below `position`,
        the next input offset) counted too."""
        return self.limit - self.work.retained - max(0, position - self.work.kept_to)

    def _read(self, shards) -> dict[int, int]:
        tps = self.consumer.committed([TopicPartition(self.topic, s) for s in shards], timeout=10)
        return {tp.partition: tp.offset for tp in tps if tp.offset >= 0}

    def sync(self, done: int | None, end: int | None) -> None:
        """Commit `done` (the done prefix of the input) as the progress of the live shards it
        advances; read every shard's progress; move the window's floor; refresh the metrics."""
        try:
            self.progress = self._read(range(self.shards))
            self._commit(done)
        except KafkaException as exc:
            if exc.args[0].code() in _RACED:  # the shards still owned after the rebalance commit next interval
                self.ctx.log.info("shard progress commit raced a rebalance, will retry after it",
                                  code=exc.args[0].name())
            else:  # the broker is away: the next interval tries again
                self.ctx.log.warning("shard progress: read or commit failed, will retry", reason=str(exc))
            return
        slowest = self._slowest()
        self.work.set_floor(self.progress.get(slowest, 0))
        m = self.ctx.metrics
        m.set("csmd_cluster_shards_owned", len(self.owned))
        m.set("csmd_cluster_retained_updates", self.work.retained)
        m.set("csmd_cluster_gc_holder", slowest)
        if end is not None:
            for s in range(self.shards):
                m.set("csmd_cluster_shard_lag", end - self.progress.get(s, 0), shard=s)
        if self.room(self.links.position()) > 0:
            self._paused_for = None
        elif self._paused_for != slowest:
            self._paused_for = slowest
            self.ctx.log.warning("input paused: the slowest shard holds the kept window (and the GC) at its limit",
                                 shard=slowest, progress=self.progress.get(slowest, 0),
                                 retained_updates=self.work.retained, limit=self.limit)

    def uncommitted(self, done: int) -> list[int]:
        """The owned shards whose progress, as last committed or read, is below `done`."""
        with self._lock:
            return sorted(s for s in self.owned if self.progress.get(s, -1) < done)

    def lowest(self) -> int:
        """The lowest progress of any shard, as last read."""
        return self.progress.get(self._slowest(), 0)

    def _slowest(self) -> int:
        """The shard with the lowest progress; of equals, one this instance does not match (its own
        move on as its records finish)."""
        return min(range(self.shards), key=lambda s: (self.progress.get(s, 0), s in self.live))

    def _commit(self, done: int | None) -> None:
        """Commit `done` for the live shards whose progress (as just read) it passes."""
        with self._lock:
            fresh = {s: done for s in self.live & self.owned if done is not None and done > self.progress.get(s, -1)}
        if fresh:
            self.consumer.commit(offsets=[TopicPartition(self.topic, s, o) for s, o in fresh.items()],
                                 asynchronous=False)
            self.progress.update(fresh)

    def _assigned(self, _consumer, parts) -> None:
        """Kafka hands shards over; they are taken up in poll, once their progress is read."""
        if self._closing:
            return
        gained = {p.partition for p in parts}
        with self._lock:
            back, gone = gained & self._held, self._held - gained
            self._held = set()
            self.owned |= gained
        if gone:
            self._drop(gone, "lost and not handed back")
        if back:
            self.ctx.log.info("shards handed back: matched here all along, no re-match", shards=sorted(back))
        if gained - back:
            self._rebalanced()
            self._gaining |= gained - back

    def _take_up(self) -> None:
        """Start matching the gained shards from their committed progress (0 where none is)."""
        try:
            first = self._read(self._gaining)
        except KafkaException as exc:  # the broker is away: the next poll tries again
            self.ctx.log.warning("shard progress not readable yet, will retry", reason=str(exc))
            return
        with self._lock:
            change = ShardChange({s: first.get(s, 0) for s in self._gaining if s in self.owned})
            self._gains.update((s, change) for s in change.gain)
        self._gaining.clear()
        if not change.gain:  # all of them were taken back meanwhile
            return
        self.links.hand_on(change)
        self.ctx.log.info("shards gained", shards=sorted(change.gain), progress=change.gain,
                          at=self.links.position())

    def _revoked(self, _consumer, parts) -> None:
        """Kafka takes shards away in an orderly rebalance: their last progress first."""
        lost = [p.partition for p in parts]
        if not lost or self._closing:  # at shutdown the final progress was committed just before
            return
        try:
            self.progress.update(self._read(lost))
            self._commit(self.links.done())
        except KafkaException as exc:  # the new owner re-matches a little more: duplicates, not losses
            self.ctx.log.warning("shard progress not committed before giving shards up", reason=str(exc))
        self._rebalanced()
        self._drop(lost, "revoked")

    def _lost(self, _consumer, parts) -> None:
        """The group moved on without this instance: it was silent past the session timeout, or (the
        usual case) a progress commit raced a rebalance that another instance's join started and got
        ILLEGAL_GENERATION, after which librdkafka declares the whole assignment lost and rejoins.
        The shards may be someone else's already, so their progress is no longer committed from here
        (_commit takes owned shards only); but the pipeline keeps matching them until the next
        assignment, and those handed straight back (the sticky assignor's usual answer) go on as live
        without a re-match. No delta can be lost that way: this instance matched every one of their
        records from its first offset on without a break (ShardWork never dropped them), each record
        counts as done only once its deltas are delivered, and a commit never moves a progress back,
        so whatever another owner committed meanwhile stays and what is committed from here is
        covered. What it published while not owning them are duplicates with the same ids. Shards
        still matched through a gain whose re-match is in flight go on with it. The others, and the
        held shards not handed back, are dropped: a later gain re-matches them from their progress."""
        lost = {p.partition for p in parts}
        if not lost or self._closing:
            return
        self._rebalanced()
        with self._lock:
            self.owned -= lost
            held = {s for s in lost if s in self._gains}  # in the pipeline's ShardWork, or on their way there
            self._held |= held
        self.ctx.log.info("shards lost", shards=sorted(lost), matched_until_next_assignment=sorted(held))
        self._drop(lost - held, None)

    def _rebalanced(self) -> None:
        self.rebalances += 1
        self.ctx.metrics.inc("csmd_cluster_rebalances_total")

    def _drop(self, lost, how: str | None) -> None:
        if not lost:
            return
        self._gaining.difference_update(lost)
        with self._lock:
            self.owned.difference_update(lost)
            self.live.difference_update(lost)
            for s in lost:
                self._gains.pop(s, None)
        self.links.hand_on(ShardChange({}, lost))
        if how:
            self.ctx.log.info(f"shards {how}", shards=sorted(lost))

    def close(self) -> None:
        """Leave the group, after the final commit (the consumer cannot read offsets while closing)."""
        self._closing = True
        self.consumer.close()

    # -- the output thread ------------------------------------------------------------------------
    def changed(self, change: ShardChange) -> None:
        """A shard change passed the executor: publish the gained shards' re-match; they become
        live (committable) once the broker has all of it."""
        if change.gaps:  # never skipped: the shards stay uncommitted, and a restart rebuilds from below them
            self.ctx.metrics.inc("csmd_cluster_gaps_total", len(change.gaps))
            s, oldest = min(change.gaps.items())
            self.ctx.fail(f"gained shard {s}'s progress {change.gain[s]} is older than anything this instance kept "
                         f"(from {oldest}): it cannot re-match the records in between, so it stops with that "
                         f"shard's progress uncommitted; a restart starts from a checkpoint at or below every "
                         f"shard's progress, or from [graph] initial")
            return
        if not change.gain:
            return
        self.ctx.metrics.inc("csmd_cluster_rematched_updates_total", change.rematched)
        with self._lock:
            self._unacked[change] = 1  # the change itself, until all of it is produced
        if change.result is not None:
            self.links.publish(change.result, lambda _o: self._acked(change), lambda _o: self._sending(change))
        self._acked(change)

    def _sending(self, change: ShardChange) -> None:
        with self._lock:
            self._unacked[change] += 1

    def _acked(self, change: ShardChange) -> None:
        with self._lock:
            self._unacked[change] -= 1
            if self._unacked[change]:
                return
            del self._unacked[change]
            self.live.update(s for s in change.gain if self._gains.get(s) is change)

    def stats(self) -> dict:
        with self._lock:
            owned, live = sorted(self.owned), sorted(self.live & self.owned)
        slowest = self._slowest()
        return {"instance": self.instance, "shards": self.shards, "joined": self.joined, "owned": owned,
                "live": live, "progress": {str(s): self.progress.get(s) for s in range(self.shards)},
                "rebalances": self.rebalances, "retained_updates": self.work.retained,
                "max_retained_updates": self.limit, "paused_for_shard": self._paused_for,
                "gc_held_by": {"shard": slowest, "progress": self.progress.get(slowest, 0)}}
