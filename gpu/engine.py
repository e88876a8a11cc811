"""The GPU engine: one-shot static queries (GpuMatcher) and the continuous engine over the
device MVG (GpuEngine).

Static queries: filter, plan and enumerate a batch of queries with a few launches each,
whatever the batch size (hundreds of small queries cost about what one does).

Planning stays on the device except the matching orders and tables, which the host
computes for the whole batch at once from the candidates' adjacency volumes
(plan.greedy_orders).
"""

from __future__ import annotations

import contextlib
import threading
import time

import cupy as cp
import numpy as np

from csmd.engine import (Anchor, ContinuousEngine, ContinuousQuery, Done, EngineStats, SearchResult, StaticMatcher,
                         UpdateBatch)
from csmd.model.graph import Graph
from csmd.model.plan import anchor_order, greedy_orders, symmetry_constraints

from .device_graph import DeviceGraph, device_graph
from .device_mvg import DeviceMVG
from .executor import Executor, PreparedQuery
from .filtering import QueryBatch, filter_candidates, root_pool
from .launch import on_each_device
from .matcher import Tuning, WarpSearch, query_tables


def match_many(g: Graph | DeviceGraph, queries: list[Graph], *, distinct: bool = False, time_limit=None,
               tuning: Tuning | None = None, devices: list[int] | None = None) -> list[SearchResult]:
    """Count the matches of every query, all in one search. Each query has `time_limit`
    seconds from the start of the batch; one still running then is reported incomplete.
    seconds = the batch's time (the same for every query). devices: the CUDA devices to
    split the search over (on_devices); default the current one."""
    return on_devices(devices, g, None, None, time_limit, lambda share, _, seconds: _search(
        g, queries, distinct=distinct, time_limit=seconds, tuning=tuning, share=share))


def match(g: Graph | DeviceGraph, q: Graph, *, distinct: bool = False, limit=None, time_limit=None, sink=None,
          tuning: Tuning | None = None, balance: dict | None = None, devices: list[int] | None = None
          ) -> SearchResult:
    """Plan and enumerate q in g; `time_limit` covers both, and so does seconds. sink(rows)
    receives int32 arrays, one row per match, columns in query-vertex order. balance, if
    given, receives WarpSearch.balance() of the search (of the first device's share)."""
    return on_devices(devices, g, limit, sink, time_limit, lambda share, rows, seconds: _search(
        g, [q], distinct=distinct, limit=limit, time_limit=seconds, sink=rows, tuning=tuning,
        balance=balance if share[0] == 0 else None, share=share))[0]


SPECULATE_S = 0.02  # a count the first device finishes alone within this is not split (0: none is tried)


def on_devices(devices: list[int] | None, g, limit, sink, time_limit, search, speculate: bool = True
               ) -> list[SearchResult]:
    """search(share, sink, time_limit) -> [SearchResult per query] on the current device, or split
    over several: device i of N runs search((i, N), ...) on a thread of its own (the first on the
    caller's), filtering and planning as one device does and searching its share of every
    query's partial matches (_search). A query's matches are the sum of the shares', it is
    complete where every share is; the shares' rows go to sink one piece at a time. seconds: the
    whole split's.

    A search with a limit runs on the first device alone: a share cannot be stopped in its
    launch when the others reach the limit, so each would search on to the limit or its end,
    where one device stops at the limit. A count (no sink) first runs on the first device alone
    for SPECULATE_S seconds where `speculate`: most queries end within it, and a split costs them
    more than it gains (a few ms a device: its own filtering and planning, the hand-offs); a
    larger one is then split, SPECULATE_S later than it could have been (a time limit under
    twice that: no split)."""
    if devices is not None and (len(devices) == 1 or limit is not None):
        devices = devices[:1]
    if devices is None or len(devices) == 1:
        with cp.cuda.Device(devices[0]) if devices else contextlib.nullcontext():
            return search((0, 1), sink, time_limit)
    if isinstance(g, DeviceGraph):  # its arrays live on one device
        raise TypeError("a search on several devices takes a host Graph")
    t0 = time.monotonic()
    if sink is None and speculate and SPECULATE_S > 0:
        alone = time_limit is not None and time_limit < 2 * SPECULATE_S
        with cp.cuda.Device(devices[0]):
            first = search((0, 1), None, time_limit if alone else SPECULATE_S)
        if alone or all(r.complete for r in first):
            return first
        time_limit = None if time_limit is None else time_limit - (time.monotonic() - t0)
    if g.num_labels > 1:
        g.grouped  # noqa: B018 -- the label-grouped adjacency every device uploads, computed once here
    lock, failed = threading.Lock(), []

    def rows_to_sink(rows):
        with lock:
            if failed:  # the sink failed on another share's rows: this share stops at its next drain
                raise RuntimeError("stopped: the sink failed on another device's rows")
            try:
                sink(rows)
            except BaseException as exc:
                failed.append(exc)
                raise

    try:
        rows = None if sink is None else rows_to_sink
        parts = on_each_device(devices, lambda i: search((i, len(devices)), rows, time_limit))
    finally:
        if failed:
            raise failed[0]  # the sink's own error, not another share's stop
    seconds = time.monotonic() - t0
    return [SearchResult(sum(r.count for r in per), all(r.complete for r in per), seconds) for per in zip(*parts)]


def _search(g, queries, *, distinct, time_limit, tuning, limit=None, sink=None, balance=None, share=(0, 1)
            ) -> list[SearchResult]:
    """One device's search of the queries; share (i, n): its part of a search split over n
    devices (on_devices): every device filters, plans and takes every root alike, and keeps its
    share of each partial match's candidates for the last depth it enumerates (matcher.cu
    deal_at); the one-vertex queries where i is 0."""
    t0 = time.monotonic()
    deadline = None if time_limit is None else t0 + time_limit
    dg = g if isinstance(g, DeviceGraph) else device_graph(g)
    batch = QueryBatch.pack(queries)
    counts = np.zeros(len(queries), np.int64)
    complete = np.ones(len(queries), bool)
    cbits, sizes, volume = filter_candidates(dg, batch, converge=share[1] > 1)  # every share the same
    valid = np.arange(sizes.shape[1]) < batch.nq[:, None]
    # no match: a query vertex without candidates, or query edge labels the graph lacks
    live = (sizes > 0).all(1, where=valid) & np.array([dg.has_edge_labels or not q.elabels.any() for q in queries])
    single = live & (batch.nq == 1)
    if share[0] == 0:  # a one-vertex query's matches are its candidates: the first share's
        counts[single] = sizes[single, 0]
        if single.any() and len(queries) == 1:
            counts[0], complete[0] = _single_vertex(cbits[0], int(sizes[0, 0]), limit, sink)
    idx = np.flatnonzero(live & ~single)
    if len(idx):
        sub = batch.take(idx)
        cb = cbits if len(idx) == len(queries) else cbits[cp.asarray(idx)]
        del cbits
        # the search scans the neighbour ranges of partial matches: weigh vertices by the
        # adjacency volume of their candidates (github Q_16: 1.8 s instead of 3.9 by count)
        m = int(sub.nq.max())  # the host's steps: one per vertex of the largest query
        orders = np.full((len(idx), sub.adj.shape[1]), -1, np.int64)
        orders[:, :m] = greedy_orders(sub.adj[:, :m, :m], volume[idx, :m], sub.nq)
        sym = [symmetry_constraints(queries[i])[0] for i in idx] if distinct else None
        tables, el = query_tables(sub, orders, sym)
        pool, chunk_q = root_pool(dg, cb, sub, orders, sizes[idx, orders[:, 0]])
        if len(pool):
            search = WarpSearch(dg, tables, el, cb, pool, chunk_q, tuning or Tuning(), share)
            if not search.widen_pool(deadline):
                complete[idx] = False
            elif len(search.pool):  # a widening may find no prefix at all
                counts[idx], complete[idx] = search.run(limit=limit, deadline=deadline, sink=sink)
                if balance is not None:
                    balance.update(search.balance())
    if limit is not None:
        complete &= counts < limit
    seconds = time.monotonic() - t0
    return [SearchResult(int(c), bool(ok), seconds) for c, ok in zip(counts, complete)]


def _single_vertex(cbits: cp.ndarray, total: int, limit, sink) -> tuple[int, bool]:
    """A one-vertex query: its matches are its candidates."""
    count = total if limit is None else min(limit, total)
    if sink is not None and count:
        sink(cp.flatnonzero(cbits & 1).astype(cp.int32)[:count].get().reshape(-1, 1))
    return count, limit is None or limit > total


class GpuMatcher(StaticMatcher):
    """The static matcher of the GPU engine (one search for a batch of queries), on the current
    device or split over `devices` (on_devices)."""

    name = "gpu"

    def __init__(self, devices: list[int] | None = None):
        self.devices = devices

    def match(self, g, q, *, distinct=False, limit=None, time_limit=None, sink=None):
        if q.time is not None and q.time.constrained:
            return on_devices(self.devices, g, limit, sink, None, lambda share, rows, _: [match_timed(
                g, q, distinct=distinct, limit=limit, sink=rows, share=share)], speculate=False)[0]
        return match(g, q, distinct=distinct, limit=limit, time_limit=time_limit, sink=sink, devices=self.devices)

    def match_many(self, g, queries, *, distinct=False, time_limit=None):
        if any(q.time is not None and q.time.constrained for q in queries):
            return [self.match(g, q, distinct=distinct, time_limit=time_limit) for q in queries]
        return match_many(g, queries, distinct=distinct, time_limit=time_limit, devices=self.devices)


def match_timed(g: Graph, q: Graph, *, distinct: bool = False, limit=None, sink=None, share=(0, 1)
                ) -> SearchResult:
    """A static match of a query with time constraints (the static search's graph keeps no ts):
    the continuous search of a timed device graph of g, read after every edge, seeded by every
    data pair that fits one anchor (query edge 0, both orientations): each match maps that
    query edge onto one pair one way, so it is found once. limit truncates what is counted.
    share (i, n): its part i of a search split over n devices (Executor.seeded)."""
    from csmd.model.time_constraints import require_ts

    require_ts(g)
    t0 = time.monotonic()
    mvg = DeviceMVG.from_graph(g, timed=True)
    ex = Executor(cp.cuda.Stream(non_blocking=True))
    sizes = np.bincount(g.labels, minlength=int(q.labels.max()) + 1)[q.labels]
    qs, qd, qe = q.edge_list()
    x, y, el = int(qs[0]), int(qd[0]), int(qe[0])
    sym = symmetry_constraints(q)[0] if distinct else []
    anchor = Anchor(x, y, el, anchor_order(q, sizes, x, y))
    pq = ex.prepare(ContinuousQuery("query", q, sink is None, [anchor], sym), timed=True)
    rows, count = ex.seeded(mvg, pq, g, emit=sink is not None, share=share)
    if limit is not None:
        count = min(count, limit)
        rows = None if rows is None else rows[:limit]
    if sink is not None and len(rows):
        sink(rows)
    return SearchResult(count, limit is None or count < limit, time.monotonic() - t0)


RELEASE_VERSIONS = 256  # versions the GC freed, returned to the device pool together


class GpuEngine(ContinuousEngine):
    """The continuous engine on the device: the MVG (gpu/device_mvg.py) with its updater on
    one stream, the executor (gpu/executor.py) on another.

    Batch k+1 is applied while batch k is matched (docs/design.md section 2): the executor's stream
    waits only for the event recorded after its own batch's apply, and the version rules
    keep a read at batch k's timestamps blind to later batches. `_writing` orders what runs
    on the updater's stream (apply, release, latest-state reads); a pool growth waits for
    launches in flight through the MVG's `swap` lock.
    """

    name = "gpu"

    def __init__(self, g0: Graph | DeviceGraph, timed: bool = False):
        """g0 on the host, or already on the device (a graph built there: R-MAT). timed: under event
        time (the device graph keeps every edge's ts, the search the queries' time constraints)."""
        self.timed = timed
        on_device = isinstance(g0, DeviceGraph)
        if on_device and timed:
            raise ValueError("a graph built on the device has no event times")
        self.mvg = DeviceMVG.from_device_graph(g0) if on_device else DeviceMVG.from_graph(g0, timed)
        self.executor = Executor(cp.cuda.Stream(non_blocking=True))
        self._writing = threading.Lock()
        # host copy of the labels: seeds are built on the host
        self._labels = g0.labels.get() if on_device else np.array(g0.labels, np.int32)
        self._n = g0.n
        self._applied: dict[int, cp.cuda.Event] = {}  # first_seq of an applied batch -> its event
        # events the executor has waited for, recorded again by later batches (no creation per batch)
        self._spare: list[cp.cuda.Event] = []
        self._freed: list = []  # released tokens not yet returned to the pool
        self._waiting = 0  # the versions they hold, at most
        self._events = threading.Lock()

    def apply(self, batch: UpdateBatch):
        with self._writing:
            if len(batch.new_labels):
                first = self.mvg.add_vertices(batch.new_labels)
                if first != batch.first_vertex:  # the sequencer and the device disagree on vertex ids
                    raise RuntimeError(f"device MVG gave vertex id {first}, the sequencer {batch.first_vertex}")
                self._add_labels(batch.new_labels)
            token = self.mvg.apply(*batch.storage_ops(), batch.storage_ts())
            with self._events:
                event = self._spare.pop() if self._spare else cp.cuda.Event(disable_timing=True)
                event.record(self.mvg.stream)
                if len(self._applied) > 256:  # batches nobody submitted (no query registered)
                    self._applied.pop(next(iter(self._applied)))
                self._applied[batch.first_seq] = event
            # a pending token's replaced_at is not known yet: the batch's last timestamp releases it
            # once the batch has finished (batches finish whole), never before its own would
            return [(token, batch.end_seq - 1)] if token.pending else [(token, token.replaced_at)] if token.count else []

    def _add_labels(self, labels) -> None:
        """Append to the host labels; a reader keeps a valid prefix (the array is swapped, not resized)."""
        end = self._n + len(labels)
        if end > len(self._labels):
            grown = np.zeros(max(end, 2 * len(self._labels)), np.int32)
            grown[: self._n] = self._labels[: self._n]
            grown[self._n: end] = labels
            self._labels = grown
        else:
            self._labels[self._n: end] = labels
        self._n = end

    def release(self, tokens) -> None:
        """Return the tokens' versions to the pool once RELEASE_VERSIONS of them are waiting: a
        return costs a launch and a sort of the free list, as much for a small batch's few
        versions as for thousands."""
        with self._writing:
            self._freed += tokens
            # a pending token counts the most it may hold: its count would wait for its batch
            self._waiting += sum(t.at_most for t in tokens)
            if self._waiting >= RELEASE_VERSIONS:
                self._return_freed()

    def _return_freed(self) -> None:
        self.mvg.release(self._freed)
        self._freed, self._waiting = [], 0

    def live_edge_labels(self, a, b):
        with self._writing:
            return self.mvg.live_edge_labels(np.asarray(a, np.int64), np.asarray(b, np.int64)).astype(np.int64)

    def live_neighbors(self, v: int):
        with self._writing:
            return self.mvg.live_neighbors(v)

    def live_edges(self):
        with self._writing:
            return self.mvg.live_edges()

    def prepare(self, query: ContinuousQuery) -> PreparedQuery:
        return self.executor.prepare(query, self.timed)

    def warm(self, queries: list[PreparedQuery]) -> None:
        self.executor.groups(queries)

    def submit(self, batch: UpdateBatch, queries: list[PreparedQuery], select: np.ndarray | None = None) -> Done:
        self.await_apply(batch)
        return Done(self.executor.run(self.mvg, batch, queries, self._labels, select))

    def await_apply(self, batch: UpdateBatch) -> None:
        """Have the executor's stream wait for the batch's apply (and any earlier one's)."""
        with self._events:  # this batch's event, and those of earlier batches that were never submitted
            done = [s for s in self._applied if s <= batch.first_seq]
            applied = [self._applied.pop(s) for s in done]
        # an event dropped above: wait for everything applied so far (safe, overlaps less)
        self.executor.stream.wait_event(applied[-1] if applied else self.mvg.stream.record())
        with self._events:  # a wait holds the event's state at the call: it may be recorded again
            self._spare += applied

    @property
    def labels(self) -> np.ndarray:
        """The vertex labels on the host (a valid prefix: vertices added later may follow)."""
        return self._labels

    def stats(self) -> EngineStats:
        with self._writing:
            self._return_freed()
            return EngineStats(self.mvg.live_versions, self.mvg.memory_bytes)
