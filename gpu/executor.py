"""The GPU executor (EX): incremental matching of a batch of edge updates on the device MVG.

Every edge update {a, b} at timestamp seq is matched, for each anchor (x, y) of each
query whose labels and edge label fit, from the seed x -> a, y -> b (and x -> b, y -> a):
the static search of gpu/matcher.cu (`match_at`, its versioned graph view) in the anchor's
order, reading the MVG at T = seq. A seed is one work id of the kernel: one root chunk,
its own table (the anchor's) and timestamp; counts come back per seed and are summed per
(query, update) here. Materialized queries go through the bounded output buffer (each row
ends with its seed) with pause and resume: no match is dropped.

Seeds are built on the host, vectorized per anchor (a batch has at most a few thousand
updates); two-vertex queries need no search (every seed is a match).
"""

from __future__ import annotations

from dataclasses import dataclass

import cupy as cp
import numpy as np

from csmd.engine import ContinuousQuery, Matches, UpdateBatch

from .filtering import QueryBatch
from .launch import i32, i64
from .layout import CTL_IDLE, CTL_OUTN, CTL_STARTED, CTL_STOP, MAXQ, STOP_FULL, structs
from .matcher import WARPS_PER_BLOCK, Tuning, _grid, _warp_words, query_tables
from .module import kernel


class PreparedQuery:
    """A registered query in the executor's form: one QueryTable (and edge-label table) per
    anchor, in the anchor's order, with label-only candidates."""

    def __init__(self, query: ContinuousQuery):
        self.name, self.q, self.count_only = query.name, query.q, query.count_only
        self.n = query.q.n
        na = len(query.anchors)
        orders = np.full((na, MAXQ), -1, np.int64)
        for i, a in enumerate(query.anchors):
            orders[i, : self.n] = a.order
        self.tables, el = query_tables(QueryBatch.pack([query.q] * na), orders)
        self.el = np.zeros((na, MAXQ * MAXQ), np.int32) if el is None else el.astype(np.int32)
        labels = np.asarray(query.q.labels)
        # (x, y, edge label, label of x, label of y) per anchor
        self.anchors = [(a.x, a.y, a.el, int(labels[a.x]), int(labels[a.y])) for a in query.anchors]


@dataclass
class _Seeds:
    """The seeds of one batch for a group of queries (host arrays, one entry per seed)."""

    a: np.ndarray  # image of the anchor's x
    b: np.ndarray  # image of its y
    seq: np.ndarray  # the update's timestamp
    query: np.ndarray  # index of the query in the group
    tab: np.ndarray  # index of the anchor's table in the group's tables


def _seeds(queries: list[PreparedQuery], batch: UpdateBatch, la: np.ndarray, lb: np.ndarray) -> _Seeds:
    ea, eb = np.asarray(batch.edge_a, np.int64), np.asarray(batch.edge_b, np.int64)
    el, seq = np.asarray(batch.edge_label), np.asarray(batch.edge_seq, np.int64)
    parts = []
    tab = 0
    for qi, pq in enumerate(queries):
        for x, y, ael, lx, ly in pq.anchors:
            fit = el == ael
            fwd = np.flatnonzero(fit & (la == lx) & (lb == ly))
            rev = np.flatnonzero(fit & (lb == lx) & (la == ly))
            k = len(fwd) + len(rev)
            if k:
                parts.append((np.concatenate([ea[fwd], eb[rev]]), np.concatenate([eb[fwd], ea[rev]]),
                              np.concatenate([seq[fwd], seq[rev]]), np.full(k, qi), np.full(k, tab)))
            tab += 1
    if not parts:
        e = np.zeros(0, np.int64)
        return _Seeds(e, e, e, e, e)
    return _Seeds(*(np.concatenate(c) for c in zip(*parts)))


class Executor:
    """Runs the versioned search; keeps the task queue between batches."""

    def __init__(self, tuning: Tuning | None = None):
        self.tuning = tuning or Tuning()
        self._queue = self._ready = None

    def prepare(self, query: ContinuousQuery) -> PreparedQuery:
        return PreparedQuery(query)

    def run(self, mvg, batch: UpdateBatch, queries: list[PreparedQuery]) -> dict[str, Matches]:
        """Every query's matches (or per-update counts) for the batch's edge updates, on mvg's
        stream (after the batch's apply). Queries without matches are absent."""
        out: dict[str, Matches] = {}
        if not len(batch.edge_seq) or not queries:
            return out
        with mvg.stream:
            ends = cp.asarray(np.concatenate([batch.edge_a, batch.edge_b]).astype(np.int64))
            lab = mvg.labels[ends].get()
        k = len(batch.edge_seq)
        la, lb = lab[:k], lab[k:]
        for count_only in (True, False):
            group = [pq for pq in queries if pq.count_only == count_only]
            if group:
                out.update(self._group(mvg, group, _seeds(group, batch, la, lb), emit=not count_only))
        return out

    def _group(self, mvg, group: list[PreparedQuery], s: _Seeds, emit: bool) -> dict[str, Matches]:
        tables = np.concatenate([pq.tables for pq in group])
        el = np.concatenate([pq.el for pq in group])
        sizes = tables[s.tab, 0]
        two = sizes == 2  # the seed is the match
        big = np.flatnonzero(~two)
        counts = np.zeros(len(s.seq), np.int64)
        counts[two] = 1
        rows_of = [np.flatnonzero(two)]  # seeds whose rows are (a, b) at (x, y)
        found = []  # (rows, seed) from the search
        if len(big):
            c, rows = self._search(mvg, tables, el, s, big, emit)
            counts[big] = c
            found = rows
        result = {}
        for qi, pq in enumerate(group):
            mine = s.query == qi
            if not emit:
                hit = mine & (counts > 0)
                if hit.any():
                    seqs, inv = np.unique(s.seq[hit], return_inverse=True)
                    result[pq.name] = Matches(seqs, counts=np.bincount(inv, counts[hit]).astype(np.int64))
                continue
            parts_rows, parts_seq = [], []
            two_mine = rows_of[0][mine[rows_of[0]]]
            if len(two_mine):
                r = np.zeros((len(two_mine), 2), np.int32)
                tabs = s.tab[two_mine]
                first = sum(len(p.anchors) for p in group[:qi])
                for ai, (ax, ay, *_rest) in enumerate(pq.anchors):
                    sel = tabs == first + ai
                    r[sel, ax], r[sel, ay] = s.a[two_mine[sel]], s.b[two_mine[sel]]
                parts_rows.append(r)
                parts_seq.append(s.seq[two_mine])
            for rows, seed in found:
                sel = s.query[seed] == qi
                if sel.any():
                    parts_rows.append(rows[sel, : pq.n])
                    parts_seq.append(s.seq[seed[sel]])
            if parts_rows:
                result[pq.name] = Matches(np.concatenate(parts_seq), rows=np.concatenate(parts_rows).astype(np.int32))
        return result

    def _search(self, mvg, tables: np.ndarray, el: np.ndarray, s: _Seeds, which: np.ndarray, emit: bool):
        """Search the seeds `which`: (matches per seed, [(rows, seed index) per drain])."""
        S = len(which)
        nmax = int(tables[:, 0].max())
        width = nmax + 1  # the seed in the last column
        tables = tables.copy()
        tables[:, 1] = width
        tables[:, 2] = 0  # no count_last on the MVG
        fn = kernel("matcher", "match_at")
        smem = WARPS_PER_BLOCK * 8 * _warp_words(nmax)
        fn.max_dynamic_shared_size_bytes = smem
        blocks = _grid(fn, smem, self.tuning.max_blocks_per_sm)
        tn = self.tuning
        found = []
        with mvg.stream:
            if self._queue is None:
                self._queue = cp.empty(tn.queue_tasks * structs().task, cp.uint8)
                self._ready = cp.zeros(tn.queue_tasks, cp.int32)
            pool = np.full((S, 32, 2), -1, np.int32)
            pool[:, 0, 0], pool[:, 0, 1] = s.a[which], s.b[which]
            pool = cp.asarray(pool.reshape(-1))
            seed_tab = cp.asarray(s.tab[which].astype(np.int32))
            seed_T = cp.asarray(s.seq[which].astype(np.int64))
            chunk_q = cp.arange(S, dtype=cp.int32)
            dev_tables, dev_el = cp.asarray(tables), cp.asarray(el)
            ctl = cp.zeros(8, cp.uint64)
            state = cp.zeros(blocks * WARPS_PER_BLOCK * _warp_words(nmax), cp.uint64)
            counts = cp.zeros(S, cp.uint64)
            out_cap = max(32, tn.out_rows) if emit else 0
            out = cp.empty(max(1, out_cap * width), cp.int32)
            resume = False
            while True:
                ctl[CTL_IDLE:CTL_OUTN + 1] = 0
                ctl[CTL_STARTED] = 0
                fn((blocks,), (WARPS_PER_BLOCK * 32,), (
                    mvg.view(), i32(nmax), dev_tables, dev_el, seed_tab, seed_T, pool, chunk_q, i64(S * 32), ctl,
                    self._queue, self._ready, i64(tn.queue_tasks), state, counts, i32(resume), i32(emit), out,
                    i64(out_cap), i64(0), i64(int(tn.offload_us * 1e3))), shared_mem=smem)
                c = ctl.get()
                if emit and c[CTL_OUTN]:
                    k = int(c[CTL_OUTN])
                    rows = out[: k * width].reshape(k, width).get()
                    found.append((rows, which[rows[:, -1]]))
                if c[CTL_STOP] == 0:
                    break
                if c[CTL_STOP] != STOP_FULL:
                    raise RuntimeError(f"match_at stopped early ({int(c[CTL_STOP])})")
                resume = True
            return counts.get().astype(np.int64), found
