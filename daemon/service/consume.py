"""The consume loop (main thread): input records in, with backpressure; commits; drains.

Delivery is at-least-once: an input offset is committed only after every Kafka
record its updates caused is acknowledged (daemon/service/delivery.py), and never
below an offset committed before.
"""

from __future__ import annotations

import threading
import time

from confluent_kafka import KafkaException, TopicPartition

from csmd.connectors.records import BadRecord, Polled, Record, RecordBlock, decode_updates, plain_runs


class ConsumeLoop:
    """The Daemon's part that runs in the main thread."""

    def _take(self, records: Polled) -> None:
        """A poll's records, into the pipeline in order. Runs of plain text records go
        as one block each (decoded together, one hand-off, one bookkeeping step: what every
        instance of a cluster pays for every record); the others, and every record while
        replayed control changes wait for their position, one at a time."""
        if self._scheduled or len(self.source.partitions) > 1:  # a block is of one partition
            items = records
        else:
            items = plain_runs(records, self.cfg["input"]["format"], self._str_ids, self.carry)
        for item in items:
            if isinstance(item, RecordBlock):
                offsets, updates = item.records()
                self.metrics.inc("csmd_records_total", len(offsets))
                self.tracker.submitted_run(item.path, item.partition, offsets, updates)
                self._inq.put(item)
                self._next_offsets[item.partition] = int(offsets[-1]) + 1
            else:
                self._submit(item)

    def _submit(self, rec: Record) -> None:
        self._release_scheduled(rec)
        self.metrics.inc("csmd_records_total")
        try:
            updates = decode_updates(rec, self.cfg["input"]["format"], self._str_ids, self.cfg["graph"]["max_id_bytes"],
                                     self.carry, self.labels)
        except BadRecord as exc:
            self._dead_letter(rec, str(exc))
        else:
            self.tracker.submitted(rec.origin, len(updates))
            for u in updates:
                self._inq.put(u)
        self._next_offsets[rec.partition] = rec.offset + 1

    def _loop(self, out: threading.Thread) -> None:
        d, c = self.cfg["delivery"], self.cfg["checkpoint"]
        max_pending = self.cfg["pipeline"]["max_pending_records"]
        next_commit = time.monotonic() + d["commit_interval_ms"] / 1000
        next_ckpt = time.monotonic() + c["interval_s"]
        while not self.stopping.is_set():
            if not out.is_alive():
                self.ctx.fail("the pipeline stopped")
                break
            self._poll_control()
            if self.cluster is not None:
                self.cluster.poll(self._next_offsets.get(0, 0))
            # Backpressure: one poll takes no more than the room left, so the records in flight
            # never pass the limit; with no room the consumer takes nothing until half of it is
            # free. (librdkafka's own pause is not used: it drops what it prefetched and fetches
            # again only at its next wake-up, about a second, on every pause.) A cluster's kept
            # window pauses it too (daemon/service/cluster.py).
            pending = self.tracker.pending()
            room = max_pending - pending
            if self.cluster is not None:
                room = min(room, self.cluster.room(self._next_offsets.get(0, 0)))
            if room <= 0 and not self.paused:
                self.paused = True
                self.metrics.inc("csmd_consumer_pauses_total")
            elif self.paused and pending <= max_pending // 2 and room > 0:
                self.paused = False
            if self.paused:
                self.sink.poll(0.02)
            else:
                self._take(self.source.poll(min(self.cfg["input"]["max_poll_records"], room), 0.02))
            self.sink.poll(0)
            now = time.monotonic()
            # a daemon with every record done commits at once, not at the next interval: the end of a
            # burst is delivered (and a cluster's shard progress moves) up to an interval sooner
            done = self.tracker.committable()
            idle = not self.tracker.pending() and done != self._done_at_commit
            if now >= next_commit or idle:
                self._done_at_commit = done
                if self.sink.transactional:  # a transaction ends where no record is half done
                    self._drain()
                    self._commit_all()
                else:
                    self._commit()
                self._gauges()
                next_commit = now + d["commit_interval_ms"] / 1000
            if c["dir"] and now >= next_ckpt:
                if self._checkpoint_due():
                    self._take_checkpoint()
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
            # negative when the daemon is past the topic's end: a sign of trouble, never hidden
            m.set("csmd_consumer_lag", hi - self._next_offsets.get(p, 0), partition=p)
        engine = self.pipe.engine_stats()
        m.set("csmd_gc_live_versions", engine["live_versions"])
        m.set("csmd_device_memory_bytes", engine["memory_bytes"])
        m.set("csmd_seq", self.pipe.next_seq)
        m.set("csmd_queries", len(self.specs))

    def _commit(self, wait: bool = False) -> None:
        topic = self.cfg["topics"]["input"]
        offsets = {p: o for (t, p), o in self.tracker.committable().items() if t == topic}
        if self.cluster is not None:  # progress per shard instead of the input group's offsets
            done = offsets.get(0)
            if done is None and not self.tracker.pending():  # no record since the start: all below it is done
                done = self._next_offsets.get(0)
            self.cluster.sync(done, self.source.end_offsets().get(0))
            return
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
            self.ctx.fail("the broker did not acknowledge every record within 60 s")

    def _commit_all(self) -> None:
        """After a drain: the input offsets of everything submitted (in the transaction, if any)."""
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
