"""The GPU executor (EX): incremental matching of a batch of edge updates on the device MVG.

Every edge update {a, b} at timestamp seq is matched, for each anchor (x, y) of each
query whose labels and edge label fit, from the seed x -> a, y -> b (and x -> b, y -> a):
the static search of gpu/matcher.cu (`match_at`, its versioned graph view) in the anchor's
order, reading the MVG at T = seq. A seed is one work id of the kernel: one root chunk,
its own table (the anchor's) and timestamp; counts come back per seed and are summed per
(query, update) here. Materialized queries go through the bounded output buffer (each row
ends with its seed) with pause and resume: no match is dropped; a search's many rows are put
in the canonical delta order on the device (drains.py) before they come back.

Host work per batch is a few numpy calls whatever the number of queries: the anchors of
all registered queries are two sorted tables (searched anchors, two-vertex ones) keyed by
(label of x, label of y, edge label), and an update finds its anchors by binary search in
them. The device gets one upload (the seeds, which the kernel reads as they are, followed by
the launch's control words and per-seed counts, zeroed) and gives one read-back (control
words and counts together) for count-only queries, both through one pinned buffer.
Two-vertex queries need no search: every seed is a match.
"""

from __future__ import annotations

from functools import partial

import cupy as cp
import numpy as np

from csmd.pipeline.query_rows import by_query, merged
from csmd.engine import ContinuousQuery, Matches, UpdateBatch
from csmd.errors import InputError
from csmd.model.direction import HALF, HALF_MASK, flip, label_test, passes
from csmd.model.time_constraints import NO_TS, query_edges

from .filtering import QueryBatch
from .device_mvg import Staging
from .drains import id_bits, sorted_drain
from .launch import DirectLaunch
from .layout import (CTL_IDLE, CTL_OUTN, CTL_STARTED, CTL_STOP, MAXQ, STOP_FULL, TMAXE, TT_EDGES, TT_EEND, TT_ORDERS,
                     TT_WORDS, structs)
from .matcher import WARPS_PER_BLOCK, Tuning, _grid, _warp_words, query_tables, split_args
from .module import kernel

_SEQ_BITS = 40  # (query, seq) in one int64 key: sequence numbers stay below 2^40
# The continuous search is latency bound, over a few thousand small searches (seeds) that share
# the control words and the task queue: fewer warps than the static matcher's contend less, and
# an earlier offload splits the few long searches of a lone query sooner. H100, human, batch
# 4096, search ms (all 100 queries; Q_74, Q_99 alone), blocks per SM : offload us:
# 2:200 99 (10.2, 10.2), 1:200 55 (10.1, 10.0), 1:150 55 (8.1, 8.9), 1:100 68 (5.9, 6.7).
# Since the leaves are counted as products (count_suffix_at; all 100, Q_72, Q_78, Q_100 alone):
# 1:200 29.0 (3.6, 25.3, 5.1), 1:100 23.4 (3.6, 15.2, 4.1), 1:50 23.7 (3.5, 11.2, 4.9), 2:50 38.4,
# 1:25 28.2 (3.2, 8.3, 6.7); match_at then offloads after a quarter of offload_us while three
# quarters of the warps are idle: 1:100 19.5 (3.4, 9.1, 5.7), 1:50 24.1 (3.3, 9.7, 6.9).
EX_TUNING = dict(max_blocks_per_sm=1, offload_us=100.0)
MAX_SEEDS = 1 << 20  # seeds searched in one launch sequence: bounds its buffers (48 bytes a seed)
DEVICE_SORT_ROWS = 4096  # a search's rows are put in canonical order on the device from this many on (drains.py)
DEVICE_HOLD_ROWS = 1 << 22  # drains held on the device for one sort, at most (some 200 bytes a row with its keys)
# Up to this many updates, a batch's anchor keys come from a dict, side by side: a look-up costs
# a fraction of a microsecond, the vectorized keys some 30 numpy calls of about one each.
FEW_UPDATES = 32


def time_words(q, order: list[int], name: str) -> tuple[np.ndarray, int]:
    """A table's time words (gpu/layout.cuh) and span (-1: none) for the search of q in `order`
    under event time: every query edge, by the depth that completes it, with the arc its ts is
    read from; the order pairs by the depth that completes both of their edges."""
    ends, t = query_edges(q), q.time
    pairs = t.order if t is not None else ()
    if len(ends) > TMAXE or len(pairs) > TMAXE:
        raise InputError(name, None, f"under event time the gpu engine searches queries of at most {TMAXE} edges and {TMAXE} "
                         f"order pairs")
    pos = {u: d for d, u in enumerate(order)}
    edges = sorted((max(pos[u], pos[v]), min(pos[u], pos[v]), int(pos[u] > pos[v]), n) for n, (u, v) in enumerate(ends))
    at = {n: i for i, (*_, n) in enumerate(edges)}
    words = np.zeros(TT_WORDS, np.int32)
    words[0], words[1] = len(edges), len(pairs)
    later = np.array([k for k, *_ in edges])
    words[TT_EEND: TT_EEND + MAXQ] = np.searchsorted(later, np.arange(MAXQ), "right")
    for i, (k, j, back, _) in enumerate(edges):
        words[TT_EDGES + i] = j | k << 8 | back << 16
    for i, (a, b) in enumerate(pairs):
        words[TT_ORDERS + i] = at[a] | at[b] << 8 | max(edges[at[a]][0], edges[at[b]][0]) << 16
    return words, -1 if t is None or t.span is None else t.span


class PreparedQuery:
    """A registered query in the executor's form: one QueryTable (and edge-label table) per
    anchor, in the anchor's order, with label-only candidates; under event time (timed) the
    time words and span of each."""

    def __init__(self, query: ContinuousQuery, timed: bool = False):
        self.name, self.q, self.count_only = query.name, query.q, query.count_only
        self.n = query.q.n
        na = len(query.anchors)
        orders = np.full((na, MAXQ), -1, np.int64)
        for i, a in enumerate(query.anchors):
            orders[i, : self.n] = a.order
        self.tables, el = query_tables(QueryBatch.pack([query.q] * na), orders, [query.sym] * na)
        self.el = np.zeros((na, MAXQ * MAXQ), np.int32) if el is None else el.astype(np.int32)
        labels = np.asarray(query.q.labels, np.int64)
        self.x = np.array([a.x for a in query.anchors], np.int64)
        self.y = np.array([a.y for a in query.anchors], np.int64)
        self.anchor_el = np.array([a.el for a in query.anchors], np.int64)
        self.lx, self.ly = labels[self.x], labels[self.y]
        self.timed = timed
        words = [time_words(query.q, a.order, query.name) for a in query.anchors] if timed else []
        self.tt = np.array([w for w, _ in words], np.int32).reshape(-1, TT_WORDS)
        self.span = np.array([sp for _, sp in words], np.int64)


def _index(values: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Position of each x in the sorted values, -1 where it is absent."""
    i = np.minimum(np.searchsorted(values, x), len(values) - 1)
    return np.where(values[i] == x, i, -1)


class _Anchors:
    """One group's anchors of one kind (searched, or two-vertex: their seed is their match),
    sorted by key: the anchors of key k are order[first[k]:first[k + 1]]."""

    def __init__(self, key: np.ndarray, tables: np.ndarray, n_keys: int, tab_query: np.ndarray,
                 tab_order: np.ndarray | None):
        by_key = np.argsort(key, kind="stable")
        self.order = tables[by_key]
        self.tab_query = tab_query  # the query of every table
        self.tab_order = tab_order  # of every table: +1 its seeds need a < b, -1 a > b, 0 either (None: all 0)
        self.first = np.searchsorted(key[by_key], np.arange(n_keys + 2))  # the key of a misfit (n_keys) has none

    def seeds(self, key, src, dst, seq, op, select):
        """(a, b, seq, table, op) of the seeds of the update sides (src, dst, seq, the op of each)
        whose key is `key`, less those of (query, op) pairs that select (None: all) leaves out."""
        lo = self.first[key]
        cnt = self.first[key + 1] - lo
        u = np.repeat(np.arange(len(key)), cnt)
        at = np.arange(len(u)) + np.repeat(lo - np.cumsum(cnt) + cnt, cnt)  # lo[u] + rank within the key
        tab = self.order[at]
        if select is not None:
            keep = select[self.tab_query[tab], op[u]]
            u, tab = u[keep], tab[keep]
        if self.tab_order is not None:
            keep = self.tab_order[tab] * (dst[u] - src[u]) >= 0  # a != b: no self-loops
            u, tab = u[keep], tab[keep]
        return src[u], dst[u], seq[u], tab, op[u]


class _Group:
    """The queries of one kind (count-only or materialized) as the kernel sees them: their
    tables on the device, and their anchors keyed by (label of x, label of y, edge label).
    Built when the registered queries change, reused for every batch until then."""

    def __init__(self, queries: list[PreparedQuery]):
        self.queries = queries
        self.names, self.widths = [pq.name for pq in queries], np.array([pq.n for pq in queries], np.int64)
        cat = np.concatenate
        self.tab_query = cat([np.full(len(pq.x), i) for i, pq in enumerate(queries)])
        self.dev_tab_query, self.dev_widths = cp.asarray(self.tab_query), cp.asarray(self.widths, cp.int32)  # drains'
        self.x, self.y = cat([pq.x for pq in queries]), cat([pq.y for pq in queries])
        tables = cat([pq.tables for pq in queries])
        self.size = tables[:, 0].astype(np.int64)
        self.nmax = int(self.size.max())
        # under event time (the queries' engine's): each table's time words and span
        self.timed = queries[0].timed
        tt, self.span = cat([pq.tt for pq in queries]), cat([pq.span for pq in queries])
        self.tt_host = tt
        constrained = (self.span >= 0) | (tt[:, 1] > 0) if self.timed else np.zeros(len(tables), bool)
        # the seed in the last column; under event time a match's ts_min and ts_max before it
        self.width = self.nmax + 1 + (4 if self.timed and not queries[0].count_only else 0)
        tables[:, 1] = self.width
        tables[:, 2] = np.where(constrained, 0, _fast(tables, self.size))  # a constrained match is counted one by one
        self.tables, self.el = cp.asarray(tables), cp.asarray(cat([pq.el for pq in queries]))
        self.tt, self.tspan = (cp.asarray(tt), cp.asarray(self.span)) if self.timed else (None, None)
        lx, ly, ael = cat([pq.lx for pq in queries]), cat([pq.ly for pq in queries]), cat([pq.anchor_el for pq in queries])
        self.labels, self.elabels = np.unique(cat([lx, ly])), np.unique(ael)
        n_keys = len(self.labels) ** 2 * len(self.elabels)
        key = self._key(_index(self.labels, lx), _index(self.labels, ly), _index(self.elabels, ael))
        pair = self.size == 2
        order = _seed_order(tables)
        self.searched = _Anchors(key[~pair], np.flatnonzero(~pair), n_keys, self.tab_query, order)
        self.pairs = _Anchors(key[pair], np.flatnonzero(pair), n_keys, self.tab_query, order)
        self.key_of = dict(zip(zip(lx.tolist(), ly.tolist(), ael.tolist()), key.tolist()))
        self.misfit = n_keys  # the key of a side no anchor fits
        self.directed = queries[0].q.directed  # the queries of one engine read one graph

    def _key(self, ix, iy, ie):
        nl, ne = len(self.labels), len(self.elabels)
        return np.where((ix >= 0) & (iy >= 0) & (ie >= 0), (ix * nl + iy) * ne + ie, nl * nl * ne)

    def sides(self, batch: UpdateBatch, labels: np.ndarray):
        """(key, src, dst, seq, op) of the batch's updates seen from both ends (a -> x then b -> x);
        None when no endpoint pair fits any anchor."""
        ea, eb = np.asarray(batch.edge_a, np.int64), np.asarray(batch.edge_b, np.int64)
        if self.directed:
            return self._arc_sides(batch, labels, ea, eb)
        src = np.concatenate((ea, eb))
        k = len(ea)
        if k <= FEW_UPDATES:
            lab, el = labels[src].tolist(), np.asarray(batch.edge_label).tolist()
            get, misfit = self.key_of.get, self.misfit
            key = [get(t, misfit) for t in zip(lab, lab[k:] + lab[:k], el + el)]
            if key.count(misfit) == len(key):
                return None
            key = np.array(key)
        else:
            isrc = _index(self.labels, labels[src])
            idst = np.concatenate((isrc[k:], isrc[:k]))
            if not ((isrc >= 0) & (idst >= 0)).any():
                return None
            ie = _index(self.elabels, np.asarray(batch.edge_label, np.int64))
            key = self._key(isrc, idst, np.concatenate((ie, ie)))
        seq = np.asarray(batch.edge_seq, np.int64)
        op = np.arange(k)
        return key, src, np.concatenate((eb, ea)), np.concatenate((seq, seq)), np.concatenate((op, op))

    def _arc_sides(self, batch: UpdateBatch, labels: np.ndarray, ea: np.ndarray, eb: np.ndarray):
        """sides() for a directed graph, whose op is the arc a -> b with its pair's code c (as a sees
        it): an anchor (x, y) takes it where the anchor's code (as x sees it) holds that arc and
        passes c, so with x on a its out half alone or c whole, with x on b the in half of c as b
        sees it alone or that code whole (daemon/model/direction.py seed_ways): up to four keys."""
        c = np.asarray(batch.edge_label, np.int64)
        cb = flip(c).astype(np.int64)
        other = (c >> HALF) != 0  # the pair's other arc, b -> a
        els = (c & HALF_MASK, cb & (HALF_MASK << HALF), np.where(other, c, -1), np.where(other, cb, -1))
        src, dst = np.concatenate((ea, eb, ea, eb)), np.concatenate((eb, ea, eb, ea))
        isrc, idst = _index(self.labels, labels[src]), _index(self.labels, labels[dst])
        key = self._key(isrc, idst, _index(self.elabels, np.concatenate(els)))
        if (key == self.misfit).all():
            return None
        seq, op = np.asarray(batch.edge_seq, np.int64), np.arange(len(ea))
        return key, src, dst, np.tile(seq, 4), np.tile(op, 4)


class Executor:
    """Runs the versioned search on its own stream; keeps the task queue between batches."""

    def __init__(self, stream: cp.cuda.Stream, tuning: Tuning | None = None):
        self.stream = stream
        self.tuning = tuning or Tuning(**EX_TUNING)
        self._queue = self._ready = None
        self._groups: dict[tuple, _Group] = {}
        self._last: tuple = (None, [])  # the last query list groups() was given, and its answer
        self._shapes: dict[int, tuple[int, int]] = {}  # depth -> (shared bytes, blocks) of match_at
        self._state = cp.empty(0, cp.uint64)  # the warps' stacks, reused from batch to batch
        self._seeds = Staging()  # a search's one upload, and its read-back
        self._match_at = kernel("matcher", "match_at")
        self.sort_rows = DEVICE_SORT_ROWS  # a search's rows sorted on the device from this many on (a warm-up's: 1)
        self._launch = None  # match_at's DirectLaunch, made with the first MVG's view

    def prepare(self, query: ContinuousQuery, timed: bool = False) -> PreparedQuery:
        """The query's tables, and match_at's grid for its depth: reading the device's attributes
        would otherwise be the first batch's. timed: under event time."""
        pq = PreparedQuery(query, timed)
        self._shape(self._match_at, pq.n)
        return pq

    def _group(self, queries: list[PreparedQuery]) -> _Group:
        key = tuple(id(pq) for pq in queries)
        grp = self._groups.get(key)
        if grp is None:  # cached groups hold their queries, so an id is not reused while cached
            if len(self._groups) >= 32:  # a cluster instance searches up to [cluster] shards query sets a batch
                self._groups.clear()
            with self.stream:  # the tables' upload is ordered before the searches that read them
                grp = self._groups[key] = _Group(queries)
        return grp

    def run(self, mvg, batch: UpdateBatch, queries: list[PreparedQuery], labels: np.ndarray,
            select: np.ndarray | None = None, split=None) -> dict[str, Matches]:
        """Every query's matches (or per-update counts) for the batch's edge updates (those select
        marks, as the engine interface's submit), on the executor's stream (the caller made it
        wait for the batch's apply). labels: the vertex labels on the host. Queries without
        matches are absent. split: None (this device searches), or split(g, seeds...) searches
        the seeds of the g-th of groups(queries) as `searched` does (gpu/replicas.py: on several
        devices)."""
        out: dict[str, Matches] = {}
        if not len(batch.edge_seq) or not queries:
            return out
        for g, (rows, grp) in enumerate(self.groups(queries)):
            search = partial(self.searched, mvg, grp) if split is None else partial(split, g)
            out.update(self._matches(grp, batch, labels, None if select is None else select[rows],
                                     not grp.queries[0].count_only, search))
        return out

    def groups(self, queries: list[PreparedQuery]) -> list[tuple[list[int], _Group]]:
        """(positions in queries, their _Group) of the count-only queries, then of the materialized
        ones; built on first use and kept (GpuEngine.warm builds them before a stream). The pipeline
        hands the same list batch after batch until the queries change: its answer is kept too."""
        if queries is self._last[0]:
            return self._last[1]
        out = []
        for count_only in (True, False):
            rows = [i for i, pq in enumerate(queries) if pq.count_only == count_only]
            if rows:
                out.append((rows, self._group([queries[i] for i in rows])))
        self._last = (queries, out)
        return out

    def _matches(self, grp: _Group, batch: UpdateBatch, labels, select, emit: bool, search) -> dict[str, Matches]:
        sides = grp.sides(batch, labels)
        if sides is None:
            return {}
        a, b, seq, tab, op = grp.searched.seeds(*sides, select)
        ts = _seed_ts(batch, a, op) if grp.timed else None  # the seeds' arcs' ts (an insertion is not visible at its T)
        counts, found, ready = search(a, b, seq, tab, emit, ts, id_bits(len(labels)))
        # a two-vertex anchor's seed is its match (under event time, where it keeps the constraints)
        none = (np.zeros(0, np.int64),) * 5
        pa, pb, pseq, ptab, pop = grp.pairs.seeds(*sides, select) if len(grp.pairs.order) else none
        pts = None
        if grp.timed:
            keep, pts = _pair_times(grp, _seed_ts(batch, pa, pop), ptab)
            pa, pb, pseq, ptab, pts = pa[keep], pb[keep], pseq[keep], ptab[keep], pts[keep]
        if not emit:
            if len(ptab):
                tab, seq = np.concatenate((tab, ptab)), np.concatenate((seq, pseq))
                counts = np.concatenate((counts, np.ones(len(ptab), np.int64)))
            return _count_matches(grp.queries, grp.tab_query[tab], seq, counts)
        rows2 = np.zeros((len(ptab), grp.nmax), np.int32)
        r = np.arange(len(ptab))
        rows2[r, grp.x[ptab]], rows2[r, grp.y[ptab]] = pa, pb
        # (rows, query, op into seq, ts) chunks: the pairs', then each drain's, whose rows end with their
        # seed, under event time after ts_min and ts_max as (low, high) int32 words
        none = np.zeros((0, 2), np.int64)
        chunks = [(rows2, grp.tab_query[ptab], r, none if pts is None else pts, pseq)]
        chunks += [(rows, grp.tab_query[tab[s]], s, np.ascontiguousarray(rows[:, -5:-1]).view(np.int64) if grp.timed
                    else none, seq) for rows, s in found]
        return merged([by_query(chunks, grp.names, grp.widths)] + ready)

    def searched(self, mvg, grp: _Group, a, b, seq, tab, emit: bool, ts, bits: int, split=(0, 1)):
        """The search of the seeds (a, b, seq, tab; ts under event time, else None; bits: the graph's
        id_bits) in launch sequences of at most MAX_SEEDS: (matches per seed, (rows, seed) per drain
        read back as it was, the drains sorted on the device as query -> Matches dicts). split
        (i, n): part i of the search split over n devices (matcher.cu deal_at: the parts' counts
        add up, their rows are the search's)."""
        counts = np.empty(len(seq), np.int64)
        found, ready = [], []
        for at in range(0, len(seq), MAX_SEEDS):
            end = at + MAX_SEEDS
            counts[at:end], drains = self._search(mvg, grp, a[at:end], b[at:end], seq[at:end], tab[at:end], emit,
                                                  None if ts is None else ts[at:end], bits, split)
            for d in drains:
                if isinstance(d, dict):
                    ready.append(d)
                else:
                    found.append((d[0], at + d[1]))
        return counts, found, ready

    def seeded(self, mvg, pq: PreparedQuery, g, emit: bool, share=(0, 1)) -> tuple[np.ndarray | None, int]:
        """A static search of pq (one anchor) in mvg, a timed device graph of g read after every
        edge, seeded by every adjacency entry of g (one orientation of a data pair: x on its owner,
        y on its neighbour) whose labels and edge label fit the anchor; share (i, n): part i of the
        search split over n devices (as `searched` splits one). Returns (the matches, in query-vertex order, where emit; their number)."""
        from csmd.cpu.mvg import entry_ts

        grp = self._group([pq])
        gk, nbrs, els = g.grouped
        owner = gk // max(g.num_labels, 1)
        ts_out, ts_in = entry_ts(g, owner, nbrs)
        nbrs = nbrs.astype(np.int64)
        fit = ((g.labels[owner] == pq.lx[0]) & (g.labels[nbrs] == pq.ly[0])
               & passes(els, label_test(pq.anchor_el[0], g.directed)))
        if grp.searched.tab_order is not None:  # --distinct: the seed's own symmetry constraint
            fit &= grp.searched.tab_order[0] * (nbrs - owner) >= 0
        a, b, ts = owner[fit], nbrs[fit], np.stack([ts_out[fit], ts_in[fit]], 1)
        tab, seq = np.zeros(len(a), np.int64), np.ones(len(a), np.int64)  # T 1: every entry is alive (ct -1)
        if pq.n == 2:  # each seed is a match where it keeps the constraints (a split's seeds i, i + n, ...)
            keep = _pair_times(grp, ts, tab)[0] & (np.arange(len(a)) % share[1] == share[0])
            rows = np.zeros((int(keep.sum()), 2), np.int32)
            rows[:, pq.x[0]], rows[:, pq.y[0]] = a[keep], b[keep]
            return (rows if emit else None), len(rows)
        count, found = 0, []
        for at in range(0, len(a), MAX_SEEDS):
            end = at + MAX_SEEDS
            counts, rows = self._search(mvg, grp, a[at:end], b[at:end], seq[at:end], tab[at:end], emit, ts[at:end],
                                        split=share)
            count += int(counts.sum())
            found += [r[:, : grp.nmax] for r, _ in rows]
        if not emit:
            return None, count
        return (np.concatenate(found) if found else np.zeros((0, pq.n), np.int32)), count

    def _shape(self, fn, depth: int) -> tuple[int, int]:
        """match_at's shared memory and grid for queries of that depth, worked out once: the grid
        comes from the device's attributes, which CuPy reads all at once (a large share of a
        small batch's cost if asked every time)."""
        if depth not in self._shapes:
            smem = WARPS_PER_BLOCK * 8 * _warp_words(depth)
            fn.max_dynamic_shared_size_bytes = max(smem, max((s for s, _ in self._shapes.values()), default=0))
            self._shapes[depth] = smem, _grid(fn, smem, self.tuning.max_blocks_per_sm)
        return self._shapes[depth]

    def _search(self, mvg, grp: _Group, a, b, seq, tab, emit: bool, ts=None, bits: int | None = None, split=(0, 1)):
        """Search the seeds (ts: under event time, the ts of their arcs a -> b and b -> a): (matches
        per seed, valid until the next search; per drain (rows, seed index), or with bits (the
        graph's id_bits), where the search's rows are sort_rows or more, its rows sorted
        on the device (drains.sorted_drain), in one piece up to DEVICE_HOLD_ROWS rows)."""
        S = len(seq)
        smem, blocks = self._shape(self._match_at, grp.nmax)
        tn = self.tuning
        found = []
        # the rows match_at reads (a, b, T, table; ts out and back), then its control words and the
        # count of each seed, zeroed by the same upload (no allocation, no memset)
        R = 4 if ts is None else 6
        host = self._seeds.host_view((R + 1) * S + 8)
        staged = host[: R * S].reshape(R, S)
        staged[0], staged[1], staged[2], staged[3] = a, b, seq, tab
        if ts is not None:
            staged[4], staged[5] = ts[:, 0], ts[:, 1]
        host[R * S:] = 0
        with self.stream:
            if self._queue is None:
                self._queue = cp.empty(tn.queue_tasks * structs().task, cp.uint8)
                self._ready = cp.zeros(tn.queue_tasks, cp.int32)
            seeds = self._seeds.upload((R + 1) * S + 8, self.stream)  # the one upload
            ctl, counts = (seeds.data.ptr + 8 * at for at in (R * S, R * S + 8))  # u64* arguments
            words = blocks * WARPS_PER_BLOCK * _warp_words(grp.nmax)
            if len(self._state) < words:  # a batch's launches end before the next batch's (its read-backs)
                self._state = cp.empty(words, cp.uint64)
            state = self._state
            out_cap = max(32, tn.out_rows) if emit else 0
            out = cp.empty(out_cap * grp.width, cp.int32) if emit else None
            if self._launch is None:
                self._launch = DirectLaunch(self._match_at, 23, len(mvg.view_words()))
            tt, tspan = (0, 0) if grp.tt is None else (grp.tt.data.ptr, grp.tspan.data.ptr)  # null: untimed
            resume, held = False, []  # held: drains waiting on the device for one sort
            while True:
                with mvg.swap:  # the view stays valid until the launch is enqueued
                    self._launch(blocks, WARPS_PER_BLOCK * 32, self.stream.ptr, (
                        int(not mvg.has_edge_labels), grp.nmax, grp.tables.data.ptr, grp.el.data.ptr, seeds.data.ptr, S,
                        ctl, self._queue.data.ptr, self._ready.data.ptr, tn.queue_tasks, state.data.ptr,
                        counts, int(resume), int(emit), 0 if out is None else out.data.ptr, out_cap, 0,
                        int(tn.offload_us * 1e3), tt, tspan, *split_args(split)), mvg.view_words(), smem)
                if not emit:
                    back = self._seeds.read_back(R * S, 8 + S, self.stream)
                    if back[CTL_STOP]:
                        raise RuntimeError(f"match_at stopped early ({int(back[CTL_STOP])})")
                    return back[8:], found
                c = self._seeds.read_back(R * S, 8, self.stream)
                k, done = int(c[CTL_OUTN]), c[CTL_STOP] == 0
                if bits is not None and (k >= self.sort_rows or held):
                    # kept on the device until the search ends (or DEVICE_HOLD_ROWS), then sorted at once: a
                    # query's rows in one sorted piece, none left to merge on the host
                    held.append(out[: k * grp.width].reshape(k, grp.width))
                    out = cp.empty(out_cap * grp.width, cp.int32) if not done else None
                    if done or sum(len(h) for h in held) >= DEVICE_HOLD_ROWS:
                        rows = held[0] if len(held) == 1 else cp.concatenate(held)
                        found.append(sorted_drain(rows, len(rows), grp, seeds, S, bits, self.stream))
                        held = []
                elif k:
                    rows = out[: k * grp.width].reshape(k, grp.width).get()
                    found.append((rows, rows[:, -1].astype(np.int64)))
                if done:
                    return self._seeds.read_back(R * S + 8, S, self.stream), found
                if c[CTL_STOP] != STOP_FULL:
                    raise RuntimeError(f"match_at stopped early ({int(c[CTL_STOP])})")
                # the next launch's per-launch words: idle, stop, out rows, started
                seeds[R * S + CTL_IDLE: R * S + CTL_OUTN + 1] = 0
                seeds[R * S + CTL_STARTED] = 0
                resume = True


def _seed_order(tables: np.ndarray) -> np.ndarray | None:
    """Per table, the symmetry constraint of depth 1 on depth 0 (distinct queries): +1 when the
    seed needs a < b, -1 when a > b, 0 none; None when no table has one. match_at checks the
    constraints of depths 2 on (check_path); the seed's two vertices are placed as they are, and
    a two-vertex anchor's seed is its match, so the seeds are chosen here."""
    s = structs()
    less, greater = ((tables[:, off // 4 + 1] & 1).astype(np.int64) for off in (s.qt_less, s.qt_greater))
    order = less - greater
    return order if order.any() else None


def _fast(tables: np.ndarray, size: np.ndarray) -> np.ndarray:
    """How many last depths of each table match_at may count at once (count_suffix_at,
    count-only searches; 0: none): the longest tail of depths, after the anchor's two, that
    each have one backward edge and no symmetry constraint, and that no depth of the tail
    refers to (as a backward neighbour, or a same-label depth for injectivity). Given the
    prefix before the tail their candidates are independent: a match count is a product."""
    s, r = structs(), np.arange(len(tables))
    back, same, less, greater = (tables[:, off // 4: off // 4 + MAXQ].view(np.uint32)
                                 for off in (s.qt_back, s.qt_same, s.qt_less, s.qt_greater))
    k = np.zeros(len(tables), np.int64)
    refs = np.zeros(len(tables), np.uint32)  # depths the tail refers to
    grow = np.ones(len(tables), bool)
    for j in range(1, MAXQ - 1):
        d = size - j
        at = np.clip(d, 0, MAXQ - 1)
        b = back[r, at]
        grow &= ((d >= 2) & (np.bitwise_count(b) == 1) & (less[r, at] == 0) & (greater[r, at] == 0)
                 & ((refs >> at.astype(np.uint32)) & 1 == 0))
        if not grow.any():
            break
        k += grow
        refs |= np.where(grow, b | same[r, at], 0).astype(np.uint32)
    return k


def _runs(x: np.ndarray) -> list[int]:
    """Start of each run of equal items in x, then len(x)."""
    return np.flatnonzero(np.r_[True, x[1:] != x[:-1]]).tolist() + [len(x)]


def _count_matches(queries, query, seq, counts) -> dict[str, Matches]:
    """Per query, the updates with matches and their numbers (exact int64 sums)."""
    hit = np.flatnonzero(counts)
    if not len(hit):
        return {}
    key = (query[hit].astype(np.int64) << _SEQ_BITS) | seq[hit]
    order = np.argsort(key, kind="stable")
    key, c = key[order], counts[hit[order]]
    first = _runs(key)[:-1]
    ukey, sums = key[first], np.add.reduceat(c, first)
    uq, useq = ukey >> _SEQ_BITS, ukey & ((1 << _SEQ_BITS) - 1)
    runs = _runs(uq)  # ukey is sorted: each query's updates are one run
    return {queries[uq[lo]].name: Matches(useq[lo:hi], counts=sums[lo:hi]) for lo, hi in zip(runs, runs[1:])}


def _seed_ts(batch: UpdateBatch, src: np.ndarray, op: np.ndarray) -> np.ndarray:
    """Per seed (src: its depth-0 image, the op's a or b), the ts of its arcs src -> other end and
    back (int64 (seeds, 2)), from the op's (UpdateBatch.edge_ts)."""
    fwd_is_ab = src == np.asarray(batch.edge_a)[op]
    ts = batch.edge_ts[op]
    return np.stack([np.where(fwd_is_ab, ts[:, 0], ts[:, 1]), np.where(fwd_is_ab, ts[:, 1], ts[:, 0])], 1)


def _pair_times(grp: _Group, arc: np.ndarray, tab: np.ndarray):
    """Under event time, the seeds of two-vertex anchors (arc: the ts of each one's arcs x -> y
    and back, _seed_ts): which keep their table's span and order pairs (those of the one vertex
    pair), and each one's (ts_min, ts_max), as match_at's in_time judges a searched seed."""
    words = grp.tt_host[tab]
    n = words[:, 0]
    keep = np.ones(len(tab), bool)
    lo = np.full(len(tab), np.iinfo(np.int64).max)
    hi = np.full(len(tab), NO_TS)
    per_edge = np.full((len(tab), 2), NO_TS)  # a pair's query edges: at most its two arcs
    for e in range(2):
        has = n > e
        t = np.where(has, arc[np.arange(len(tab)), (words[:, TT_EDGES + e] >> 16) & 1], NO_TS)
        per_edge[:, e] = t
        timed = t != NO_TS
        lo, hi = np.where(timed, np.minimum(lo, t), lo), np.where(timed, np.maximum(hi, t), hi)
    span = grp.span[tab]
    keep &= ~((span >= 0) & (hi != NO_TS) & ((hi - lo).astype(np.uint64) > span.astype(np.uint64)))
    for o in range(2):  # order pairs of one vertex pair: between its two arcs
        w = words[:, TT_ORDERS + o]
        has = words[:, 1] > o
        a, b = per_edge[np.arange(len(tab)), w & 0xFF & 1], per_edge[np.arange(len(tab)), (w >> 8) & 0xFF & 1]
        keep &= ~(has & (a != NO_TS) & (b != NO_TS) & ~(a < b))
    return keep, np.stack([np.where(hi == NO_TS, NO_TS, lo), hi], 1)
