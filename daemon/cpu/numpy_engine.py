"""The numpy CPU engine: static matcher and the continuous engine over the numpy MVG (the fallback
where numba cannot be imported; the compiled engine in compiled.py shares its storage)."""

from __future__ import annotations

import threading
import time
import weakref

import numpy as np

from csmd.cpu.executor import PreparedQuery, match_batch
from csmd.cpu.matcher import DEFAULT_BUDGET_BYTES, search
from csmd.cpu.mvg import INF, MultiVersionGraph
from csmd.engine import ContinuousEngine, ContinuousQuery, Done, EngineStats, SearchResult, StaticMatcher, UpdateBatch
from csmd.model.graph import Graph
from csmd.model.plan import Plan, plan_query
from csmd.model.time_constraints import require_ts


_timed_graphs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Graph -> its timed MVG (`csmd match`
                                                                       # runs many queries on one graph)


class CpuMatcher(StaticMatcher):
    name = "numpy"

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES):
        self.budget_bytes = budget_bytes

    def match(self, g, q, *, distinct=False, limit=None, time_limit=None, sink=None):
        t0 = time.monotonic()
        plan = plan_query(g, q, distinct=distinct)
        remaining = None if time_limit is None else max(0.0, time_limit - (time.monotonic() - t0))
        if plan.constrained:
            return self._timed(g, plan, limit, remaining, sink)
        return search(g, plan, limit=limit, time_limit=remaining, sink=sink, budget_bytes=self.budget_bytes)

    def _timed(self, g: Graph, plan: Plan, limit, time_limit, sink) -> SearchResult:
        """A query with time constraints on a static graph: the search of a multi-version graph
        that keeps g's edge ts, read after every edge (the executor's search, from every root)."""
        require_ts(g)
        if g not in _timed_graphs:
            _timed_graphs[g] = MultiVersionGraph(g, timed=True)
        roots = np.flatnonzero(plan.cand[plan.order[0]]).astype(np.int32)[:, None]
        res = search(_timed_graphs[g], plan, roots, np.full(len(roots), INF - 1, np.int64),
                     limit=limit, time_limit=time_limit, sink=None if sink is None else lambda rows, _: sink(rows),
                     budget_bytes=self.budget_bytes)
        return SearchResult(res.count, res.complete, res.seconds)


class CpuEngine(ContinuousEngine):
    """Appends never disturb a read at an earlier timestamp, so apply runs beside the searches
    of earlier batches (several may be in flight); a compaction moves entries, so it excludes
    both: `_writing` covers the updater stage (apply and the latest-state reads) and the start
    of a search, and a compaction, under it, waits until no search is in flight."""

    name = "numpy"
    graph_type = MultiVersionGraph  # the storage: the compiled engine's compiles apply and compaction

    def __init__(self, g0: Graph, timed: bool = False):
        """timed: under event time (the graph keeps each edge's ts; model/time_constraints.py)."""
        self.mvg = self.graph_type(g0, timed)
        self._writing = threading.Lock()
        self._searches = 0  # searches in flight
        self._idle = threading.Condition()  # notified when that count drops to 0
        self.released = 0

    def apply(self, batch: UpdateBatch):
        with self._writing:
            if len(batch.new_labels):
                self.mvg.add_vertices(batch.new_labels)
            return self.mvg.apply(*batch.storage_ops(), batch.storage_ts())

    def release(self, tokens) -> None:
        with self._writing:
            if self.mvg.free(tokens):
                with self._idle:  # no search starts meanwhile: that takes _writing
                    self._idle.wait_for(lambda: not self._searches)
                self.mvg.compact()
        self.released += len(tokens)

    def _search_started(self) -> None:
        """Under _writing: a search of the graph as it is now is in flight until _search_ended."""
        with self._idle:
            self._searches += 1

    def _search_ended(self) -> None:
        with self._idle:
            self._searches -= 1
            if not self._searches:
                self._idle.notify_all()

    def live_edge_labels(self, a, b):
        with self._writing:
            return self.mvg.live_edge_label(np.asarray(a, np.int64), np.asarray(b, np.int64))

    def live_neighbors(self, v: int):
        with self._writing:
            return self.mvg.live_neighbors(v)

    def live_edges(self):
        with self._writing:
            return self.mvg.live_edges()

    def prepare(self, query: ContinuousQuery) -> PreparedQuery:
        return PreparedQuery(query)

    def submit(self, batch: UpdateBatch, queries: list[PreparedQuery], select: np.ndarray | None = None) -> Done:
        out = {}
        with self._writing:
            self._search_started()
        none = np.zeros(0, np.int64)
        try:
            for i, pq in enumerate(queries):
                ops = batch if select is None else batch.take(select[i], none)
                m = match_batch(self.mvg, ops, pq) if len(ops.edge_seq) else None
                if m is not None:
                    out[pq.name] = m
        finally:
            self._search_ended()
        return Done(out)

    def stats(self) -> EngineStats:
        return EngineStats(self.mvg.live_versions, 0)
