"""The GPU executor (EX): incremental matching of a batch of edge updates on the device MVG.

Every edge update {a, b} at timestamp seq is matched, for each anchor (x, y) of each
query whose labels and edge label fit, from the seed x -> a, y -> b (and x -> b, y -> a):
the static search of gpu/matcher.cu (`match_at`, its versioned graph view) in the anchor's
order, reading the MVG at T = seq. A seed is one work id of the kernel: one root chunk,
its own table (the anchor's) and timestamp; counts come back per seed and are summed per
(query, update) here. Materialized queries go through the bounded output buffer (each row
ends with its seed) with pause and resume: no match is dropped.

Host work per batch is a few numpy calls whatever the number of queries: the anchors of
all registered queries are one sorted table keyed by (label of x, label of y, edge label),
and an update finds its anchors by binary search in it. The device gets one upload (the
seeds, which the kernel reads as they are) and gives one read-back (counts and the
launch's control words together) for count-only queries, both through pinned buffers.
Two-vertex queries need no search: every seed is a match.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from csmd.engine import ContinuousQuery, Matches, UpdateBatch

from .filtering import QueryBatch
from .device_mvg import Staging
from .launch import i32, i64, or_dummy
from .layout import CTL_IDLE, CTL_OUTN, CTL_STARTED, CTL_STOP, MAXQ, STOP_FULL, structs
from .matcher import WARPS_PER_BLOCK, Tuning, _grid, _warp_words, query_tables
from .module import kernel

_SEQ_BITS = 40  # (query, seq) in one int64 key: sequence numbers stay below 2^40
# The continuous search is latency bound, over a few thousand small searches (seeds) that share
# the control words and the task queue: fewer warps than the static matcher's contend less, and
# an earlier offload splits the few long searches of a lone query sooner. H100, human, batch
# 4096, search ms (all 100 queries; Q_74, Q_99 alone), blocks per SM : offload us:
# 2:200 99 (10.2, 10.2), 1:200 55 (10.1, 10.0), 1:150 55 (8.1, 8.9), 1:100 68 (5.9, 6.7).
EX_TUNING = dict(max_blocks_per_sm=1, offload_us=100.0)
MAX_SEEDS = 1 << 20  # seeds searched in one launch sequence: bounds its buffers (48 bytes a seed)


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
        labels = np.asarray(query.q.labels, np.int64)
        self.x = np.array([a.x for a in query.anchors], np.int64)
        self.y = np.array([a.y for a in query.anchors], np.int64)
        self.anchor_el = np.array([a.el for a in query.anchors], np.int64)
        self.lx, self.ly = labels[self.x], labels[self.y]


def _index(values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Position of each x in the sorted values, -1 where it is absent."""
    i = np.minimum(np.searchsorted(values, x), len(values) - 1)
    return np.where(values[i] == x, i, -1)


class _Group:
    """The queries of one kind (count-only or materialized) as the kernel sees them: their
    tables on the device, and every anchor in one table sorted by its key. Built when the
    registered queries change, reused for every batch until then."""

    def __init__(self, queries: list[PreparedQuery]):
        self.queries = queries
        cat = np.concatenate
        self.tab_query = cat([np.full(len(pq.x), i) for i, pq in enumerate(queries)])
        self.x, self.y = cat([pq.x for pq in queries]), cat([pq.y for pq in queries])
        tables = cat([pq.tables for pq in queries])
        self.size = tables[:, 0].astype(np.int64)
        self.nmax = int(self.size.max())
        self.width = self.nmax + 1  # the seed in the last column
        tables[:, 1] = self.width
        tables[:, 2] = _fast(tables, self.size - 1)
        self.tables, self.el = cp.asarray(tables), cp.asarray(cat([pq.el for pq in queries]))
        lx, ly, ael = cat([pq.lx for pq in queries]), cat([pq.ly for pq in queries]), cat([pq.anchor_el for pq in queries])
        self.labels, self.elabels = np.unique(cat([lx, ly])), np.unique(ael)
        key = self._key(_index(self.labels, lx), _index(self.labels, ly), _index(self.elabels, ael))
        self.order = np.argsort(key, kind="stable")
        # anchors of key k: order[first[k]:first[k + 1]]; the key of a misfit (n_keys) has none
        n_keys = len(self.labels) ** 2 * len(self.elabels)
        self.first = np.searchsorted(key[self.order], np.arange(n_keys + 2))

    def _key(self, ix, iy, ie):
        nl, ne = len(self.labels), len(self.elabels)
        return np.where((ix >= 0) & (iy >= 0) & (ie >= 0), (ix * nl + iy) * ne + ie, nl * nl * ne)

    def seeds(self, batch: UpdateBatch, labels: np.ndarray):
        """(a, b, seq, table) of every seed of the batch: each update against each anchor its
        (label, label, edge label) fits, in both orientations."""
        ea, eb = np.asarray(batch.edge_a, np.int64), np.asarray(batch.edge_b, np.int64)
        ia, ib = _index(self.labels, labels[ea]), _index(self.labels, labels[eb])
        if not ((ia >= 0) & (ib >= 0)).any():  # no endpoint pair any anchor can take
            return [np.zeros(0, np.int64)] * 4
        seq = np.asarray(batch.edge_seq, np.int64)
        ie = _index(self.elabels, np.asarray(batch.edge_label, np.int64))
        parts = []
        for src, dst, key in ((ea, eb, self._key(ia, ib, ie)), (eb, ea, self._key(ib, ia, ie))):
            lo = self.first[key]
            cnt = self.first[key + 1] - lo
            u = np.repeat(np.arange(len(key)), cnt)
            within = np.arange(len(u)) - np.repeat(np.cumsum(cnt) - cnt, cnt)
            parts.append((src[u], dst[u], seq[u], self.order[lo[u] + within]))
        return [np.concatenate(c) for c in zip(*parts)]


class Executor:
    """Runs the versioned search on its own stream; keeps the task queue between batches."""

    def __init__(self, stream: cp.cuda.Stream, tuning: Tuning | None = None):
        self.stream = stream
        self.tuning = tuning or Tuning(**EX_TUNING)
        self._queue = self._ready = None
        self._groups: dict[tuple, _Group] = {}
        self._shapes: dict[int, tuple[int, int]] = {}  # depth -> (shared bytes, blocks) of match_at
        self._state = cp.empty(0, cp.uint64)  # the warps' stacks, reused from batch to batch
        self._seeds, self._counts = Staging(), Staging()  # the upload and the read-back of a search

    def prepare(self, query: ContinuousQuery) -> PreparedQuery:
        return PreparedQuery(query)

    def _group(self, queries: list[PreparedQuery]) -> _Group:
        key = tuple(id(pq) for pq in queries)
        grp = self._groups.get(key)
        if grp is None:  # cached groups hold their queries, so an id is not reused while cached
            if len(self._groups) >= 8:
                self._groups.clear()
            with self.stream:  # the tables' upload is ordered before the searches that read them
                grp = self._groups[key] = _Group(queries)
        return grp

    def run(self, mvg, batch: UpdateBatch, queries: list[PreparedQuery], labels: np.ndarray) -> dict[str, Matches]:
        """Every query's matches (or per-update counts) for the batch's edge updates, on the
        executor's stream (the caller made it wait for the batch's apply). labels: the
        vertex labels on the host. Queries without matches are absent."""
        out: dict[str, Matches] = {}
        if not len(batch.edge_seq) or not queries:
            return out
        for count_only in (True, False):
            group = [pq for pq in queries if pq.count_only == count_only]
            if group:
                out.update(self._matches(mvg, self._group(group), batch, labels, emit=not count_only))
        return out

    def _matches(self, mvg, grp: _Group, batch: UpdateBatch, labels, emit: bool) -> dict[str, Matches]:
        a, b, seq, tab = grp.seeds(batch, labels)
        if not len(seq):
            return {}
        big = grp.size[tab] > 2  # a two-vertex anchor's seed is its match
        counts = np.ones(len(seq), np.int64)
        found = []  # (rows, seed) from the search
        big_seeds = np.flatnonzero(big)
        for at in range(0, len(big_seeds), MAX_SEEDS):
            which = big_seeds[at: at + MAX_SEEDS]
            counts[which], rows = self._search(mvg, grp, a[which], b[which], seq[which], tab[which], emit)
            found += [(r, which[seed]) for r, seed in rows]
        query = grp.tab_query[tab]
        if not emit:
            return _count_matches(grp.queries, query, seq, counts)
        two = np.flatnonzero(~big)
        rows2 = np.zeros((len(two), grp.nmax), np.int32)
        r = np.arange(len(two))
        rows2[r, grp.x[tab[two]]], rows2[r, grp.y[tab[two]]] = a[two], b[two]
        rows = [rows2] + [r[:, : grp.nmax] for r, _ in found]
        seeds = np.concatenate([two] + [s for _, s in found])
        return _row_matches(grp.queries, query[seeds], seq[seeds], np.concatenate(rows))

    def _shape(self, fn, depth: int) -> tuple[int, int]:
        """match_at's shared memory and grid for queries of that depth, worked out once: the grid
        comes from the device's attributes, which CuPy reads all at once (a large share of a
        small batch's cost if asked every time)."""
        if depth not in self._shapes:
            smem = WARPS_PER_BLOCK * 8 * _warp_words(depth)
            fn.max_dynamic_shared_size_bytes = max(smem, max((s for s, _ in self._shapes.values()), default=0))
            self._shapes[depth] = smem, _grid(fn, smem, self.tuning.max_blocks_per_sm)
        return self._shapes[depth]

    def _search(self, mvg, grp: _Group, a, b, seq, tab, emit: bool):
        """Search the seeds: (matches per seed, [(rows, seed index) per drain])."""
        S = len(seq)
        fn = kernel("matcher", "match_at")
        smem, blocks = self._shape(fn, grp.nmax)
        tn = self.tuning
        found = []
        host = self._seeds.host_view(4 * S).reshape(4, S)  # the rows match_at reads: a, b, T, table
        host[0], host[1], host[2], host[3] = a, b, seq, tab
        with self.stream:
            if self._queue is None:
                self._queue = cp.empty(tn.queue_tasks * structs().task, cp.uint8)
                self._ready = cp.zeros(tn.queue_tasks, cp.int32)
            seeds = self._seeds.upload(4 * S, self.stream)  # the one upload
            buf = cp.zeros(8 + S, cp.uint64)  # the control words, then the count of each seed
            ctl, counts = buf[:8], buf[8:]
            words = blocks * WARPS_PER_BLOCK * _warp_words(grp.nmax)
            if len(self._state) < words:  # a batch's launches end before the next batch's (its read-backs)
                self._state = cp.empty(words, cp.uint64)
            state = self._state
            out_cap = max(32, tn.out_rows) if emit else 0
            out = cp.empty(out_cap * grp.width, cp.int32) if emit else or_dummy(None)
            resume = False
            while True:
                with mvg.swap:  # the view stays valid until the launch is enqueued
                    fn((blocks,), (WARPS_PER_BLOCK * 32,), (
                        mvg.view(), i32(not mvg.has_edge_labels), i32(grp.nmax), grp.tables, grp.el, seeds, i64(S),
                        ctl, self._queue, self._ready, i64(tn.queue_tasks), state, counts, i32(resume), i32(emit),
                        out, i64(out_cap), i64(0), i64(int(tn.offload_us * 1e3))), shared_mem=smem)
                if not emit:
                    host = self._counts.download(buf, 8 + S, self.stream)
                    if host[CTL_STOP]:
                        raise RuntimeError(f"match_at stopped early ({int(host[CTL_STOP])})")
                    return host[8:].copy(), found
                c = ctl.get()
                if c[CTL_OUTN]:
                    k = int(c[CTL_OUTN])
                    rows = out[: k * grp.width].reshape(k, grp.width).get()
                    found.append((rows, rows[:, -1].astype(np.int64)))
                if c[CTL_STOP] == 0:
                    return counts.get().astype(np.int64), found
                if c[CTL_STOP] != STOP_FULL:
                    raise RuntimeError(f"match_at stopped early ({int(c[CTL_STOP])})")
                ctl[CTL_IDLE:CTL_OUTN + 1] = 0
                ctl[CTL_STARTED] = 0
                resume = True


def _fast(tables: np.ndarray, last: np.ndarray) -> np.ndarray:
    """Tables whose last depth match_at may count at once (count_last_at, count-only searches):
    one backward edge and no symmetry constraints."""
    s, r = structs(), np.arange(len(tables))
    back, less, greater = (tables[r, off // 4 + last].view(np.uint32) for off in (s.qt_back, s.qt_less, s.qt_greater))
    return (np.bitwise_count(back) == 1) & (less == 0) & (greater == 0)


def _by_query(query: np.ndarray):
    """(query index, positions) for each query present, positions in their original order."""
    order = np.argsort(query, kind="stable")
    present, starts = np.unique(query[order], return_index=True)
    return zip(present, np.split(order, starts[1:]))


def _count_matches(queries, query, seq, counts) -> dict[str, Matches]:
    """Per query, the updates with matches and their numbers (exact int64 sums)."""
    hit = counts > 0
    key = (query[hit].astype(np.int64) << _SEQ_BITS) | seq[hit]
    order = np.argsort(key, kind="stable")
    key, c = key[order], counts[hit][order]
    if not len(key):
        return {}
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    ukey, sums = key[first], np.add.reduceat(c, first)
    uq = ukey >> _SEQ_BITS
    return {queries[qi].name: Matches(ukey[pos] & ((1 << _SEQ_BITS) - 1), counts=sums[pos])
            for qi, pos in _by_query(uq)}


def _row_matches(queries, query, seq, rows) -> dict[str, Matches]:
    return {queries[qi].name: Matches(seq[pos], rows=rows[pos, : queries[qi].n]) for qi, pos in _by_query(query)}
