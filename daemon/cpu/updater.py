"""The compiled engine's graph updater: MultiVersionGraph.apply as one numba call per batch.

Same rules and same arena layout as mvg.py (whose numpy apply is the fallback), less e_key: per
touched vertex, the deletions before its first insertion of the batch set dt in place;
from that insertion on, the live entries of its newest version and the batch's later ops
on it are merged, in (neighbour label, neighbour, ct) order, straight into a new version
at the end of the arena: an insertion adds an entry, a deletion closes the open one. The
numpy version pays tens of array calls per batch whatever its size; here a batch is one
kernel pass over the touched versions, with no temporary copy or sort per vertex. The merge
walks the old version group by group ([v_gs, v_ge)), so no entry's label is looked up; the
cost left is mostly memory: the old versions' entries are scattered over the arena.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from csmd.cpu.arena import edge_labels, find_entry, graph_view, group_range, hot
from csmd.cpu.mvg import INF, MultiVersionGraph


class Arena(NamedTuple):
    """The arena's arrays, with their spare room (mvg.py names them; no e_key: compiled reads
    search a group's neighbours directly)."""

    labels: np.ndarray
    cur: np.ndarray
    e_nbr: np.ndarray
    e_el: np.ndarray
    e_ct: np.ndarray
    e_dt: np.ndarray
    e_ts: np.ndarray  # under event time (else empty): the ts of the arc to the neighbour
    e_tsin: np.ndarray  # and of the arc back
    g_key: np.ndarray
    g_start: np.ndarray
    g_end: np.ndarray
    v_vertex: np.ndarray
    v_ct_min: np.ndarray
    v_prev: np.ndarray
    v_es: np.ndarray
    v_ee: np.ndarray
    v_gs: np.ndarray
    v_ge: np.ndarray
    v_live: np.ndarray


_NONE = np.int64(1) << 62  # a label or neighbour beyond every real one
_UNTIMED = np.zeros(0, np.int64)  # e_ts and e_tsin without event time
_NO_OPS_TS = np.zeros((0, 2), np.int64)
COUNTING_SORT = 8  # a batch's ops are put in endpoint order by counting while the graph has at most
                   # this many vertices per op endpoint (the counts cost one pass over the vertices):
                   # a mergesort of the endpoints was 40% of the apply of a human batch of 16384


@njit(cache=True, nogil=True)
def _by_vertex(labels, a, b):
    """The batch's ops once per endpoint (op i as 2i from a, 2i + 1 from b), ordered by (endpoint,
    neighbour label, neighbour) and, stably, by time within each; and the neighbour of each."""
    m = 2 * len(a)
    own = np.empty(m, np.int64)
    nbr = np.empty(m, np.int64)
    for i in range(len(a)):
        own[2 * i], nbr[2 * i], own[2 * i + 1], nbr[2 * i + 1] = a[i], b[i], b[i], a[i]
    key = (labels[nbr].astype(np.int64) << 32) | nbr
    if len(labels) <= COUNTING_SORT * m:  # by endpoint in O(m + |V|), in time order within each
        at = np.zeros(len(labels) + 1, np.int64)
        for x in range(m):
            at[own[x] + 1] += 1
        for u in range(len(labels)):
            at[u + 1] += at[u]
        order = np.empty(m, np.int64)
        for x in range(m):
            order[at[own[x]]] = x
            at[own[x]] += 1
    else:  # a small batch on a big graph
        order = np.argsort(own, kind="mergesort")
    lo = 0
    for x in range(1, m + 1):  # each endpoint's run by key, stably
        if x < m and own[order[x]] == own[order[lo]]:
            continue
        if x - lo > 16:
            run = order[lo:x].copy()
            order[lo:x] = run[np.argsort(key[run], kind="mergesort")]
        else:  # a few ops (the rule): insertion
            for y in range(lo + 1, x):
                o = order[y]
                while y > lo and key[order[y - 1]] > key[o]:
                    order[y] = order[y - 1]
                    y -= 1
                order[y] = o
        lo = x
    return order, own, nbr, key


@hot
def _copy(ar, i, e, dt):
    """Entry i to position e, closed at dt."""
    ar.e_nbr[e], ar.e_el[e], ar.e_ct[e], ar.e_dt[e] = ar.e_nbr[i], ar.e_el[i], ar.e_ct[i], dt
    if ar.e_ts.shape[0]:
        ar.e_ts[e], ar.e_tsin[e] = ar.e_ts[i], ar.e_tsin[i]


@hot  # without reference counting: a call that passes the arena's 19 arrays counted each
      # (in and out), 10x the merge's own work (human, batch 64: 42 ms -> 4 ms for the stream)
def _version(ar, old, v, e, g, first, order, nbr, key, seq, label, label_b, ts, x, xe):
    """Write a vertex's new version v from entry e and group g: the live entries of its old
    version merged, label group by label group, with the ops order[x:xe] at or after `first`
    (sorted by key = neighbour label << 32 | neighbour, then time; label_b: the op's label as
    its b sees it; ts: under event time its (a -> b, b -> a) ts). Returns (e, g)."""
    gi, ge = (ar.v_gs[old], ar.v_ge[old]) if old >= 0 else (0, 0)  # the old version's groups
    while True:
        while x < xe and seq[order[x] >> 1] < first:
            x += 1  # applied in place
        olab = ar.g_key[gi] & 0x7FFFFFFF if gi < ge else _NONE
        xlab = key[order[x]] >> 32 if x < xe else _NONE
        lab = min(olab, xlab)
        if lab == _NONE:
            return e, g
        i, t = 0, 0
        if olab == lab:
            i, t = ar.g_start[gi], ar.g_end[gi]
            gi += 1
        gs = e
        while True:  # the group: old entries [i, t) and the ops on neighbours with this label
            while x < xe and seq[order[x] >> 1] < first:
                x += 1
            w = nbr[order[x]] if x < xe and key[order[x]] >> 32 == lab else _NONE
            while i < t and ar.e_nbr[i] < w:  # old entries before the op's neighbour: copied if live
                if ar.e_dt[i] == INF:
                    _copy(ar, i, e, INF)
                    e += 1
                i += 1
            if w == _NONE:
                break
            live = -1
            while i < t and ar.e_nbr[i] == w:  # that neighbour's entries: the live one is the last
                if ar.e_dt[i] == INF:
                    live = i
                i += 1
            op = order[x] >> 1
            if live >= 0:  # the live entry, closed by the op (a deletion)
                _copy(ar, live, e, seq[op])
                x += 1
            else:  # an insertion, closed by the next op if that is on the same neighbour
                closed = x + 1 < xe and key[order[x + 1]] == key[order[x]]
                ar.e_nbr[e], ar.e_el[e], ar.e_ct[e] = w, label_b[op] if order[x] & 1 else label[op], seq[op]
                ar.e_dt[e] = seq[order[x + 1] >> 1] if closed else INF
                if ar.e_ts.shape[0]:  # from b (order[x] odd) the arc to the neighbour is b -> a
                    ar.e_ts[e], ar.e_tsin[e] = ts[op, order[x] & 1], ts[op, 1 - (order[x] & 1)]
                x += 2 if closed else 1
            e += 1
        if e > gs:
            ar.g_key[g], ar.g_start[g], ar.g_end[g] = (np.int64(v) << 31) | lab, gs, e
            g += 1


@njit(cache=True, nogil=True)
def _apply(ar, used, seq, a, b, label, label_b, sign, ts):
    """Apply a batch of edge ops (in time order, each valid where it stands) to the arena, whose
    first used[0] entries, used[1] groups and used[2] versions are in use (used is advanced).
    Returns (done, ok, entries, groups, versions, replaced versions, the last replaced_at):
    done is False, with nothing changed, when the arrays lack room for that many more entries,
    groups and versions; ok is False when a deletion finds no live entry."""
    order, own, nbr, key = _by_vertex(ar.labels, a, b)
    m = len(order)
    starts = [0]  # runs of one endpoint in `order`
    for x in range(1, m):
        if own[order[x]] != own[order[x - 1]]:
            starts.append(x)
    starts.append(m)
    runs = len(starts) - 1
    first = np.full(runs, INF, np.int64)  # each run's first insertion
    n_e, n_g, n_v = 0, 0, 0
    for r in range(runs):
        for x in range(starts[r], starts[r + 1]):
            i = order[x] >> 1
            if sign[i] > 0:
                first[r] = min(first[r], seq[i])
        if first[r] < INF:
            old = ar.cur[own[order[starts[r]]]]
            n_e += starts[r + 1] - starts[r]
            n_g += starts[r + 1] - starts[r]
            if old >= 0:
                n_e += ar.v_ee[old] - ar.v_es[old]
                n_g += ar.v_ge[old] - ar.v_gs[old]
            n_v += 1
    none = np.zeros(0, np.int64)
    if used[0] + n_e > len(ar.e_nbr) or used[1] + n_g > len(ar.g_key) or used[2] + n_v > len(ar.v_vertex):
        return False, True, n_e, n_g, n_v, none, 0
    for r in range(runs):  # the deletions before the first insertion, in place
        for x in range(starts[r], starts[r + 1]):
            i = order[x] >> 1
            if seq[i] < first[r]:
                u, w = own[order[x]], nbr[order[x]]
                s, e = group_range(ar.cur, ar.v_ct_min, ar.v_prev, ar.v_gs, ar.v_ge, ar.g_key, ar.g_start, ar.g_end, u,
                                   ar.labels[w], INF - 1)
                j = find_entry(ar.e_nbr, ar.e_ct, ar.e_dt, s, e, w, INF - 1)  # the live entry: dt == INF
                if j < 0:
                    return True, False, 0, 0, 0, none, 0
                ar.e_dt[j] = seq[i]
    replaced = np.empty(n_v, np.int64)
    n_old, last_at = 0, np.int64(-1)
    e, g, v = used[0], used[1], used[2]
    for r in range(runs):
        if first[r] == INF:
            continue
        u = own[order[starts[r]]]
        old = ar.cur[u]
        es, gs = e, g
        e, g = _version(ar, old, v, e, g, first[r], order, nbr, key, seq, label, label_b, ts, starts[r],
                        starts[r + 1])
        ar.v_vertex[v], ar.v_ct_min[v], ar.v_prev[v], ar.v_es[v], ar.v_ee[v] = u, first[r], old, es, e
        ar.v_gs[v], ar.v_ge[v] = gs, g
        ar.v_live[v] = True
        ar.cur[u] = v
        v += 1
        if old >= 0:
            replaced[n_old] = old
            n_old += 1
            last_at = max(last_at, first[r])
    used[0], used[1], used[2] = e, g, v
    return True, True, 0, 0, 0, replaced[:n_old], last_at


@njit(cache=True, nogil=True)
def _compact(ar, used, new_id):
    """Move the live versions, their entries and their groups down over the freed ones, in
    place: all three lie in version order, so every move goes to a lower position. Version v
    becomes new_id[v] (-1: freed); a link to a freed version becomes -1 (no read follows it:
    the GC freed it). Advances used to what is kept."""
    e, g, k = 0, 0, 0
    for v in range(used[2]):
        if not ar.v_live[v]:
            new_id[v] = -1
            continue
        new_id[v] = k
        s, t = ar.v_es[v], ar.v_ee[v]
        if e < s:
            for j in range(s, t):
                ar.e_nbr[e + j - s], ar.e_el[e + j - s], ar.e_ct[e + j - s], ar.e_dt[e + j - s] = (
                    ar.e_nbr[j], ar.e_el[j], ar.e_ct[j], ar.e_dt[j])
                if ar.e_ts.shape[0]:
                    ar.e_ts[e + j - s], ar.e_tsin[e + j - s] = ar.e_ts[j], ar.e_tsin[j]
        gs, gt = ar.v_gs[v], ar.v_ge[v]
        for x in range(gs, gt):
            ar.g_key[g + x - gs] = (k << 31) | (ar.g_key[x] & 0x7FFFFFFF)
            ar.g_start[g + x - gs], ar.g_end[g + x - gs] = ar.g_start[x] - s + e, ar.g_end[x] - s + e
        prev = ar.v_prev[v]
        ar.v_vertex[k], ar.v_ct_min[k], ar.v_prev[k] = ar.v_vertex[v], ar.v_ct_min[v], new_id[prev] if prev >= 0 else -1
        ar.v_es[k], ar.v_ee[k], ar.v_gs[k], ar.v_ge[k], ar.v_live[k] = e, e + t - s, g, g + gt - gs, True
        e, g, k = e + t - s, g + gt - gs, k + 1
    used[0], used[1], used[2] = e, g, k


@njit(cache=True, nogil=True)
def _free(v_live, v_es, v_ee, versions):
    """Mark the versions freed (each once); returns how many entries they held."""
    freed = 0
    for v in versions:
        if v_live[v]:
            v_live[v] = False
            freed += v_ee[v] - v_es[v]
    return freed


class CompiledGraph(MultiVersionGraph):
    """The multi-version graph with its batch apply, its compaction and its edge reads compiled
    (same results). Its reads search a group's neighbours directly, so it keeps no e_key.

    apply returns one (token, replaced_at) pair per batch (MultiVersionGraph._token), as the GPU
    engine does."""

    keyed = False

    _ar: Arena | None = None

    def _arena(self) -> Arena:
        """The arrays as the kernels take them, kept until a buffer is reallocated (add_vertices,
        apply's growth): building the tuple costs more than a small batch's kernel call."""
        if self._ar is None:
            entries = [buf.a for buf in self._entry_bufs]
            if not self.timed:
                entries += [_UNTIMED, _UNTIMED]
            self._ar = Arena(self.labels.a, self.cur.a, *entries, *(buf.a for buf in self._group_bufs + self._versions))
        return self._ar

    def add_vertices(self, labels: np.ndarray) -> None:
        super().add_vertices(labels)
        self._ar = None

    @property
    def _entry_bufs(self):
        timed = (self.e_ts, self.e_tsin) if self.timed else ()
        return (self.e_nbr, self.e_el, self.e_ct, self.e_dt) + timed

    @property
    def _group_bufs(self):
        return self.g_key, self.g_start, self.g_end

    @property
    def _versions(self):
        return self.v_vertex, self.v_ct_min, self.v_prev, self.v_es, self.v_ee, self.v_gs, self.v_ge, self.v_live

    def _used(self) -> np.ndarray:
        return np.array([self.e_nbr.n, self.g_key.n, self.v_vertex.n], np.int64)

    def _set_used(self, used: np.ndarray) -> None:
        entries, groups, versions = used.tolist()
        for buf in self._entry_bufs:
            buf.n = entries
        for buf in self._group_bufs:
            buf.n = groups
        for buf in self._versions:
            buf.n = versions

    def apply(self, seq, a, b, label, sign, ts=None):
        if not len(seq):
            return []
        # contiguous always: one compiled variant, the one the start-up warm-up loads (a general
        # batch's columns are strided, a numpy-sequenced one's are not)
        ops = [np.ascontiguousarray(x, np.int64) for x in (seq, a, b, label, self.label_seen_by_b(label), sign)]
        ops.append(np.ascontiguousarray(ts, np.int64) if self.timed else _NO_OPS_TS)
        used = self._used()
        while True:
            done, ok, n_e, n_g, n_v, old, at = _apply(self._arena(), used, *ops)
            if done:
                break
            self._ar = None
            for buf in self._entry_bufs:
                buf.reserve(n_e)
            for buf in self._group_bufs:
                buf.reserve(n_g)
            for buf in self._versions:
                buf.reserve(n_v)
        if not ok:  # the sequencer only passes deletions of live edges
            raise RuntimeError("multi-version graph: deleting an edge that is not live")
        self._set_used(used)
        return self._token(old, at)

    def _free(self, versions: np.ndarray) -> int:
        return int(_free(self.v_live.a, self.v_es.a, self.v_ee.a, versions))

    def edge_label_between(self, a: np.ndarray, b: np.ndarray, ts: np.ndarray) -> np.ndarray:
        # contiguous: one compiled variant (a strided slice, as the warm-up's, made another, compiled
        # again in a daemon's first record: 0.2 s with no cache)
        c = np.ascontiguousarray
        return edge_labels(graph_view(self), c(a, np.int64), c(b, np.int64), c(ts, np.int64))

    def compact(self) -> None:
        used = self._used()
        new_id = np.empty(used[2], np.int64)
        _compact(self._arena(), used, new_id)
        self._set_used(used)
        self._renumbered(new_id)
        self.freed_entries = 0
        self.compactions += 1
