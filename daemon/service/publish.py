"""Output and delivery: the pipeline's results become Kafka records; refused records become dead letters.

The output thread (Output) runs the pipeline over the intake and publishes every
batch's deltas (Publisher, holding back those a restart re-derives below the
committed offsets); the delivery tracker learns what each input record is waiting for.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable

import numpy as np

from csmd.connectors.kafka import KafkaSink, arrow_messages
from csmd.connectors.records import Record
from csmd.pipeline.deltas import DeltaEncoder, warm_encoder
from csmd.pipeline.stages import Marker, Pipeline
from csmd.service.context import STOP, DaemonContext, Intake
from csmd.service.control import Queries
from csmd.service.delivery import DeliveryTracker, unwatched

MAX_REASON = 500  # characters of a dead letter's reason (csmd-error) and its log line


class DeadLetters:
    """Refused records (the main thread's: input and control records), to the dead-letter topic.
    `suppress`: input partition -> the offset below which records were delivered before a restart
    (the publisher's, see there)."""

    def __init__(self, ctx: DaemonContext, sink: KafkaSink, tracker: DeliveryTracker, suppress: dict[int, int]):
        self.ctx, self.sink, self.tracker, self.suppress = ctx, sink, tracker, suppress

    def send(self, rec: Record, reason: str) -> None:
        """Send a refused record to the dead-letter topic; an input record is done once it is there.
        The reason is cut to MAX_REASON characters (a bad line can be a megabyte, and a reason quotes
        it), its bytes to what fits under max_message_bytes, with csmd-truncated giving their
        length, and headers that alone take half of that are dropped (csmd-headers-dropped: how
        many): a dead letter the broker refuses would stop the daemon, and again after every restart."""
        if len(reason) > MAX_REASON:
            reason = f"{reason[:MAX_REASON]}... ({len(reason)} characters)"
        tracked = rec.input == self.ctx.cfg.topics.input
        if tracked and rec.offset < self.suppress.get(rec.partition, -1):
            self.ctx.log.debug("dead letter sent before the restart, not again", record=rec.source)
            self.tracker.submitted(rec.origin, 0)
            return
        self.ctx.metrics.inc("csmd_dead_letters_total")
        self.ctx.log.warning("dead letter", record=rec.source, reason=reason)
        limit = self.ctx.cfg.topics.max_message_bytes
        headers = list(rec.headers)  # the record's own, unchanged, then ours (a consumer's dict keeps the last)
        if sum(len(k) + len(v or b"") for k, v in headers) > limit // 2:  # they alone could not be sent
            headers = [("csmd-headers-dropped", str(len(headers)).encode())]
        # the record's key, as its deltas would have carried it; dropped above a quarter of the limit,
        # so that it, headers up to half and some of the value fit
        key = rec.key
        if key is not None and len(key) > limit // 4:
            headers.append(("csmd-key-dropped", str(len(key)).encode()))
            key = None
        headers += [("csmd-error", reason.encode()), ("csmd-input", rec.input.encode()),
                    ("csmd-partition", str(rec.partition).encode()), ("csmd-offset", str(rec.offset).encode())]
        value = rec.value
        room = limit - len(key or b"") - sum(len(k) + len(v or b"") + 16 for k, v in headers) - 256
        if len(value) > room:
            headers.append(("csmd-truncated", str(len(value)).encode()))
            value = value[:max(room, 0)]
        if tracked:
            self.tracker.submitted(rec.origin, 0, sends=1)
        self.sink.produce(self.ctx.cfg.topics.dead_letter, value, key, headers,
                          self.tracker.acked if tracked else unwatched, [rec.origin] if tracked else ())


class Publisher:
    """A batch's deltas, counted and encoded, to the output topic (the output thread's, and a
    cluster's re-matches). `suppress` (input partition -> offset, shrinking as the stream passes
    them): deltas of records below these offsets were delivered before a restart and are held back."""

    def __init__(self, ctx: DaemonContext, encoder: DeltaEncoder, sink: KafkaSink, queries: Queries,
                 suppress: dict[int, int]):
        self.ctx, self.encoder, self.sink, self.queries, self.suppress = ctx, encoder, sink, queries, suppress

    def publish(self, result, on_ack, on_send) -> None:
        """Count and publish a batch's deltas; on_send(origins) / on_ack(origins) per Kafka record."""
        for d in result.deltas:
            tot = self.queries.totals.setdefault(d.name, [0, 0])
            tot[0] += d.positive
            tot[1] += d.negative
        items = self.encoder.encode(result)  # built piece by piece as the sink takes them
        if self.suppress:  # what is published: not what a restart holds back (all pieces at once: rare)
            items = self._unsuppressed(list(items))
            published = []
            for query, batch, _origins in items:
                sign, count = batch.column("sign").to_numpy(), batch.column("count").to_numpy()
                published.append((query, int(count[sign > 0].sum()), int(count[sign < 0].sum())))
        else:  # everything: the counts are known (the encoder's items are the deltas with rows, in order)
            published = [(d.name, d.positive, d.negative) for d in result.deltas if len(d.seq)]
        for query, pos, neg in published:
            if pos:
                self.ctx.metrics.inc("csmd_deltas_total", pos, query=query, sign="+")
            if neg:
                self.ctx.metrics.inc("csmd_deltas_total", neg, query=query, sign="-")
            self.ctx.metrics.deltas_rate.add(pos + neg)
        n = self.sink.write(items, on_ack, on_send)
        self.ctx.metrics.inc("csmd_output_records_total", n)

    def _unsuppressed(self, items):
        """Drop deltas of records below the committed offsets: they were delivered before a restart."""
        if not self.suppress:
            return items
        out = []
        for query, batch, origins in items:
            limit = np.array([self.suppress.get(p, -1) for p in batch.column("partition").to_numpy()])
            keep = batch.column("offset").to_numpy() >= limit
            if keep.all():
                out.append((query, batch, origins))
            elif keep.any():
                kept = {o for o in origins if o[2] >= self.suppress.get(o[1], -1)}
                out.append((query, batch.filter(keep), [o for o in origins if o in kept]))
        last = {}
        for _q, batch, _o in items:
            for p, o in zip(batch.column("partition").to_numpy().tolist(), batch.column("offset").to_numpy().tolist()):
                last[p] = max(last.get(p, -1), o)
        for p, o in last.items():  # past the committed offset: nothing more to hold back there
            if o >= self.suppress.get(p, 1 << 62):
                self.suppress.pop(p, None)
        return out


class Output:
    """The output thread: runs the pipeline over the intake, publishes each batch's deltas and hands
    each marker, as it passes, to the part it is for (`markers`: marker class -> handler)."""

    def __init__(self, ctx: DaemonContext, pipe: Pipeline, intake: Intake, tracker: DeliveryTracker,
                 publisher: Publisher, markers: dict[type, Callable[[Marker], None]]):
        self.ctx, self.pipe, self.intake, self.tracker = ctx, pipe, intake, tracker
        self.publisher, self.markers = publisher, markers

    def _items(self):
        """The pipeline's source: updates and markers from the input queue; None when idle."""
        wait = self.ctx.cfg.pipeline.batch_wait_ms / 1000
        busy = False
        while True:
            try:
                item = self.intake.get(timeout=wait if busy else 0.05)
            except queue.Empty:
                busy = False
                yield None
                continue
            if item is STOP or self.ctx.fatal is not None:  # after a fatal error nothing more is worth doing
                return
            busy = True
            yield item

    def run(self) -> None:
        try:
            self.pipe.run(self._items(), self._on_result)
        except BaseException as exc:  # an engine failure: stop the daemon, commit nothing more
            self.ctx.log.exception("pipeline failed")
            self.ctx.fail(f"pipeline failed: {exc!r}")

    def _on_result(self, result) -> None:
        if isinstance(result, Marker):
            self.markers[type(result)](result)
            self.intake.marker_passed()
            return
        self.publisher.publish(result, self.tracker.acked, self.tracker.sending)
        b = result.batch
        self.ctx.metrics.produced.observe(time.monotonic() - b.arrived)
        # counted before the tracker hears of it: once the records are done (none pending), stats
        # must count their updates
        self.ctx.metrics.inc("csmd_updates_total", b.records)
        self.ctx.metrics.updates_rate.add(b.records)
        self.tracker.executed(b.records)



def warm_output(vertices, max_bytes: int) -> float:
    """Encode a batch's deltas with a throwaway encoder and serialize them as the output does
    (warm_encoder): what the first batch's publish would load on first use loads now (pyarrow's
    lazy imports pull in pandas where it is installed: 0.5 s of the first batch's latency on the
    device host, on every instance of a cluster; with no numba cache, the column fills compiled
    in the stream held a GPU daemon's first records 140-280 ms). Returns the seconds it took."""
    t0 = time.monotonic()
    for record_batch in warm_encoder(vertices):
        record_batch.column("sign").to_numpy()
        arrow_messages(record_batch, max_bytes)
    return time.monotonic() - t0
