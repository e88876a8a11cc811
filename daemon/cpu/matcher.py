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

Under event time (a multi-version graph that keeps its entries' ts) a row also carries its
event-time state (_Times): the smallest and largest ts of its edges and the ts of each edge an
order constraint names. Each level reads the ts of the entries its backward checks found and
drops the rows that break the query's span or an order pair it now knows both edges of, so a
partial match that cannot become a match is not extended.
"""

from __future__ import annotations

import time
import numpy as np

from csmd.engine import SearchResult
from csmd.model.direction import HALF, PRESENT, label_test, passes
from csmd.model.graph import gather_ranges
from csmd.model.plan import Plan
from csmd.model.time_constraints import NO_TS

DEFAULT_BUDGET_BYTES = 256 << 20
_NO_MIN = np.iinfo(np.int64).max  # a row's smallest ts while none of its edges has one


class _Times:
    """The event-time state of partial matches (model/time_constraints.py): per row an int64
    vector [smallest ts, largest ts, the ts of each edge an order pair names] (_NO_MIN and NO_TS
    while no edge with a ts is matched; NO_TS for a named edge not matched yet or without one).
    An edge without a ts constrains nothing: min and max skip it, an order pair holds."""

    def __init__(self, plan: Plan, minmax: bool):
        """minmax: keep the smallest and largest ts even without a span (the matches' ts are asked)."""
        named = sorted({e for pairs in plan.before for pair in pairs for e in pair})
        col = {e: 2 + k for k, e in enumerate(named)}
        self.width = 2 + len(named)
        self.span = None if plan.span is None else np.uint64(plan.span)
        self.minmax = minmax or plan.span is not None
        self.before = [[(col[a], col[b]) for a, b in pairs] for pairs in plan.before]
        # per depth, the arcs whose ts a row keeps: (backward check, 0: the arc from the earlier
        # image to the new one, 1: the arc back, the state's column or -1: min and max only): the
        # arcs the pair's label holds (undirected: one).
        directed = plan.query.directed
        self.reads = []
        for back, arcs in zip(plan.backward, plan.arcs):
            reads = []
            for k, ((_, el), numbers) in enumerate(zip(back, arcs)):
                sides = [s for s in (0, 1) if (el >> (HALF * s)) & PRESENT] if directed else [0]
                reads += [(k, s, col.get(numbers[s], -1)) for s in sides if self.minmax or numbers[s] in col]
            self.reads.append(reads)

    def start(self, n: int) -> np.ndarray:
        et = np.full((n, self.width), NO_TS, np.int64)
        et[:, 0] = _NO_MIN
        return et

    def extend(self, i: int, et: np.ndarray, arc_ts) -> np.ndarray | None:
        """Write into et (rows extended to depth i) the ts of the arcs depth i matched, arc_ts(check,
        side) giving them per row; the rows that keep the constraints (None: all)."""
        for k, side, c in self.reads[i]:
            t = arc_ts(k, side)
            if self.minmax:
                np.minimum(et[:, 0], np.where(t == NO_TS, _NO_MIN, t), out=et[:, 0])
                np.maximum(et[:, 1], t, out=et[:, 1])  # NO_TS is below every ts
            if c >= 0:
                et[:, c] = t
        keep = None
        for a, b in self.before[i]:
            ok = (et[:, a] < et[:, b]) | (et[:, b] == NO_TS)  # (NO_TS is below every ts: a without one passes)
            keep = ok if keep is None else keep & ok
        if self.span is not None and self.reads[i]:
            lo, hi = et[:, 0], et[:, 1]
            # max - min as uint64 is exact where there is a ts (int64 would overflow for far-apart ts)
            ok = (hi < lo) | (hi.astype(np.uint64) - lo.astype(np.uint64) <= self.span)
            keep = ok if keep is None else keep & ok
        return keep

    @staticmethod
    def of_matches(et: np.ndarray) -> np.ndarray:
        """Matches.ts of finished rows: (smallest, largest) ts, NO_TS twice where none has one."""
        out = et[:, :2].copy()
        out[out[:, 1] == NO_TS, 0] = NO_TS
        return out


def _entries(mvg, a: np.ndarray, b: np.ndarray, ts: np.ndarray) -> np.ndarray:
    """Position of the entry for the pair (a, b) in a's version at ts, -1 where there is none
    (edge_label_between without the label: a timed search reads the entry's ts too)."""
    start, end = mvg.ranges(a, mvg.labels.a[b], ts)
    return mvg._find(start, end, b, ts)


class _Stop(Exception):
    """Unwinds the recursion when the limit or the deadline is reached."""


class _Search:
    def __init__(self, g, plan: Plan, limit, deadline, sink, budget_bytes, match_ts=False):
        self.g, self.plan = g, plan
        self.limit, self.deadline, self.sink = limit, deadline, sink
        # event time: only where the graph keeps ts and the query is constrained or its matches'
        # ts are asked (an untimed search does no work per row for it)
        timed = getattr(g, "timed", False) and (plan.constrained or match_ts)
        self.times = _Times(plan, match_ts) if timed else None
        self.match_ts = match_ts and timed
        self.arc_ts = (g.e_ts.a, g.e_tsin.a) if timed else None  # per entry: the arc to the neighbour, back
        self.count = 0
        self.per_ts = None  # with timestamped rows: matches per timestamp - ts_base
        self.ts_base = 0
        self.nbrs, self.nels, self.lifetimes = g.nbrs, g.nels, g.lifetimes
        # a changing graph may gain labelled edges at any time: always check there
        self.check_elabels = g.lifetimes is not None or bool(self.nels.any()) or bool(plan.query.elabels.any())
        # every depth may hold one chunk at a time: share the budget between depths
        per_depth = budget_bytes // max(plan.depth, 1)
        per_row = 8 * self.times.width if self.times is not None else 0
        self.cap = [max(1024, per_depth // (48 + 4 * (i + 1) + per_row)) for i in range(plan.depth)]
        self.qlabels = [int(plan.query.labels[u]) for u in plan.order]

    # -- driving ------------------------------------------------------------------------
    def run(self, frontier: np.ndarray, ts, seed_ts) -> None:
        if ts is not None:
            self.ts_base = int(ts.min()) if len(ts) else 0
            self.per_ts = np.zeros(int(ts.max()) - self.ts_base + 1 if len(ts) else 0, np.int64)
        et = None
        if self.times is not None:
            et = self.times.start(len(frontier))
            if frontier.shape[1] == 2:  # seeded with an edge: its arcs' ts, checked as depth 1's
                if seed_ts is None:
                    raise ValueError("a timed search seeded with edges needs their ts (seed_ts)")
                keep = self.times.extend(1, et, lambda k, side: seed_ts[:, side])
                if keep is not None:
                    frontier, et = frontier[keep], et[keep]
                    ts = None if ts is None else ts[keep]
            elif frontier.shape[1] > 2:
                raise ValueError("a timed search starts from one vertex or one edge")
        if frontier.shape[1] == self.plan.depth:
            self._emit(frontier, ts, et)
        else:
            self._descend(frontier, ts, et)

    def _descend(self, M: np.ndarray, ts, et) -> None:
        i = M.shape[1]
        start, size, piv = self._ranges(M, ts, i)
        last = i + 1 == self.plan.depth
        for rows, s, z in _chunks(start, size, self.cap[i]):
            if self.deadline is not None and time.monotonic() > self.deadline:
                raise _Stop
            parent, cand, at = self._expand(M, ts, i, rows, s, z, piv)
            cet = None
            if et is not None and len(cand):
                cet = et[parent]
                if at is not None:
                    keep = self.times.extend(i, cet, lambda k, side: self.arc_ts[side][at[k]])
                    if keep is not None:
                        parent, cand, cet = parent[keep], cand[keep], cet[keep]
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
                self._emit(child, cts, cet)
            else:
                self._descend(child, cts, cet)

    def _add(self, k: int, ts) -> None:
        if ts is not None:
            self.per_ts += np.bincount(ts - self.ts_base, minlength=len(self.per_ts))
        if self.limit is not None and self.count + k >= self.limit:
            self.count = self.limit
            raise _Stop
        self.count += k

    def _emit(self, rows: np.ndarray, ts, et) -> None:
        if self.limit is not None:
            rows = rows[: self.limit - self.count]
            ts = None if ts is None else ts[: len(rows)]
            et = None if et is None else et[: len(rows)]
        if self.sink is not None and len(rows):
            out = np.empty_like(rows)
            out[:, self.plan.order] = rows  # columns back in query-vertex order
            if self.match_ts:
                self.sink(out, ts, _Times.of_matches(et))
            else:
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
        at = None  # timed: per backward check, the entry each row's pair was found at
        if self.times is not None and self.times.reads[i]:
            at = np.empty((len(back), len(cand)), np.int64)
            at[piv[parent], np.arange(len(cand))] = offs[idx]
        if len(back) > 1:
            for k, (j, el) in enumerate(back):
                # the pivot edge holds by construction; test the others, shrinking as we go
                test = np.flatnonzero(piv[parent] != k)
                if not len(test):
                    continue
                tts = None if ts is None else ts[parent[test]]
                if at is None:
                    lab = self.g.edge_label_between(M[parent[test], j], cand[test], tts)
                else:
                    pos = _entries(self.g, M[parent[test], j], cand[test], tts)
                    lab = np.where(pos >= 0, self.nels[np.maximum(pos, 0)], -1)
                    at[k, test] = pos
                found = (lab >= 0) & passes(lab, label_test(el, self.plan.query.directed))
                if found.all():
                    continue
                keep = np.ones(len(cand), bool)
                keep[test[~found]] = False
                parent, cand = parent[keep], cand[keep]
                if at is not None:
                    at = at[:, keep]
        return parent, cand, at


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


def search(g, plan: Plan, seeds: np.ndarray | None = None, ts: np.ndarray | None = None, *, seed_ts=None,
           match_ts: bool = False, limit=None, time_limit=None, sink=None,
           budget_bytes: int = DEFAULT_BUDGET_BYTES) -> SearchResult:
    """Count (and, with `sink`, stream) the matches of `plan` in `g`.

    g: a Graph, or a MultiVersionGraph read at per-row timestamps `ts`.
    seeds: partial matches to start from (rows x k, columns in plan order);
    default: every candidate of plan.order[0]. ts: one timestamp per seed row;
    then per_ts counts the matches of each timestamp.
    sink(rows[, ts]) receives matches as int32 arrays, columns in query-vertex
    order, internal data ids. limit / time_limit stop early with complete=False.
    Under event time (g a timed MultiVersionGraph) the plan's time constraints are kept;
    seed_ts: with seeds of two columns (an updated edge), their arcs' ts, (rows, 2): the arc
    plan.order[0] -> plan.order[1], then the arc back; match_ts: sink(rows, ts, match_ts)
    receives each match's (smallest, largest) ts too (Matches.ts).
    """
    t0 = time.monotonic()
    deadline = None if time_limit is None else t0 + time_limit
    if seeds is None:
        seeds = np.flatnonzero(plan.cand[plan.order[0]]).astype(np.int32)[:, None]
    s = _Search(g, plan, limit, deadline, sink, budget_bytes, match_ts)
    complete = True
    try:
        if limit is not None and limit <= 0:
            raise _Stop
        s.run(seeds, ts, seed_ts)
    except _Stop:
        complete = False
    return SearchResult(s.count, complete, time.monotonic() - t0, s.per_ts, s.ts_base)
