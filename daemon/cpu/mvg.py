"""The multi-version graph (MVG) of the continuous pipeline (docs/design.md section 3).

Each vertex owns a chain of versions of its neighbor array (newest first, linked
by `prev`). An entry carries its lifetime (ct, dt]: it is visible to a read at
timestamp T iff ct < T <= dt. A version serves the
timestamps after its ct_min (until the next version's): a read at T takes the
newest version with ct_min < T.

A batch is applied per vertex: the deletions before the vertex's first insertion
set dt in place (readers at earlier timestamps still see the entry); the rest go
into a new version (copy of the entries alive after that insertion, merged with
the new ones, sorted). Versions are replaced, never changed in a way older
readers can observe, so the executor may read at timestamp T while later
batches are applied.

Storage is one arena, like the GPU's memory pool: entries (neighbor, edge label,
ct, dt; under event time also the ts of the arc to the neighbour and of the arc back,
model/time_constraints.py) of every version laid out version after version, each version's entries
sorted by (neighbor label, neighbor). `e_key = group << 31 | neighbor` and
`g_key = version << 31 | label` are then globally sorted, so "neighbors of v with
label l at T" and "edge {a, b} at T" are vectorized searchsorted calls. A version's
groups are contiguous, [v_gs, v_ge): compiled reads search those few, not all of g_key
(a search over the whole table costs a cache miss a step, many times per update). Freed
versions leave holes that a compaction removes once they outweigh live data; it renumbers the
live versions too (in arena order, so both keys stay sorted), else the version table would grow
by every version ever made (a daemon's graph, every touched vertex of every batch: gigabytes a
day). Version ids are therefore only stable between compactions: apply's tokens (one array of
replaced versions per batch) are kept here until freed and renumbered with the rest.
"""

from __future__ import annotations

import numpy as np

from csmd.model.direction import flip
from csmd.model.graph import Graph, gather_ranges
from csmd.model.time_constraints import NO_TS

INF = np.iinfo(np.int64).max
SHIFT = np.int64(31)
ROOM = 3


def _runs(keys: np.ndarray):
    """Start and end of each run of equal values in a sorted array."""
    if not len(keys):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return starts, np.r_[starts[1:], len(keys)].astype(np.int64)


class _Buf:
    """A growable array: `a[:n]` is the content; growth doubles and copies. It starts with
    ROOM times its content's room, so the versions of the first batches, and the garbage
    that a compaction waits for (as much as the live entries), fit without a copy; the room
    is written once here, so that the updater does not pay the page faults of fresh memory
    (a few microseconds a page) batch by batch."""

    def __init__(self, dtype, init=()):
        init = np.asarray(init, dtype=dtype)
        self.n = len(init)
        self.a = np.empty(max(16, ROOM * self.n), dtype)
        self.a[: self.n] = init
        self.a[self.n:] = 0  # the page faults, now

    def extend(self, values) -> int:
        values = np.asarray(values, dtype=self.a.dtype)
        start = self.n
        self.reserve(len(values))[start:start + len(values)] = values
        self.n += len(values)
        return start

    def reserve(self, k: int) -> np.ndarray:
        """The array, with room for k more values after `n` (the caller writes them, then moves n)."""
        need = self.n + k
        if need > len(self.a):
            grown = np.empty(max(need, 2 * len(self.a), 16), self.a.dtype)  # only a[:n] is read
            grown[: self.n] = self.a[: self.n]
            self.a = grown
        return self.a

    def view(self):
        return self.a[: self.n]


def entry_ts(g: Graph, owner: np.ndarray, nbr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The event times g.edge_ts gives the entries (owner, nbr) (internal ids): of the arc owner ->
    nbr and of the arc back (undirected: the edge's, twice); NO_TS where it gives none. An edge given
    twice keeps its first ts, as the clock does (pipeline/event_time.py)."""
    none = np.full(len(nbr), NO_TS, np.int64)
    if g.edge_ts is None or not len(nbr) or not len(g.edge_ts[2]):
        return none, none.copy()
    u, v, ts = g.edge_ts
    ids = np.asarray(g.ext_ids)
    by_id = np.argsort(ids, kind="stable")
    iu = by_id[np.minimum(np.searchsorted(ids[by_id], u), len(ids) - 1)]
    iv = by_id[np.minimum(np.searchsorted(ids[by_id], v), len(ids) - 1)]
    n = np.int64(max(g.n, 1))
    if g.directed:
        keys = iu.astype(np.int64) * n + iv
    else:
        keys = np.minimum(iu, iv).astype(np.int64) * n + np.maximum(iu, iv)
    keys, first = np.unique(keys, return_index=True)
    ts = ts[first]

    def look(a, b):
        k = (a.astype(np.int64) * n + b) if g.directed else np.minimum(a, b).astype(np.int64) * n + np.maximum(a, b)
        at = np.minimum(np.searchsorted(keys, k), len(keys) - 1)
        return np.where(keys[at] == k, ts[at], NO_TS)

    out = look(owner, nbr.astype(np.int64))
    return out, look(nbr.astype(np.int64), owner) if g.directed else out.copy()


class MultiVersionGraph:
    """Vertex labels and the versioned adjacency (external ids live in the sequencer's vertex table)."""

    keyed = True  # keeps e_key (the numpy reads' searchsorted needs it)

    def __init__(self, g: Graph, timed: bool = False):
        """timed: entries keep their arcs' event times (e_ts, e_tsin), the initial ones g.edge_ts's."""
        n = g.n
        self.timed = timed
        self.directed = g.directed  # entry labels are the codes of a pair's arcs (model/direction.py)
        self.labels = _Buf(np.int32, g.labels)
        self.cur = _Buf(np.int64, np.arange(n))  # newest version of each vertex, -1: none
        # version table
        self.v_vertex = _Buf(np.int64, np.arange(n))
        self.v_ct_min = _Buf(np.int64, np.full(n, -1))
        self.v_prev = _Buf(np.int64, np.full(n, -1))
        self.v_es = _Buf(np.int64, g.indptr[:-1])
        self.v_ee = _Buf(np.int64, g.indptr[1:])
        self.v_live = _Buf(bool, np.ones(n, bool))
        # entries: G0's label-grouped adjacency, every entry alive since before time 0
        gk, nbrs, els = g.grouped
        nl = max(g.num_labels, 1)
        owner = gk // nl
        glabel = gk % nl
        key = (owner << SHIFT) | glabel
        starts, ends = _runs(key)
        self.g_key = _Buf(np.int64, key[starts])
        self.g_start = _Buf(np.int64, starts)
        self.g_end = _Buf(np.int64, ends)
        self.v_gs = _Buf(np.int64, np.searchsorted(owner[starts], np.arange(n), "left"))
        self.v_ge = _Buf(np.int64, np.searchsorted(owner[starts], np.arange(n), "right"))
        self.e_nbr = _Buf(np.int32, nbrs)
        self.e_el = _Buf(np.int32, els)
        self.e_ct = _Buf(np.int64, np.full(len(nbrs), -1))
        self.e_dt = _Buf(np.int64, np.full(len(nbrs), INF))
        ts_out, ts_in = entry_ts(g, owner, nbrs) if timed else (np.zeros(0, np.int64),) * 2
        self.e_ts = _Buf(np.int64, ts_out)
        self.e_tsin = _Buf(np.int64, ts_in)
        if self.keyed:
            group_of = np.repeat(np.arange(len(starts)), ends - starts)
            self.e_key = _Buf(np.int64, (group_of.astype(np.int64) << SHIFT) | nbrs)
        self.freed_entries = 0
        self.compactions = 0
        self._held: dict[int, np.ndarray] = {}  # id -> apply's tokens not freed yet

    # ---- vertices -------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return self.labels.n

    def add_vertices(self, labels: np.ndarray) -> None:
        """New vertices (ids n, n+1, ...): no version until an edge touches them."""
        self.labels.extend(labels)
        self.cur.extend(np.full(len(labels), -1))

    # ---- reads (vectorized; each row has its own timestamp) ---------------------------------
    def version_at(self, v: np.ndarray, ts: np.ndarray) -> np.ndarray:
        vid = self.cur.a[v]
        ct_min, prev = self.v_ct_min.a, self.v_prev.a
        while True:
            stale = np.flatnonzero(vid >= 0)
            stale = stale[ct_min[vid[stale]] >= ts[stale]]
            if not len(stale):
                return vid
            vid[stale] = prev[vid[stale]]

    def ranges(self, v: np.ndarray, label: int, ts: np.ndarray):
        """Entry range [start, end) of v's neighbors with `label`, in v's version at ts."""
        vid = self.version_at(v, ts)
        gkey = self.g_key.view()
        if not len(gkey):
            zero = np.zeros(len(v), np.int64)
            return zero, zero
        key = (vid << SHIFT) | label
        gi = np.minimum(np.searchsorted(gkey, key), len(gkey) - 1)
        ok = (vid >= 0) & (gkey[gi] == key)
        start = np.where(ok, self.g_start.a[gi], 0)
        end = np.where(ok, self.g_end.a[gi], 0)
        return start, end

    def edge_label_between(self, a: np.ndarray, b: np.ndarray, ts: np.ndarray) -> np.ndarray:
        """Label of the edge {a, b} visible at ts, -1 where there is none."""
        start, end = self.ranges(a, self.labels.a[b], ts)
        pos = self._find(start, end, b, ts)
        out = np.full(len(b), -1, np.int32)
        out[pos >= 0] = self.e_el.a[pos[pos >= 0]]
        return out

    def _find(self, start, end, b, ts):
        """Position of the entry for neighbor b inside [start, end) visible at ts, -1 if none."""
        out = np.full(len(b), -1, np.int64)
        rows = np.flatnonzero(end > start)
        if not len(rows):
            return out
        # the range's group is its first entry's; search the neighbor's key inside it
        ekey = self.e_key.view()
        key = ((ekey[start[rows]] >> SHIFT) << SHIFT) | b[rows]
        pos = np.searchsorted(ekey, key, "left")
        lim = np.searchsorted(ekey, key, "right")
        # usually one entry per neighbor; a pair deleted and re-inserted in one version has more
        while len(rows):
            has = pos < lim
            rows, pos, lim = rows[has], pos[has], lim[has]
            t = ts[rows]
            vis = (self.e_ct.a[pos] < t) & (t <= self.e_dt.a[pos])
            out[rows[vis]] = pos[vis]
            rows, pos, lim = rows[~vis], pos[~vis] + 1, lim[~vis]
        return out

    @property
    def lifetimes(self):
        return self.e_ct.a, self.e_dt.a

    @property
    def nbrs(self):
        return self.e_nbr.a

    @property
    def nels(self):
        return self.e_el.a

    # ---- the latest state (what the updater checks duplicates against) -----------------------
    def live_edge_label(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return self.edge_label_between(a, b, np.full(len(a), INF - 1, np.int64))

    def live_neighbors(self, v: int) -> np.ndarray:
        vid = int(self.cur.a[v])
        if vid < 0:
            return np.zeros(0, np.int32)
        s, e = self.v_es.a[vid], self.v_ee.a[vid]
        return self.e_nbr.a[s:e][self.e_dt.a[s:e] == INF]

    def live_edges(self):
        """(src, dst, label) of every edge alive now, src < dst, in internal ids."""
        vid = self.cur.view()
        has = np.flatnonzero(vid >= 0)
        es, ee = self.v_es.a[vid[has]], self.v_ee.a[vid[has]]
        pos = gather_ranges(es, ee - es)
        src = np.repeat(has, ee - es)
        alive = self.e_dt.a[pos] == INF
        src, dst, lab = src[alive], self.e_nbr.a[pos][alive].astype(np.int64), self.e_el.a[pos][alive]
        keep = src < dst
        return src[keep], dst[keep], lab[keep]

    # ---- writes (the graph updater) ------------------------------------------------------------
    def label_seen_by_b(self, label: np.ndarray) -> np.ndarray:
        """The labels of ops (a, b), as a sees them, as b sees them."""
        return flip(label) if self.directed else label

    def apply(self, seq, a, b, label, sign, event_ts=None):
        """Apply one batch of edge ops (arrays in update order, each op valid where it stands);
        event_ts: under event time, each op's (a -> b, b -> a) ts (UpdateBatch.storage_ts).

        Works on all touched vertices at once, as the GPU updater does: per vertex the
        deletions before its first insertion set dt in place; from that insertion on,
        its live entries are copied, merged with the inserted ones, the later deletions
        closed, and the whole sorted into a new version. A deletion and an insertion of one
        pair with one timestamp (a directed pair's code replaced) close the old entry first. Returns the batch's replaced versions
        for the GC graph: [] or one (token, replaced_at), the token an array of the versions
        (_token), replaced_at the latest of their replacements.
        """
        # each undirected op touches both endpoints; order by (vertex, time)
        own = np.concatenate([a, b]).astype(np.int64)
        nbr = np.concatenate([b, a]).astype(np.int32)
        lab = np.concatenate([label, self.label_seen_by_b(label)]).astype(np.int32)
        sgn = np.concatenate([sign, sign])
        if self.timed:  # the ts of the arc to the neighbour, and of the one back
            arc = np.concatenate([event_ts[:, 0], event_ts[:, 1]]).astype(np.int64)
            back = np.concatenate([event_ts[:, 1], event_ts[:, 0]]).astype(np.int64)
        ts = np.concatenate([seq, seq]).astype(np.int64)
        order = np.lexsort((ts, own))
        own, nbr, ts, lab, sgn = own[order], nbr[order], ts[order], lab[order], sgn[order]
        if self.timed:
            arc, back = arc[order], back[order]
        verts, first = np.unique(own, return_index=True)
        # the first insertion of each touched vertex (INF: none)
        ins_ts = np.where(sgn > 0, ts, INF)
        first_ins = np.minimum.reduceat(ins_ts, first) if len(first) else np.zeros(0, np.int64)
        split = np.repeat(first_ins, np.diff(np.r_[first, len(own)]))
        early = ts < split  # deletions before the first insertion: in place
        if early.any():
            pos = self._live_entry(own[early], nbr[early])
            self.e_dt.a[pos] = ts[early]
        grow = first_ins < INF
        if not grow.any():
            return []
        vs, ts0 = verts[grow], first_ins[grow]
        old = self.cur.a[vs]
        # live entries of the old versions (dt == INF: this batch's in-place deletions are excluded)
        has_old = old >= 0
        es = np.where(has_old, self.v_es.a[np.maximum(old, 0)], 0)
        ee = np.where(has_old, self.v_ee.a[np.maximum(old, 0)], 0)
        idx = gather_ranges(es, ee - es)
        c_owner = np.repeat(np.arange(len(vs)), ee - es)
        alive = self.e_dt.a[idx] == INF
        idx, c_owner = idx[alive], c_owner[alive]
        late = ~early
        slot = np.searchsorted(vs, own[late])  # which new version an op belongs to
        l_nbr, l_ts, l_lab, l_sgn = nbr[late], ts[late], lab[late], sgn[late]
        ins = l_sgn > 0
        if self.timed:
            n_ts = np.concatenate([self.e_ts.a[idx], arc[late][ins]])
            n_tsin = np.concatenate([self.e_tsin.a[idx], back[late][ins]])
        # new entries: copied ones, then inserted ones (ct = their timestamp)
        n_owner = np.concatenate([c_owner, slot[ins]])
        n_nbr = np.concatenate([self.e_nbr.a[idx], l_nbr[ins]])
        n_el = np.concatenate([self.e_el.a[idx], l_lab[ins]])
        n_ct = np.concatenate([self.e_ct.a[idx], l_ts[ins]])
        n_dt = np.full(len(n_nbr), INF, np.int64)
        dele = np.flatnonzero(~ins)
        if len(dele):
            # per (vertex, neighbor) ops alternate: a deletion closes the entry just before it in time
            ev_owner = np.concatenate([n_owner, slot[dele]])
            ev_nbr = np.concatenate([n_nbr, l_nbr[dele]])
            # (times doubled: a deletion at t comes before an insertion at t)
            ev_t = np.concatenate([np.where(np.arange(len(n_nbr)) < len(idx), -1, 2 * n_ct), 2 * l_ts[dele] - 1])
            ev_id = np.concatenate([np.arange(len(n_nbr)), -1 - np.arange(len(dele))])
            o = np.lexsort((ev_t, ev_nbr, ev_owner))
            is_del = ev_id[o] < 0
            closes = ev_id[o][np.flatnonzero(is_del) - 1]
            n_dt[closes] = l_ts[dele][-1 - ev_id[o][is_del]]
        lab_of = self.labels.a[n_nbr]
        o = np.lexsort((n_ct, n_nbr, lab_of, n_owner))
        n_owner, n_nbr, n_el, n_ct, n_dt, lab_of = n_owner[o], n_nbr[o], n_el[o], n_ct[o], n_dt[o], lab_of[o]
        if self.timed:
            self.e_ts.extend(n_ts[o])
            self.e_tsin.extend(n_tsin[o])
        vid0 = self.v_vertex.n
        vids = vid0 + np.arange(len(vs))
        counts = np.bincount(n_owner, minlength=len(vs))
        base = self.e_nbr.n
        v_es = base + np.r_[0, np.cumsum(counts)[:-1]]
        gkey = (vids[n_owner] << SHIFT) | lab_of.astype(np.int64)
        starts, ends = _runs(gkey)
        g0 = self.g_key.extend(gkey[starts])
        g_vid = gkey[starts] >> SHIFT
        self.v_gs.extend(g0 + np.searchsorted(g_vid, vids, "left"))
        self.v_ge.extend(g0 + np.searchsorted(g_vid, vids, "right"))
        self.g_start.extend(base + starts)
        self.g_end.extend(base + ends)
        group_of = g0 + np.repeat(np.arange(len(starts)), ends - starts)
        self.e_nbr.extend(n_nbr)
        self.e_el.extend(n_el)
        self.e_ct.extend(n_ct)
        self.e_dt.extend(n_dt)
        self.e_key.extend((group_of.astype(np.int64) << SHIFT) | n_nbr)
        self.v_vertex.extend(vs)
        self.v_ct_min.extend(ts0)
        self.v_prev.extend(old)
        self.v_es.extend(v_es)
        self.v_ee.extend(v_es + counts)
        self.v_live.extend(np.ones(len(vs), bool))
        self.cur.a[vs] = vids
        return self._token(old[has_old], ts0[has_old].max(initial=-1))

    def _live_entry(self, v: np.ndarray, nbr: np.ndarray) -> np.ndarray:
        """Positions of the live (dt == INF) entries v -> nbr in v's newest version."""
        t = np.full(len(v), INF - 1, np.int64)
        start, end = self.ranges(v, self.labels.a[nbr], t)
        pos = self._find(start, end, nbr, t)
        if (pos < 0).any():  # the sequencer only passes deletions of live edges
            raise RuntimeError("multi-version graph: deleting an edge that is not live")
        return pos

    # ---- garbage collection ------------------------------------------------------------------------
    def _token(self, replaced: np.ndarray, at) -> list:
        """apply's answer for versions replaced by `at` at the latest: one token, held (and renumbered by
        compactions) until freed. A version is released at most one batch later than its own
        replacement allows, and the GC and the release handle one item per batch."""
        if not len(replaced):
            return []
        token = np.ascontiguousarray(replaced, np.int64)
        self._held[id(token)] = token
        return [(token, int(at))]

    def free(self, tokens) -> bool:
        """Release apply's tokens whose versions no pending read can reach (the GC decided that);
        True when so many entries are free that `compact` is due (it moves entries and renumbers
        versions: no search may run meanwhile)."""
        for t in tokens:
            self._held.pop(id(t), None)
        versions = np.concatenate(tokens) if len(tokens) else np.zeros(0, np.int64)
        self.freed_entries += self._free(versions)
        return self.freed_entries > max(self.e_nbr.n // 2, 1 << 16)

    def _renumbered(self, new_id: np.ndarray) -> None:
        """After a compaction moved version v to new_id[v] (-1: freed): the newest versions and the
        tokens not freed yet follow (the version table's own columns moved with it)."""
        cur = self.cur.view()
        has = cur >= 0
        cur[has] = new_id[cur[has]]
        for token in self._held.values():
            token[:] = new_id[token]

    def _free(self, versions: np.ndarray) -> int:
        """Mark the versions freed (each once); returns how many entries they held."""
        vid = np.unique(versions)
        vid = vid[self.v_live.a[vid]]
        self.v_live.a[vid] = False
        return int((self.v_ee.a[vid] - self.v_es.a[vid]).sum())

    @property
    def live_versions(self) -> int:
        return int(self.v_live.view().sum())

    def compact(self) -> None:
        """Drop freed versions' entries and ids: live versions, groups and entries move down, in order."""
        live = np.flatnonzero(self.v_live.view())
        es, ee = self.v_es.a[live], self.v_ee.a[live]
        take = gather_ranges(es, ee - es)
        new_es = np.cumsum(np.r_[0, ee - es])[:-1]
        gkey = self.g_key.view()
        gvid = gkey >> SHIFT
        gkeep = np.flatnonzero(self.v_live.a[gvid])
        shift_of_vid = np.zeros(self.v_vertex.n, np.int64)
        shift_of_vid[live] = new_es - es
        g_start = self.g_start.a[gkeep] + shift_of_vid[gvid[gkeep]]
        g_end = self.g_end.a[gkeep] + shift_of_vid[gvid[gkeep]]
        nbr = self.e_nbr.a[take]
        group_of = np.repeat(np.arange(len(gkeep)), g_end - g_start)
        self.e_nbr = _Buf(np.int32, nbr)
        self.e_el = _Buf(np.int32, self.e_el.a[take])
        self.e_ct = _Buf(np.int64, self.e_ct.a[take])
        self.e_dt = _Buf(np.int64, self.e_dt.a[take])
        if self.timed:
            self.e_ts = _Buf(np.int64, self.e_ts.a[take])
            self.e_tsin = _Buf(np.int64, self.e_tsin.a[take])
        self.e_key = _Buf(np.int64, (group_of.astype(np.int64) << SHIFT) | nbr)
        self.g_start = _Buf(np.int64, g_start)
        self.g_end = _Buf(np.int64, g_end)
        new_id = np.full(self.v_vertex.n, -1, np.int64)
        new_id[live] = np.arange(len(live))
        self.g_key = _Buf(np.int64, (new_id[gvid[gkeep]] << SHIFT) | (gkey[gkeep] & ((1 << SHIFT) - 1)))
        prev = self.v_prev.a[live]
        columns = {self.v_vertex: self.v_vertex.a[live], self.v_ct_min: self.v_ct_min.a[live],
                   self.v_prev: np.where(prev >= 0, new_id[np.maximum(prev, 0)], -1), self.v_es: new_es,
                   self.v_ee: new_es + (ee - es), self.v_gs: np.searchsorted(gvid[gkeep], live, "left"),
                   self.v_ge: np.searchsorted(gvid[gkeep], live, "right"), self.v_live: np.ones(len(live), bool)}
        for buf, values in columns.items():
            buf.a[: len(live)] = values
            buf.n = len(live)
        self._renumbered(new_id)
        self.freed_entries = 0
        self.compactions += 1
