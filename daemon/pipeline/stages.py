"""The continuous pipeline: graph updater (GU) -> executor (EX) -> output, with the GC behind.

Stages run in their own threads, connected by bounded queues: a full queue blocks
the stage before it (backpressure up to the source). GU sequences each batch
(shared sequencer) and has the engine apply it; EX submits applied batches to the
engine, which may still be matching batch k while GU applies batch k+1 (the version
rules make a read at batch k's timestamps blind to later batches); the output stage
waits for each batch's matches in stream order, puts them in the canonical delta
order, hands them on and tells the GC which updates finished. `threaded=False` runs
the same stages inline.

A quiet stream does not pay for the hand-offs: a batch that the source was idle
before or after, formed while no earlier batch is anywhere in the pipeline, runs all
its stages on the updater's thread (threads contending for the interpreter lock and
waking each other cost a batch of one as much as its own work). So do small batches
of fixed size (at most INLINE_RECORDS records, batches that do not grow): their work
is interpreter-bound, which threads cannot overlap, and the hand-offs doubled a batch of
one's cost. There the updater's thread itself overlaps what the engine does in the
background (the device's search, the CPU engine's worker threads): it applies and
submits the next batch before it waits for this one's matches, and outputs a batch at
once only when the source is idle after it. Under load the source is never idle, so
the stages of other batches run on their own threads and overlap; there a thread
woken by a hand-off waits for the interpreter lock at most SWITCH_INTERVAL, not
Python's default 5 ms.

While a stream runs, what existed at its start (modules, the graph, the engine, the
queries) is frozen out of the cyclic garbage collector's sight (gc.freeze): a full
collection walks every tracked object, and over a process with CuPy, numba and pyarrow
loaded one took 70-85 ms on the device host, a stall every record in flight waited for
(the paced p99 at batch 1 went from 5 to 140 ms). Later full collections walk only what
the stream made; the heap is unfrozen when the stream ends (the last one, where several run).

A source may also yield Markers between records: each passes every stage in order,
so what it does at the updater (take a consistent snapshot) or at the executor
(register or remove a query) takes effect exactly between the records before and
after it.
"""

from __future__ import annotations

import gc
import queue
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from csmd.engine import ContinuousEngine, QueryDeltas, UpdateBatch
from csmd.latency import LatencyHistogram
from csmd.model.direction import arcs_of
from csmd.model.formats import Update, UpdateBlock
from csmd.model.graph import Graph, id_array
from csmd.model.time_constraints import check_distinct
from csmd.pipeline.event_time import EventTime
from csmd.pipeline.gc import GarbageCollector
from csmd.pipeline.queries import canonical, continuous_query, vertex_matches
from csmd.pipeline.sequencer import Sequencer, Vertices

DEFAULT_BATCH_SIZE = 64
DEFAULT_BATCH_WAIT = 0.0  # seconds a forming batch waits for more records: none (bench/README.md, "The host path")
# fixed-size batches of at most this many records run on the updater's thread (module docstring);
# batch 1, human, a query with no candidates: 83 -> 54 us a batch on the CPU engine (2-core VM)
INLINE_RECORDS = 64
SWITCH_INTERVAL = 0.0002  # seconds; process-wide (sys.setswitchinterval), set when the stage threads start
_END = object()
IDLE = object()  # what _batches yields (as a batch) when the source has nothing for now and no batch is forming


class _Frozen:
    runs = 0  # streams running in this process: the last one to end unfreezes the heap
    lock = threading.Lock()


@contextmanager
def heap_frozen():
    """The heap as it is now out of the cyclic collector's sight until the block ends (see the
    module's docstring); blocks may overlap (pipelines in several threads)."""
    with _Frozen.lock:
        gc.freeze()
        _Frozen.runs += 1
    try:
        yield
    finally:
        with _Frozen.lock:
            _Frozen.runs -= 1
            if not _Frozen.runs:
                gc.unfreeze()


@dataclass
class BatchResult:
    batch: UpdateBatch
    deltas: list[QueryDeltas]
    done: float  # when its matches were ready (monotonic)
    follows: bool = True  # its records come right after the previous result's (a gained shard's re-match's do not)


class Part(NamedTuple):
    """Ops of applied batches to match, with their queries ((ContinuousQuery, prepared) pairs):
    query i matches edge op j where edges[i, j] and vertex op j where vertices[i, j]; both
    None: every op (a cluster instance's share is a selection, pipeline/shards.py)."""

    work: UpdateBatch
    queries: list
    edges: np.ndarray | None = None
    vertices: np.ndarray | None = None


class Registered:
    """The registered queries as the stages use them: built when they change, not per batch (with a
    hundred queries, a small batch looped over them five times, a third of its host time)."""

    def __init__(self, queries: dict[str, tuple]):
        self.pairs = list(queries.values())  # (ContinuousQuery, the engine's form or None), in registration order
        self.index = {cq.name: i for i, (cq, _pq) in enumerate(self.pairs)}
        self.searched = [i for i, (_cq, pq) in enumerate(self.pairs) if pq is not None]
        self.prepared = [self.pairs[i][1] for i in self.searched]  # what the engine searches (one list: engines cache by it)
        self.singles = [i for i, (_cq, pq) in enumerate(self.pairs) if pq is None]  # one vertex: matched here
        self.empty = canonical([(cq, None) for cq, _pq in self.pairs], None)  # each query's deltas when it has none


class Marker:
    """A point in the record stream; `seq` is set to the first sequence number after it."""

    seq: int = -1

    def at_updater(self, pipe: "Pipeline") -> None:
        """Runs in the updater stage, after every batch before the marker was applied and before any after it."""

    def at_executor(self, pipe: "Pipeline") -> None:
        """Runs in the executor stage, after every batch before the marker and before any after it."""


@dataclass
class Stats:
    records: int = 0
    updates: int = 0  # sequence numbers used
    batches: int = 0
    largest: int = 0  # records of the largest batch (grown past batch_size while the executor was behind)
    inline: int = 0  # batches whose stages all ran on the updater's thread (a quiet stream)
    max_ahead: int = 0  # most batches applied beyond the one the executor took (GU/EX overlap)
    latency: LatencyHistogram = field(default_factory=LatencyHistogram)  # per record: arrival to result


@dataclass
class GraphState:
    """A consistent copy of the graph between two batches (checkpoints, static queries)."""

    ext_ids: list
    labels: np.ndarray
    alive: np.ndarray  # per vertex; a deleted vertex keeps its internal id
    src: np.ndarray  # live edges, internal ids, src < dst (directed: every arc src -> dst)
    dst: np.ndarray
    elabel: np.ndarray
    seq: int  # the updates before it are in
    str_ids: bool = False  # the ids' kind, also where there is no vertex to tell
    directed: bool = False
    # event time (pipeline/event_time.py): each edge's ts (None: it has none) and the largest ts
    # applied; None where event time is off
    edge_ts: pa.Array | None = None
    high_ts: int | None = None

    def live_graph(self) -> Graph:
        """The live vertices and edges as a static Graph (renumbered), with their ts under event
        time (a static query's span and order read them: csmd admin match)."""
        live = np.flatnonzero(self.alive)
        new_id = np.full(len(self.alive), -1, np.int64)
        new_id[live] = np.arange(len(live))
        ext = id_array(self.ext_ids, self.str_ids)
        g = Graph.from_edges(self.labels[live], new_id[self.src], new_id[self.dst], self.elabel, ext[live],
                             self.directed)
        if self.edge_ts is not None:
            has = ~np.asarray(self.edge_ts.is_null(), bool)
            ts = self.edge_ts.fill_null(0).to_numpy()
            g.edge_ts = (ext[self.src[has]], ext[self.dst[has]], ts[has].astype(np.int64))
        return g


class _Arrivals:
    """A forming batch's arrival times, one per update, as runs of updates that arrived together
    (a block's thousands at once): one array when the batch closes, not a float per update."""

    def __init__(self):
        self._at: list[float] = []
        self._n: list[int] = []

    def add(self, now: float, n: int) -> None:
        self._at.append(now)
        self._n.append(n)

    def times(self) -> np.ndarray:
        return np.repeat(np.array(self._at, np.float64), self._n)


def _joined(parts: list, blocks: int) -> list[Update] | UpdateBlock:
    """A batch's Updates and block pieces (`blocks` of them), in order: one block if there are
    only blocks, the list itself if there are none."""
    if not blocks:
        return parts
    if blocks == len(parts):
        return UpdateBlock.concat(parts)
    return [u for p in parts for u in (p.updates() if isinstance(p, UpdateBlock) else (p,))]


class Pipeline:
    """GU/EX/GC of one engine's multi-version graph, for the queries registered on it.

    engine: a ContinuousEngine holding g0 (backends.py chooses it). retired marks the
    vertices of g0 that were deleted (a restored checkpoint). executor_lag holds the
    executor back until that many later batches were applied (a test switch that forces
    GU/EX overlap; queue_depth must exceed it).

    event_time: its window and lateness (pipeline/event_time.py); None: off.

    max_batch (default batch_size): while the executor has a batch waiting (it is behind),
    the batch being formed takes up to this many records instead of batch_size. Every
    batch costs the same host work whatever its size (sequencing, launches, one result per
    query), so small batches cannot keep up at high rates; grown batches can, and the
    deltas and their ids do not depend on the batching. When the executor keeps up,
    batches stay at batch_size and a record waits for no other.
    """

    def __init__(self, g0: Graph, *, engine: ContinuousEngine, batch_size: int = DEFAULT_BATCH_SIZE,
                 batch_wait: float = DEFAULT_BATCH_WAIT, queue_depth: int = 4, threaded: bool = True,
                 first_seq: int = 0, retired: np.ndarray | None = None, executor_lag: int = 0,
                 max_batch: int | None = None, event_time: EventTime | None = None):
        self.engine = engine
        self.vertices = Vertices(g0, retired)
        self.directed = g0.directed
        self.sequencer = Sequencer(self.vertices, engine, first_seq, g0.directed, event_time, g0)
        self.gc = GarbageCollector(first_seq)
        self.batch_size, self.batch_wait = batch_size, batch_wait
        self.max_batch = max(batch_size, max_batch or batch_size)
        # the most records of a batch run on the updater's thread (besides a quiet stream's): a batch
        # that grows is cut while the executor is behind, which it never is on the updater's thread
        self.inline_records = 0 if self.max_batch > batch_size else INLINE_RECORDS
        self.queue_depth, self.threaded = max(queue_depth, executor_lag + 1), threaded
        self.executor_lag = executor_lag
        self.queries: dict[str, tuple] = {}  # name -> (ContinuousQuery, the engine's form); executor stage
        self._registered: Registered | None = None  # of self.queries, made again when they change
        self.stats = Stats()
        self.queues: dict[str, queue.Queue] = {}  # between the stages, while running threaded
        self.shards = None  # a ShardWork when a cluster splits the matching (pipeline/shards.py): all matched here
        # held while a batch is sequenced and applied; re-entrant so that a marker's
        # at_updater (which runs under it) can take graph_state()
        self._updating = threading.RLock()
        self._applied = threading.Condition()
        self._applied_batches = 0
        self._gu_done = False

    # -- what the service uses -----------------------------------------------------------------
    @property
    def next_seq(self) -> int:
        return self.sequencer.next_seq

    @property
    def ignored(self):
        return self.sequencer.ignored

    def add_query(self, name: str, q: Graph, count_only: bool = False, distinct: bool = False) -> None:
        """Register (or replace) a query: before run, or from a marker's at_executor. distinct: one
        delta per subgraph instance (continuous_query)."""
        if distinct:
            check_distinct(q, name)
        cq = continuous_query(name, q, self.vertices.labels, count_only, distinct)
        self.queries[name] = (cq, self.engine.prepare(cq) if q.n > 1 else None)
        self._registered = None

    def warm(self) -> None:
        """Have the engine build what the first batch's search of the registered queries would
        build (the same list _submit hands it): before a stream, not in its first batch."""
        prepared = self.registered().prepared  # the list every batch will hand the engine
        if prepared:  # a daemon may start with none (queries added at run time): nothing to build
            self.engine.warm(prepared)

    def remove_query(self, name: str) -> bool:
        self._registered = None
        return self.queries.pop(name, None) is not None

    def registered(self) -> Registered:
        """The queries registered now (executor stage)."""
        if self._registered is None:
            self._registered = Registered(self.queries)
        return self._registered

    def query_names(self) -> list[str]:
        return list(self.queries)

    def graph_state(self) -> GraphState:
        """The graph between two batches, with its sequence number (waits for a batch being applied)."""
        with self._updating:
            src, dst, lab = self.engine.live_edges()
            if self.directed:  # the engines hold pairs
                src, dst, lab = arcs_of(src, dst, lab)
            vx = self.vertices
            clock = self.sequencer.clock
            edge_ts = None if clock is None else clock.ts_of(src, dst)
            return GraphState(list(vx.ext_ids), vx.labels.copy(), vx.alive(), src, dst, lab, self.next_seq, vx.str_ids,
                              self.directed, edge_ts, None if clock is None else clock.high)

    def engine_stats(self) -> dict:
        s = self.engine.stats()
        return {"engine": self.engine.name, "live_versions": s.live_versions, "memory_bytes": s.memory_bytes,
                "released": self.gc.released}

    # -- stages ------------------------------------------------------------------------------
    def _batches(self, source, backlog=lambda: False, idle=False):
        """Group records: up to batch_size (max_batch while backlog() says the executor is
        behind), or what arrived within batch_wait of the first; yields (batch or marker,
        arrival times, quiet): quiet when the source was idle before its first record or
        after its last. idle: also yield (IDLE, None, True) once each time the source has
        nothing for now and no batch is forming.

        The source yields Update records, or UpdateBlocks (runs of updates in columns, cut
        into batches here without a step per update), or None when nothing is available
        right now (a polling source), which lets a partial batch close on time, or Markers,
        which close the batch before them and pass on alone. A batch is a list of Updates,
        or an UpdateBlock when it was cut from blocks alone.
        """
        grow = self.max_batch > self.batch_size

        def limit() -> int:
            return self.max_batch if grow and backlog() else self.batch_size

        parts, blocks, count, arrived, opened, quiet = [], 0, 0, _Arrivals(), 0.0, False
        for rec in source:
            if isinstance(rec, Marker):
                if count:
                    yield _joined(parts, blocks), arrived.times(), quiet
                    parts, blocks, count, arrived, quiet = [], 0, 0, _Arrivals(), False
                yield rec, None, quiet
                quiet = False
                continue
            now = time.monotonic()
            if isinstance(rec, UpdateBlock):
                lo = 0
                while lo < len(rec):
                    if not count:
                        opened = now
                    cap = limit()
                    if count < cap:
                        hi = min(len(rec), lo + cap - count)
                        parts.append(rec.rows(lo, hi))
                        arrived.add(now, hi - lo)
                        blocks, count, lo = blocks + 1, count + hi - lo, hi
                    if count >= cap:
                        yield _joined(parts, blocks), arrived.times(), quiet
                        parts, blocks, count, arrived, quiet = [], 0, 0, _Arrivals(), False
                continue
            if rec is None and not count:
                if idle and not quiet:
                    yield IDLE, None, True
                quiet = True
            if rec is not None:
                if not count:
                    opened = now
                parts.append(rec)
                arrived.add(now, 1)
                count += 1
            full = count >= self.batch_size and count >= limit()  # the queue is asked only when it matters
            if count and (full or now - opened >= self.batch_wait and rec is None):
                yield _joined(parts, blocks), arrived.times(), quiet or rec is None  # closed by an idle poll: quiet too
                parts, blocks, count, arrived, quiet = [], 0, 0, _Arrivals(), False
        if count:
            yield _joined(parts, blocks), arrived.times(), quiet

    def _update(self, records, arrived) -> UpdateBatch | Marker:
        with self._updating:
            if isinstance(records, Marker):
                records.at_updater(self)
                records.seq = self.next_seq
                return records
            batch = self.sequencer.sequence(records, arrived)
            replaced = self.engine.apply(batch)
        self.gc.replaced(replaced)
        with self._applied:
            self._applied_batches += 1
            self._applied.notify_all()
        return batch

    def _execute(self, batch: UpdateBatch | Marker):
        """Submit one batch (or pass a marker); returns what the output stage waits on."""
        if isinstance(batch, Marker):
            batch.at_executor(self)
            return batch
        index, self._executed = self._executed, self._executed + 1
        if self.executor_lag and self.threaded:
            full = self.queues["executor"].full  # markers take its places too: then the updater waits on us
            with self._applied:
                while not (self._gu_done or self._applied_batches > index + self.executor_lag or full()):
                    self._applied.wait(0.05)
        self.stats.max_ahead = max(self.stats.max_ahead, self._applied_batches - index - 1)
        reg = self.registered()
        if self.shards is None:
            part = Part(batch, reg.pairs)
        else:
            part = self.shards.select(batch, reg.pairs)
            self.gc.hold(self.shards.hold_seq)
        return batch, reg, part, self._submit(part, reg)

    def _submit(self, part: Part | None, reg: Registered):
        """Submit the part's ops (its queries: reg's) for the queries of two vertices or more: the
        pending search, or None."""
        if part is None or not reg.searched:
            return None
        select = part.edges
        if select is not None and len(reg.searched) < len(reg.pairs):
            select = select[reg.searched]
        return self.engine.submit(part.work, reg.prepared, select)

    def _deltas(self, reg: Registered, part: Part | None, pending) -> list[QueryDeltas]:
        """Every registered query's deltas for the batch, in registration order (a query whose
        shards hold none of its ops has none): the queries with matches put in canonical order,
        the others' empty deltas as they were made at registration."""
        out = list(reg.empty)
        if part is None:
            return out
        matches = pending.result() if pending is not None else {}
        found = [(reg.index[name], m) for name, m in matches.items() if m is not None]
        for i in reg.singles:
            m = vertex_matches(reg.pairs[i][0], part.work, self.vertices.labels,
                               None if part.vertices is None else part.vertices[i])
            if m is not None:
                found.append((i, m))
        for (i, _m), d in zip(found, canonical([(reg.pairs[i][0], m) for i, m in found], part.work)):
            out[i] = d
        return out

    def match_now(self, part: Part) -> list[QueryDeltas]:
        """Match ops of batches applied earlier, each at its own timestamp (a gained shard's
        re-match): `part` as ShardWork gives it for the queries registered now; from the executor
        stage, while their versions are held."""
        reg = self.registered()
        return self._deltas(reg, part, self._submit(part, reg))

    def _output(self, item, on_result) -> None:
        """Wait for a batch's matches, put them in canonical order and hand them on (stream order)."""
        if isinstance(item, Marker):
            on_result(item)
            return
        b, reg, part, pending = item
        deltas = self._deltas(reg, part, pending)
        now = time.monotonic()
        on_result(BatchResult(b, deltas, now))
        self.stats.records += b.records
        self.stats.updates += b.end_seq - b.first_seq
        self.stats.batches += 1
        self.stats.largest = max(self.stats.largest, b.records)
        self.stats.latency.observe(now - b.arrived)
        free = self.gc.finished(b.first_seq, b.end_seq)
        if free:
            self.engine.release(free)

    # -- driving -------------------------------------------------------------------------------
    def run(self, source, on_result) -> Stats:
        """Stream `source` through the pipeline; on_result(BatchResult or Marker) is called in stream order."""
        with heap_frozen():
            return self._run(source, on_result)

    def _run(self, source, on_result) -> Stats:
        self._gu_done, self._executed = False, 0
        if not self.threaded:
            for records, arrived, _ in self._batches(source):
                self._output(self._execute(self._update(records, arrived)), on_result)
            return self.stats
        sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL))
        to_ex: queue.Queue = queue.Queue(self.queue_depth)
        to_out: queue.Queue = queue.Queue(self.queue_depth)
        self.queues = {"executor": to_ex, "output": to_out}
        errors: list[BaseException] = []
        stop = threading.Event()
        in_flight = [0]  # batches and markers handed to the executor stage and not yet output
        flight = threading.Lock()

        def put(q, item):
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.05)
                    return
                except queue.Full:
                    continue

        def get(q):
            while not stop.is_set():
                try:
                    return q.get(timeout=0.05)
                except queue.Empty:
                    continue
            return _END

        def gu_done():
            with self._applied:
                self._gu_done = True
                self._applied.notify_all()

        held = []  # an inline batch submitted, its output after the next batch's submission

        def output_held():  # before anything later: output keeps the stream's order
            while held:
                self._output(held.pop(), on_result)

        def gu():
            try:
                for records, arrived, quiet in self._batches(source, lambda: to_ex.qsize() > 0, True):
                    if stop.is_set():
                        break
                    if records is IDLE:
                        output_held()
                        continue
                    item = self._update(records, arrived)
                    small = isinstance(item, Marker) or item.records <= self.inline_records
                    with flight:  # only this thread raises in_flight: 0 stays 0 until the put below
                        inline = (quiet or small) and not in_flight[0] and not self.executor_lag
                        in_flight[0] += not inline
                    if inline:  # the other stages are idle: run them here, without the hand-offs
                        self.stats.inline += not isinstance(item, Marker)
                        submitted = self._execute(item)
                        output_held()
                        held.append(submitted)
                        if quiet:
                            output_held()
                    else:
                        output_held()
                        put(to_ex, item)
                if not stop.is_set():
                    output_held()
            except BaseException as exc:  # re-raised in the caller's thread
                errors.append(exc)
            gu_done()
            put(to_ex, _END)

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
                self._output(item, on_result)
                with flight:
                    in_flight[0] -= 1
        except BaseException:
            stop.set()
            raise
        finally:
            stop.set()
            gu_done()
            for t in threads:
                t.join()
        if errors:
            raise errors[0]
        return self.stats
