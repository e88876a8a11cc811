"""The compiled CPU engine: the numba depth-first search (dfs.py) over the numpy engine's storage.

Storage is the numpy engine's multi-version graph, with its batch apply, its compaction
(updater.py) and the sequencer's edge look-ups compiled. Every registered query is
searched in one kernel call per batch.
"""

from __future__ import annotations

import threading
import time
import weakref

import numpy as np

from csmd.cpu.arena import graph_view
from csmd.cpu.dfs import DONE, LIMIT, match_units, nonzero_rows, plan_units, static_step
from csmd.cpu.plans import BACKWARD, Memo, branch_order, joined, new_state, plan_set
from csmd.pipeline.query_rows import by_query
from csmd.cpu.numpy_engine import CpuEngine
from csmd.cpu.matcher import DEFAULT_BUDGET_BYTES
from csmd.cpu.mvg import MultiVersionGraph
from csmd.cpu.updater import CompiledGraph
from csmd.cpu.workers import chunks, run_chunks, start_tasks, thread_count
from csmd.engine import ContinuousQuery, Done, Matches, Pending, SearchResult, StaticMatcher, UpdateBatch
from csmd.model.plan import Plan, make_plan, plan_query
from csmd.model.time_constraints import require_ts

STEP_CANDIDATES = 1 << 20  # candidates a static search looks at between two time-limit checks (a few ms)
SPLIT_SECONDS = 0.0005  # a batch is split over threads when its search should take longer (the last
                        # search of its queries' seconds per (op, plan) unit, times its units): else
                        # handing chunks to the pool costs more than it saves (the floor of a light query)
STATIC_MEMO_BYTES = 64 << 20  # a static search memoises segment counts when that fits in this
GRAINS_PER_THREAD = 256  # a search's threads take its (op, plan) units in about this many pieces each:
                         # a thread that took a deep unit leaves the rest to the others
_ALL = np.zeros((0, 0), np.bool_)  # plan_units' select with no rows: every (query, op)
_NO_OPS_TS = np.zeros((0, 2), np.int64)  # match_units' e_ts without event time
_arenas: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Graph -> its arena (`csmd match` runs many queries on one)


def _view(g):
    if g not in _arenas:
        _arenas[g] = graph_view(MultiVersionGraph(g, timed=g.edge_ts is not None))
    return _arenas[g]


def search(g, plan: Plan, *, limit=None, time_limit=None, sink=None,
           budget_bytes: int = DEFAULT_BUDGET_BYTES, threads: int = 1) -> SearchResult:
    """Count (and, with `sink`, stream) the matches of `plan` in the static graph `g`, depth first.

    sink(rows) receives int32 matches in query-vertex order, at most budget_bytes of them
    at a time (the search waits while the sink works). limit / time_limit stop early with
    complete=False; the deadline is checked every STEP_CANDIDATES candidates. A count with
    neither sink nor limit splits the root candidates over `threads` threads (the sum is the
    same whatever the split); the others keep one thread, so matches leave in one order and
    a limit stops at the same matches.
    """
    t0 = time.monotonic()
    deadline = None if time_limit is None else t0 + time_limit
    if plan.constrained:
        require_ts(g)
    ps = plan_set([plan], [0])
    cand = np.stack([plan.cand[u] for u in plan.order])
    roots = np.flatnonzero(plan.cand[plan.order[0]]).astype(np.int32)
    view = _view(g)
    split = sink is None and limit is None

    def part(lo, hi):
        return _search_roots(view, ps, cand, roots[lo:hi], plan.depth, deadline, limit, sink, budget_bytes)

    parts = run_chunks(part, chunks(len(roots), threads if split else 1), threads)
    return SearchResult(sum(c for c, _ in parts), all(ok for _, ok in parts), time.monotonic() - t0)


def _search_roots(view, ps, cand, roots, depth, deadline, limit, sink, budget_bytes) -> tuple[int, bool]:
    """search() from these roots: (matches, complete)."""
    st = new_state()
    chunk = max(1, min(1 << 16, budget_bytes // (4 * depth))) if sink is not None else 0
    out = np.zeros((chunk, depth), np.int32)
    cells = depth * len(view.labels) if 16 * depth * len(view.labels) <= STATIC_MEMO_BYTES else 0
    memo = Memo(np.zeros(cells, np.int64).reshape(-1, len(view.labels)), np.zeros(cells, np.int64).reshape(
        -1, len(view.labels)))
    count = 0
    while limit is None or count < limit:
        if deadline is not None and time.monotonic() > deadline:
            break
        why, rows, found = static_step(view, ps, cand, memo, roots, st, out, _NO_OPS_TS, sink is not None,
                                       STEP_CANDIDATES,
                                       -1 if limit is None else limit - count)
        count += found
        if rows:  # the chunk leaves before the search goes on (FULL resumes there)
            sink(out[:rows].copy())
        if why in (DONE, LIMIT):
            return count, why == DONE
    return count, False


class CompiledMatcher(StaticMatcher):
    name = "cpu"

    def __init__(self, threads: int | None = None):
        self.threads = thread_count() if threads is None else threads

    def match(self, g, q, *, distinct=False, limit=None, time_limit=None, sink=None):
        t0 = time.monotonic()
        plan = plan_query(g, q, distinct=distinct)
        remaining = None if time_limit is None else max(0.0, time_limit - (time.monotonic() - t0))
        return search(g, plan, limit=limit, time_limit=remaining, sink=sink, threads=self.threads)


class CompiledQuery:
    """A registered query as the kernel takes it: one plan per anchor edge, in the anchor's
    order (the other engines' order); a count-only query's with its independent parts made
    contiguous (branch_order), whose counts the search then multiplies."""

    def __init__(self, query: ContinuousQuery):
        self.name, self.q, self.count_only = query.name, query.q, query.count_only
        self.plans = [make_plan(query.q, None, branch_order(query.q, a.order, 2) if query.count_only else a.order,
                                query.sym) for a in query.anchors]
        self.ps = plan_set(self.plans, [0] * len(self.plans))  # flattened at registration, not in a batch


class CompiledEngine(CpuEngine):
    """The numpy engine's multi-version graph, updated (updater.py) and matched by compiled code.

    The kernel runs without the GIL, so the updater may apply later batches meanwhile:
    it reads a copy of the newest-version table (the one array apply changes in place)
    taken between two applies, and counts as a search in flight so no compaction moves the
    arena. A search runs as one task per thread of the pool, each taking units (an op with one
    plan of a query: dfs.plan_units) from a shared counter until none is left: one hand-off a
    thread, whatever the batch (each costs interpreter-lock round trips, which a daemon's busy
    stage threads make slow), and no thread idles while another still has a deep unit queued
    behind it; a deep (op, query) pair is spread over its plans (on the yeast stream the
    heaviest pair took 0.26 s alone, its heaviest plan 0.04 s). It is submitted without
    waiting for it: the executor stage submits the next batch meanwhile, whose tasks take the
    threads this one's leave as its units run out (the output stage waits for each in stream
    order).
    """

    name = "cpu"
    graph_type = CompiledGraph

    def __init__(self, g0, threads: int | None = None, timed: bool = False):
        super().__init__(g0, timed)
        self.threads = thread_count() if threads is None else threads
        # query lists submitted (their ids) -> _QuerySet: a cluster instance submits one per set of
        # shards its queries select, so several alternate from batch to batch
        self._sets: dict[tuple, _QuerySet] = {}
        self._memos = threading.local()  # per thread: its Memo and the memo's last search id
        self.partial_matches = 0  # made by enumeration in every search so far (what time constraints cut)
        self._made = threading.Lock()

    def prepare(self, query: ContinuousQuery) -> CompiledQuery:
        return CompiledQuery(query)

    def warm(self, queries: list[CompiledQuery]) -> None:
        # the first search is split (its seconds per unit are unknown): the pool's threads start here
        self._query_set(queries)
        start_tasks([lambda: None] * self.threads, self.threads)()

    def _query_set(self, queries: list[CompiledQuery]) -> _QuerySet:
        key = tuple(id(q) for q in queries)
        found = self._sets.get(key)
        if found is None:  # a set holds its queries, so an id is not reused while it is kept
            if len(self._sets) >= 32:
                self._sets.clear()
            found = self._sets[key] = _QuerySet(queries)
        return found

    def _match(self, view, qs: _QuerySet, ops, units, taken, grain, counts):
        """match_units with this thread's memo: its units' counts into counts, its rows returned."""
        mine, depth = self._memos, qs.depth
        memo = getattr(mine, "memo", None)
        if memo is None or memo.stamp.shape[0] < depth or memo.stamp.shape[1] < len(view.labels):
            shape = (max(depth, 0 if memo is None else memo.stamp.shape[0]), len(view.labels))
            mine.memo, mine.sid = Memo(np.zeros(shape, np.int64), np.zeros(shape, np.int64)), 0
        rows, row_q, row_op, row_ts, mine.sid, made = match_units(view, qs.ps, *units, *ops, counts.reshape(-1), taken,
                                                                  grain, qs.materialize, qs.width, mine.memo, mine.sid)
        with self._made:
            self.partial_matches += made
        return rows, row_q, row_op, row_ts

    def submit(self, batch: UpdateBatch, queries: list[CompiledQuery], select: np.ndarray | None = None) -> Pending:
        qs = self._query_set(queries)
        # the batch's vertices are in the label table: the batch was applied before; contiguous
        # arrays: one compiled variant whichever way the batch was sequenced (CompiledGraph.apply)
        edge_a, edge_b, edge_el = (np.ascontiguousarray(x) for x in (batch.edge_a, batch.edge_b, batch.edge_label))
        searched, *units = plan_units(self.mvg.labels.a, edge_a, edge_b, edge_el, qs.keys, qs.by_key, qs.plan_test,
                                      qs.ps.query, _ALL if select is None else np.ascontiguousarray(select),
                                      self.mvg.directed)
        if not len(searched):
            return Done({})
        seq = batch.edge_seq[searched]
        ops = (seq, edge_a[searched], edge_b[searched],
               # (an untimed engine in a timed pipeline keeps no ts: its rows have none)
               _NO_OPS_TS if batch.edge_ts is None or not self.mvg.timed else
               np.ascontiguousarray(batch.edge_ts[searched]))
        with self._writing:
            self._search_started()
            view = graph_view(self.mvg, self.mvg.cur.view().copy())
        threads = self.threads if qs.per_unit * len(units[0]) > SPLIT_SECONDS else 1
        counts = np.zeros((len(queries), len(searched)), np.int64)
        taken = np.zeros(1, np.int64)  # the units handed out so far
        grain = max(1, len(units[0]) // (threads * GRAINS_PER_THREAD))

        def work():
            t0 = time.perf_counter()
            return self._match(view, qs, ops, units, taken, grain, counts), time.perf_counter() - t0

        # one task per thread, each taking units until none is left; in flight until the last has
        # ended: a compaction waits for that, not for the output stage to collect it (the output
        # stage may be the one that compacts)
        wait = start_tasks([work] * threads, threads, self._search_ended)
        return _Search(self, wait, qs, seq, counts, len(units[0]))

    def _matches(self, counts, found, qs: _QuerySet, seq: np.ndarray) -> dict[str, Matches]:
        """The matches of a search by query: counts per (query, op), and each thread's (rows, query, op, ts)."""
        queries, out = qs.queries, {}
        counted = [i for i, cq in enumerate(queries) if cq.count_only]
        if counted:  # one pass over the counts of all of them: a batch has a hundred queries, most with a few hits
            which, op, hits = nonzero_rows(counts, np.array(counted, np.int64))  # by query, then op
            cuts = np.searchsorted(which, np.arange(len(counted) + 1)).tolist()
            for k, i in enumerate(counted):
                if cuts[k] < cuts[k + 1]:
                    out[queries[i].name] = Matches(seq[op[cuts[k]:cuts[k + 1]]], counts=hits[cuts[k]:cuts[k + 1]])
        # the materialised queries' rows, query after query in one buffer (each thread's in turn)
        out.update(by_query([f + (seq,) for f in found], qs.names, qs.widths))
        return out


class _Search(Pending):
    """A batch's search on the thread pool: its threads' matches put together when waited for."""

    def __init__(self, engine: CompiledEngine, wait, qs: _QuerySet, seq: np.ndarray, counts: np.ndarray, units: int):
        self._engine, self._wait, self._qs, self._seq, self._counts, self._units = engine, wait, qs, seq, counts, units
        self._out: dict[str, Matches] | None = None

    def result(self) -> dict[str, Matches]:
        if self._out is None:
            parts = self._wait()
            self._qs.per_unit = sum(seconds for _, seconds in parts) / self._units
            self._out = self._engine._matches(self._counts, [p for p, _ in parts], self._qs, self._seq)
        return self._out


class _QuerySet:
    """Queries submitted together: their flattened plans, indexed by anchor edge (label << 32 |
    label, and the edge label), and the seconds per (op, plan) unit of their last search."""

    def __init__(self, queries: list[CompiledQuery]):
        self.queries = list(queries)
        self.names, self.widths = [cq.name for cq in queries], np.array([cq.q.n for cq in queries], np.int64)
        self.ps = ps = joined([cq.ps for cq in queries])
        self.materialize = np.array([not cq.count_only for cq in queries], np.bool_)
        self.width = max(cq.q.n for cq in queries)
        lx, ly = ps.qlab[ps.off].astype(np.int64), ps.qlab[ps.off + 1].astype(np.int64)
        self.by_key = np.argsort(lx << 32 | ly, kind="stable")  # plan_units' index: plans by anchor key
        self.keys = (lx << 32 | ly)[self.by_key]
        self.plan_test = ps.chk_test[ps.chk[ps.off + 1, BACKWARD]]  # the anchor's edge test (depth 1's only backward edge)
        self.depth = int(ps.depth.max())
        self.per_unit = float("inf")  # unknown: the first search is split (it may be a catch-up's big batch)

