"""The CPU engine's static matcher: numpy-vectorized, level by level, in bounded chunks.

A frontier is an int32 matrix of partial matches (one row each, column i = the
data vertex matched to plan.order[i]). Each level expands a frontier chunk by
one query vertex: the candidates of a row are the neighbors, with the right
vertex label, of its backward neighbor with the fewest such neighbors (a
label-grouped CSR range, so no label test per neighbor), filtered by the
candidate mask, injectivity, symmetry constraints and the other backward edges.

Chunks are cut so that no expansion holds more than a fixed number of
candidates, and the search recurses chunk by chunk (depth-first over chunks,
breadth-first inside one), so memory is bounded by depth x chunk size however
many matches there are. The last level is only counted unless matches are asked.
"""

from __future__ import annotations

import time
import numpy as np

from csmd.engine import SearchResult
from csmd.model.direction import label_test, passes
from csmd.model.graph import gather_ranges
from csmd.model.plan import Plan

DEFAULT_BUDGET_BYTES = 256 << 20


class _Stop(Exception):
    """Unwinds the recursion when the limit or the deadline is reached."""


class _Search:
    def __init__(self, g, plan: Plan, limit, deadline, sink, budget_bytes):
        self.g, self.plan = g, plan
        self.limit, self.deadline, self.sink = limit, deadline, sink
        self.count = 0
        self.per_ts = None  # with timestamped rows: matches per timestamp - ts_base
        self.ts_base = 0
        self.nbrs, self.nels, self.lifetimes = g.nbrs, g.nels, g.lifetimes
        # a changing graph may gain labelled edges at any time: always check there
        self.check_elabels = g.lifetimes is not None or bool(self.nels.any()) or bool(plan.query.elabels.any())
        # every depth may hold one chunk at a time: share the budget between depths
        per_depth = budget_bytes // max(plan.depth, 1)
        self.cap = [max(1024, per_depth // (48 + 4 * (i + 1))) for i in range(plan.depth)]
        self.qlabels = [int(plan.query.labels[u]) for u in plan.order]

    # -- driving ------------------------------------------------------------------------
    def run(self, frontier: np.ndarray, ts) -> None:
        if ts is not None:
            self.ts_base = int(ts.min()) if len(ts) else 0
            self.per_ts = np.zeros(int(ts.max()) - self.ts_base + 1 if len(ts) else 0, np.int64)
        if frontier.shape[1] == self.plan.depth:
            self._emit(frontier, ts)
        else:
            self._descend(frontier, ts)

    def _descend(self, M: np.ndarray, ts) -> None:
        i = M.shape[1]
        start, size, piv = self._ranges(M, ts, i)
        last = i + 1 == self.plan.depth
        for rows, s, z in _chunks(start, size, self.cap[i]):
            if self.deadline is not None and time.monotonic() > self.deadline:
                raise _Stop
            parent, cand = self._expand(M, ts, i, rows, s, z, piv)
            if not len(cand):
                continue
            cts = None if ts is None else ts[parent]
            if last and self.sink is None:
                self._add(len(cand), cts)
                continue
            child = np.empty((len(cand), i + 1), np.int32)
            child[:, :i] = M[parent]
            child[:, i] = cand
            if last:
                self._emit(child, cts)
            else:
                self._descend(child, cts)

    def _add(self, k: int, ts) -> None:
        if ts is not None:
            self.per_ts += np.bincount(ts - self.ts_base, minlength=len(self.per_ts))
        if self.limit is not None and self.count + k >= self.limit:
            self.count = self.limit
            raise _Stop
        self.count += k

    def _emit(self, rows: np.ndarray, ts) -> None:
        if self.limit is not None:
            rows = rows[: self.limit - self.count]
            ts = None if ts is None else ts[: len(rows)]
        if self.sink is not None and len(rows):
            out = np.empty_like(rows)
            out[:, self.plan.order] = rows  # columns back in query-vertex order
            self.sink(out) if ts is None else self.sink(out, ts)
        self._add(len(rows), ts)

    # -- one level ----------------------------------------------------------------------
    def _ranges(self, M: np.ndarray, ts, i: int):
        """Per row: the label-grouped neighbor range of the cheapest backward neighbor."""
        back = self.plan.backward[i]
        label = self.qlabels[i]
        starts = np.empty((len(back), len(M)), np.int64)
        sizes = np.empty((len(back), len(M)), np.int64)
        for k, (j, _) in enumerate(back):
            s, e = self.g.ranges(M[:, j], label, ts)
            starts[k], sizes[k] = s, e - s
        if len(back) == 1:
            return starts[0], sizes[0], np.zeros(len(M), np.int8)
        piv = np.argmin(sizes, axis=0).astype(np.int8)
        cols = np.arange(len(M))
        return starts[piv, cols], sizes[piv, cols], piv

    def _expand(self, M, ts, i, rows, start, size, piv):
        plan = self.plan
        back = plan.backward[i]
        parent = np.repeat(rows, size)
        offs = gather_ranges(start, size)
        total = len(offs)
        cand = self.nbrs[offs]
        mask = plan.cand[plan.order[i]] if plan.cand is not None else None
        keep = mask[cand] if mask is not None else np.ones(total, bool)
        if self.lifetimes is not None:
            t = ts[parent]
            keep &= (self.lifetimes[0][offs] < t) & (t <= self.lifetimes[1][offs])
        if self.check_elabels:
            want = label_test(np.array([el for _, el in back], np.int64), self.plan.query.directed)
            keep &= passes(self.nels[offs], want[piv[parent]])
        for j in plan.same_label[i]:
            keep &= M[parent, j] != cand
        for j in plan.less[i]:
            keep &= M[parent, j] < cand
        for j in plan.greater[i]:
            keep &= M[parent, j] > cand
        idx = np.flatnonzero(keep)
        parent, cand = parent[idx], cand[idx]
        if len(back) > 1:
            for k, (j, el) in enumerate(back):
                # the pivot edge holds by construction; test the others, shrinking as we go
                test = np.flatnonzero(piv[parent] != k)
                if not len(test):
                    continue
                tts = None if ts is None else ts[parent[test]]
                lab = self.g.edge_label_between(M[parent[test], j], cand[test], tts)
                found = (lab >= 0) & passes(lab, label_test(el, self.plan.query.directed))
                if found.all():
                    continue
                keep = np.ones(len(cand), bool)
                keep[test[~found]] = False
                parent, cand = parent[keep], cand[keep]
        return parent, cand


def _chunks(start: np.ndarray, size: np.ndarray, cap: int):
    """Split (row, range) work into chunks of about `cap` candidates (at most 2 * cap).

    A row whose range alone exceeds `cap` (a hub) is cut into several pieces.
    """
    rows = np.arange(len(size))
    big = np.flatnonzero(size > cap)
    if len(big):
        pieces = -(-size[big] // cap)
        prow = np.repeat(big, pieces)
        k = np.arange(len(prow)) - np.repeat(np.cumsum(pieces) - pieces, pieces)
        pstart = np.repeat(start[big], pieces) + k * cap
        psize = np.minimum(cap, np.repeat(start[big] + size[big], pieces) - pstart)
        small = size <= cap
        rows = np.concatenate([rows[small], prow])
        start = np.concatenate([start[small], pstart])
        size = np.concatenate([size[small], psize])
    nz = size > 0
    rows, start, size = rows[nz], start[nz], size[nz]
    if not len(size):
        return
    before = np.cumsum(size) - size
    bounds = np.searchsorted(before, np.arange(cap, int(before[-1]) + 1, cap), "left")
    lo = 0
    for hi in list(bounds) + [len(size)]:
        if hi > lo:
            yield rows[lo:hi], start[lo:hi], size[lo:hi]
            lo = hi


def search(g, plan: Plan, seeds: np.ndarray | None = None, ts: np.ndarray | None = None, *, limit=None,
           time_limit=None, sink=None, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> SearchResult:
    """Count (and, with `sink`, stream) the matches of `plan` in `g`.

    g: a Graph, or a MultiVersionGraph read at per-row timestamps `ts`.
    seeds: partial matches to start from (rows x k, columns in plan order);
    default: every candidate of plan.order[0]. ts: one timestamp per seed row;
    then per_ts counts the matches of each timestamp.
    sink(rows[, ts]) receives matches as int32 arrays, columns in query-vertex
    order, internal data ids. limit / time_limit stop early with complete=False.
    """
    t0 = time.monotonic()
    deadline = None if time_limit is None else t0 + time_limit
    if seeds is None:
        seeds = np.flatnonzero(plan.cand[plan.order[0]]).astype(np.int32)[:, None]
    s = _Search(g, plan, limit, deadline, sink, budget_bytes)
    complete = True
    try:
        if limit is not None and limit <= 0:
            raise _Stop
        s.run(seeds, ts)
    except _Stop:
        complete = False
    return SearchResult(s.count, complete, time.monotonic() - t0, s.per_ts, s.ts_base)
