"""The continuous pipeline: graph updater -> executor -> output, with the GC behind.

Stages run in their own threads, connected by bounded queues: a full queue
blocks the stage before it (backpressure up to the source). Results leave in
update order because each stage handles batches in order. The MVG is shared:
the updater mutates it and the executor reads it under one lock, so a read at
timestamp T may happen after later batches were applied; the version rules make
that read see exactly G_T. `threaded=False` runs the same stages inline.

A source may also yield Markers between records: each passes every stage in
order, so whatever it does at the executor (register or remove a query, mute
output) takes effect exactly between the records before and after it.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

from csmd.cpu.executor import Executor, QueryDeltas, RegisteredQuery
from csmd.pipeline.gc import GarbageCollector
from csmd.model.graph import Graph
from csmd.service.metrics import LatencyHistogram
from csmd.cpu.mvg import MultiVersionGraph
from csmd.pipeline.sequencer import Batch, GraphUpdater

DEFAULT_BATCH_SIZE = 64
DEFAULT_BATCH_WAIT = 0.000125  # seconds: 0.125 ms
_END = object()


@dataclass
class BatchResult:
    batch: Batch
    deltas: list[QueryDeltas]
    done: float  # when the executor finished it (monotonic)


class Marker:
    """A point in the record stream; `seq` is set to the first sequence number after it."""

    seq: int = -1

    def at_executor(self, executor: Executor, mvg: MultiVersionGraph) -> None:
        """Runs in the executor stage, after every batch before the marker and before any after it."""


@dataclass
class Stats:
    records: int = 0
    updates: int = 0  # sequence numbers used
    batches: int = 0
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)  # per record: arrival to result


class Pipeline:
    """GU/EX/GC over one multi-version graph, for a fixed set of registered queries."""

    def __init__(self, g0: Graph, queries: list[RegisteredQuery], *, batch_size: int = DEFAULT_BATCH_SIZE,
                 batch_wait: float = DEFAULT_BATCH_WAIT, queue_depth: int = 4, threaded: bool = True,
                 first_seq: int = 0):
        self.mvg = MultiVersionGraph(g0)
        self.updater = GraphUpdater(self.mvg, first_seq)
        self.executor = Executor(queries)
        self.gc = GarbageCollector(self.mvg, first_seq)
        self.batch_size, self.batch_wait = batch_size, batch_wait
        self.queue_depth, self.threaded = queue_depth, threaded
        self.lock = threading.Lock()
        self.stats = Stats()
        self.queues: dict[str, queue.Queue] = {}  # between the stages, while running threaded

    # -- stages ------------------------------------------------------------------------------
    def _batches(self, source):
        """Group records: up to batch_size, or what arrived within batch_wait of the first.

        The source yields Update records, or None when nothing is available right now
        (a polling source), which lets a partial batch close on time, or Markers, which
        close the batch before them and pass on alone.
        """
        records, arrived, opened = [], [], 0.0
        for rec in source:
            if isinstance(rec, Marker):
                if records:
                    yield records, arrived
                    records, arrived = [], []
                yield rec, None
                continue
            now = time.monotonic()
            if rec is not None:
                if not records:
                    opened = now
                records.append(rec)
                arrived.append(now)
            if records and (len(records) >= self.batch_size or now - opened >= self.batch_wait and rec is None):
                yield records, arrived
                records, arrived = [], []
        if records:
            yield records, arrived

    def _update(self, records, arrived) -> Batch | Marker:
        if isinstance(records, Marker):
            records.seq = self.updater.next_seq
            return records
        with self.lock:
            batch, replaced = self.updater.apply(records, arrived)
        self.gc.replaced(replaced)
        return batch

    def _execute(self, batch: Batch | Marker) -> BatchResult | Marker:
        with self.lock:
            if isinstance(batch, Marker):
                batch.at_executor(self.executor, self.mvg)
                return batch
            deltas = self.executor.run(self.mvg, batch)
        return BatchResult(batch, deltas, time.monotonic())

    def _collect(self, result: BatchResult | Marker, on_result) -> None:
        """Hands a result (or a marker) on; on_result sees them in stream order."""
        on_result(result)
        if isinstance(result, Marker):
            return
        now = time.monotonic()
        b = result.batch
        self.stats.records += b.records
        self.stats.updates += b.end_seq - b.first_seq
        self.stats.batches += 1
        self.stats.latency.observe([now - t for t in b.arrived])
        free = self.gc.finished(b.first_seq, b.end_seq)
        if free:
            with self.lock:
                self.mvg.free(free)

    # -- driving -------------------------------------------------------------------------------
    def run(self, source, on_result) -> Stats:
        """Stream `source` through the pipeline; on_result(BatchResult or Marker) is called in stream order."""
        if not self.threaded:
            for records, arrived in self._batches(source):
                self._collect(self._execute(self._update(records, arrived)), on_result)
            return self.stats
        to_ex: queue.Queue = queue.Queue(self.queue_depth)
        to_out: queue.Queue = queue.Queue(self.queue_depth)
        self.queues = {"executor": to_ex, "output": to_out}
        errors: list[BaseException] = []
        stop = threading.Event()

        def put(q, item):
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.05)
                    return
                except queue.Full:
                    continue

        def gu():
            try:
                for records, arrived in self._batches(source):
                    if stop.is_set():
                        break
                    put(to_ex, self._update(records, arrived))
            except BaseException as exc:  # re-raised in the caller's thread
                errors.append(exc)
            put(to_ex, _END)

        def get(q):
            while not stop.is_set():
                try:
                    return q.get(timeout=0.05)
                except queue.Empty:
                    continue
            return _END

        def ex():
            try:
                while (item := get(to_ex)) is not _END:
                    put(to_out, self._execute(item))
            except BaseException as exc:
                errors.append(exc)
                stop.set()
            put(to_out, _END)

        threads = [threading.Thread(target=gu, name="csmd-gu", daemon=True),
                   threading.Thread(target=ex, name="csmd-ex", daemon=True)]
        for t in threads:
            t.start()
        try:
            while (item := get(to_out)) is not _END:
                self._collect(item, on_result)
        except BaseException:
            stop.set()
            raise
        finally:
            stop.set()
            for t in threads:
                t.join()
        if errors:
            raise errors[0]
        return self.stats
