"""The multi-version graph (MVG) of the continuous pipeline (GUIDE section 2).

Each vertex owns a chain of versions of its neighbor array (newest first, linked
by `prev`). An entry carries its lifetime (ct, dt]: it is visible to a read at
timestamp T iff ct < T <= dt. A version carries (ct_min, dt_max]: the
timestamps it serves. A read at T takes the newest version with ct_min < T.

A batch is applied per vertex: the deletions before the vertex's first insertion
set dt in place (readers at earlier timestamps still see the entry); the rest go
into a new version (copy of the entries alive after that insertion, merged with
the new ones, sorted). Versions are replaced, never changed in a way older
readers can observe, so the executor may read at timestamp T while later
batches are applied.

Storage is one arena, like the GPU's memory pool: entries (neighbor, edge label,
ct, dt) of every version laid out version after version, each version's entries
sorted by (neighbor label, neighbor). `e_key = group << 31 | neighbor` and
`g_key = version << 31 | label` are then globally sorted, so "neighbors of v with
label l at T" and "edge {a, b} at T" are vectorized searchsorted calls. Freed
versions leave holes that a compaction removes once they outweigh live data.
"""

from __future__ import annotations

import numpy as np

from .graph import Graph, scalar

INF = np.iinfo(np.int64).max
SHIFT = np.int64(31)


def _runs(keys: np.ndarray):
    """Start and end of each run of equal values in a sorted array."""
    if not len(keys):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    return starts, np.r_[starts[1:], len(keys)].astype(np.int64)


class _Buf:
    """A growable array: `a[:n]` is the content; growth doubles and copies."""

    def __init__(self, dtype, init=()):
        self.a = np.array(init, dtype=dtype)
        self.n = len(self.a)

    def extend(self, values) -> int:
        values = np.asarray(values, dtype=self.a.dtype)
        start, need = self.n, self.n + len(values)
        if need > len(self.a):
            grown = np.zeros(max(need, 2 * len(self.a), 16), self.a.dtype)
            grown[: self.n] = self.a[: self.n]
            self.a = grown
        self.a[start:need] = values
        self.n = need
        return start

    def view(self):
        return self.a[: self.n]


class MultiVersionGraph:
    """Vertices, their labels and external ids, and the versioned adjacency."""

    def __init__(self, g: Graph):
        n = g.n
        self.labels = _Buf(np.int32, g.labels)
        self.ext_ids: list = [scalar(x) for x in g.ext_ids]
        self.index: dict = {x: i for i, x in enumerate(self.ext_ids)}
        self.cur = _Buf(np.int64, np.arange(n))  # newest version of each vertex, -1: none
        # version table
        self.v_vertex = _Buf(np.int64, np.arange(n))
        self.v_ct_min = _Buf(np.int64, np.full(n, -1))
        self.v_dt_max = _Buf(np.int64, np.full(n, INF))
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
        group_of = np.repeat(np.arange(len(starts)), ends - starts)
        self.e_nbr = _Buf(np.int32, nbrs)
        self.e_el = _Buf(np.int32, els)
        self.e_ct = _Buf(np.int64, np.full(len(nbrs), -1))
        self.e_dt = _Buf(np.int64, np.full(len(nbrs), INF))
        self.e_key = _Buf(np.int64, (group_of.astype(np.int64) << SHIFT) | nbrs)
        self.freed_entries = 0
        self.compactions = 0

    # ---- vertices -------------------------------------------------------------------------
    @property
    def n(self) -> int:
        return self.labels.n

    def add_vertex(self, ext, label: int) -> int:
        v = self.labels.n
        self.labels.extend([label])
        self.cur.extend([-1])
        self.ext_ids.append(ext)
        self.index[ext] = v
        return v

    def retire_vertex(self, v: int) -> None:
        """Forget the external id of a deleted vertex: a later record naming it creates a new vertex."""
        del self.index[self.ext_ids[v]]

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
        start, end = self.ranges(a, self.labels.a[b], ts) if len(a) else (a, a)
        return self._find(start, end, b, ts)

    def _find(self, start, end, b, ts):
        out = np.full(len(b), -1, np.int32)
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
            out[rows[vis]] = self.e_el.a[pos[vis]]
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

    # ---- writes (the graph updater) ------------------------------------------------------------
    def apply(self, ops: dict[int, list[tuple[int, int, int, int]]]):
        """Apply one batch. ops[v] lists v's edge ops in order: (ts, +1/-1, neighbor, edge label).

        Returns the replaced versions as (version, replaced_at) for the GC graph.
        """
        replaced = []
        for v, vops in ops.items():
            first_ins = next((i for i, op in enumerate(vops) if op[1] > 0), len(vops))
            old = int(self.cur.a[v])
            for ts, _, nbr, _ in vops[:first_ins]:
                self._delete_in_place(old, nbr, ts)
            if first_ins < len(vops):
                new = self._new_version(v, old, vops[first_ins:])
                if old >= 0:
                    replaced.append((old, vops[first_ins][0]))
                self.cur.a[v] = new
        return replaced

    def _delete_in_place(self, vid: int, nbr: int, ts: int) -> None:
        s, e = self.v_es.a[vid], self.v_ee.a[vid]
        hit = np.flatnonzero((self.e_nbr.a[s:e] == nbr) & (self.e_dt.a[s:e] == INF))
        self.e_dt.a[s + hit[0]] = ts  # the updater checked the edge exists

    def _new_version(self, v: int, old: int, vops) -> int:
        ts0 = vops[0][0]
        if old >= 0:
            s, e = self.v_es.a[old], self.v_ee.a[old]
            keep = self.e_dt.a[s:e] > ts0  # entries dead for every T > ts0 are not copied
            nbr = list(self.e_nbr.a[s:e][keep])
            el = list(self.e_el.a[s:e][keep])
            ct = list(self.e_ct.a[s:e][keep])
            dt = list(self.e_dt.a[s:e][keep])
            self.v_dt_max.a[old] = ts0
        else:
            nbr, el, ct, dt = [], [], [], []
        alive = {int(x): i for i, (x, d) in enumerate(zip(nbr, dt)) if d == INF}
        for ts, sign, x, lab in vops:
            if sign > 0:
                alive[x] = len(nbr)
                nbr.append(x), el.append(lab), ct.append(ts), dt.append(INF)
            else:
                dt[alive.pop(x)] = ts
        nbr = np.array(nbr, np.int32)
        lab_of = self.labels.a[nbr]
        order = np.lexsort((np.array(ct, np.int64), nbr, lab_of))
        nbr, lab_of = nbr[order], lab_of[order]
        vid = self.v_vertex.n
        starts, ends = _runs(lab_of)
        base = self.e_nbr.n
        g0 = self.g_key.extend((np.int64(vid) << SHIFT) | lab_of[starts].astype(np.int64))
        self.g_start.extend(base + starts)
        self.g_end.extend(base + ends)
        group_of = g0 + np.repeat(np.arange(len(starts)), ends - starts)
        self.e_nbr.extend(nbr)
        self.e_el.extend(np.array(el, np.int32)[order])
        self.e_ct.extend(np.array(ct, np.int64)[order])
        self.e_dt.extend(np.array(dt, np.int64)[order])
        self.e_key.extend((group_of.astype(np.int64) << SHIFT) | nbr)
        self.v_vertex.extend([v])
        self.v_ct_min.extend([ts0])
        self.v_dt_max.extend([INF])
        self.v_prev.extend([old])
        self.v_es.extend([base])
        self.v_ee.extend([base + len(nbr)])
        self.v_live.extend([True])
        return vid

    # ---- garbage collection ------------------------------------------------------------------------
    def free(self, versions) -> None:
        """Release versions no pending read can reach (the GC decided that)."""
        for vid in versions:
            if self.v_live.a[vid]:
                self.v_live.a[vid] = False
                self.freed_entries += int(self.v_ee.a[vid] - self.v_es.a[vid])
        if self.freed_entries > max(self.e_nbr.n // 2, 1 << 16):
            self._compact()

    @property
    def live_versions(self) -> int:
        return int(self.v_live.view().sum())

    def _compact(self) -> None:
        """Drop freed versions' entries; version ids stay, group ids and entry offsets move."""
        live = np.flatnonzero(self.v_live.view())
        es, ee = self.v_es.a[live], self.v_ee.a[live]
        take = np.concatenate([np.arange(s, e) for s, e in zip(es, ee)]) if len(live) else np.zeros(0, np.int64)
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
        self.e_key = _Buf(np.int64, (group_of.astype(np.int64) << SHIFT) | nbr)
        self.g_key = _Buf(np.int64, gkey[gkeep])
        self.g_start = _Buf(np.int64, g_start)
        self.g_end = _Buf(np.int64, g_end)
        self.v_es.a[live] = new_es
        self.v_ee.a[live] = new_es + (ee - es)
        self.freed_entries = 0
        self.compactions += 1
