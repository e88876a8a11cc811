"""The compiled engine's graph updater: MultiVersionGraph.apply as one numba call per batch.

Same rules and same arena layout as mvg.py (whose numpy apply is the fallback): per
touched vertex, the deletions before its first insertion of the batch set dt in place;
from that insertion on, the live entries of its newest version and the batch's later ops
on it are merged, in (neighbour label, neighbour, ct) order, straight into a new version
at the end of the arena: an insertion adds an entry, a deletion closes the open one. The
numpy version pays tens of array calls per batch whatever its size; here a batch is one
kernel pass over the touched versions, with no temporary copy or sort per vertex.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from csmd.cpu.arena import find_entry, group_range, lower_bound
from csmd.cpu.mvg import INF, MultiVersionGraph


class Arena(NamedTuple):
    """The arena's arrays, with their spare room (mvg.py names them)."""

    labels: np.ndarray
    cur: np.ndarray
    e_nbr: np.ndarray
    e_el: np.ndarray
    e_ct: np.ndarray
    e_dt: np.ndarray
    e_key: np.ndarray
    g_key: np.ndarray
    g_start: np.ndarray
    g_end: np.ndarray
    v_vertex: np.ndarray
    v_ct_min: np.ndarray
    v_prev: np.ndarray
    v_es: np.ndarray
    v_ee: np.ndarray
    v_live: np.ndarray


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
    order = np.argsort(key, kind="mergesort")
    return order[np.argsort(own[order], kind="mergesort")], own, nbr, key


@njit(cache=True, nogil=True)
def _put(ar, e, g, v, glab, w, el, ct, dt, lab):
    """Write entry e of version v (neighbour w, whose label is lab), opening group g when the
    label differs from the open group's (glab; -1: none yet). Returns the groups used and the
    open group's label."""
    if lab != glab:
        if glab >= 0:
            ar.g_end[g - 1] = e
        ar.g_key[g] = (np.int64(v) << 31) | lab
        ar.g_start[g] = e
        g += 1
    ar.e_nbr[e], ar.e_el[e], ar.e_ct[e], ar.e_dt[e] = w, el, ct, dt
    ar.e_key[e] = (np.int64(g - 1) << 31) | w
    return g, lab


@njit(cache=True, nogil=True)
def _apply(ar, used, seq, a, b, label, sign):
    """Apply a batch of edge ops (in time order, each valid where it stands) to the arena, whose
    first used[0] entries, used[1] groups and used[2] versions are in use (used is advanced).
    Returns (done, ok, entries, groups, versions, replaced versions, replaced_at): done is False,
    with nothing changed, when the arrays lack room for that many more entries, groups and
    versions; ok is False when a deletion finds no live entry."""
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
                n_g += lower_bound(ar.g_key, 0, used[1], old + 1 << 31) - lower_bound(ar.g_key, 0, used[1], old << 31)
            n_v += 1
    none = np.zeros(0, np.int64)
    if used[0] + n_e > len(ar.e_nbr) or used[1] + n_g > len(ar.g_key) or used[2] + n_v > len(ar.v_vertex):
        return False, True, n_e, n_g, n_v, none, none
    for r in range(runs):  # the deletions before the first insertion, in place
        for x in range(starts[r], starts[r + 1]):
            i = order[x] >> 1
            if seq[i] < first[r]:
                u, w = own[order[x]], nbr[order[x]]
                s, e = group_range(ar.cur, ar.v_ct_min, ar.v_prev, ar.g_key[:used[1]], ar.g_start, ar.g_end, u,
                                   ar.labels[w], INF - 1)
                j = find_entry(ar.e_nbr, ar.e_ct, ar.e_dt, s, e, w, INF - 1)  # the live entry: dt == INF
                if j < 0:
                    return True, False, 0, 0, 0, none, none
                ar.e_dt[j] = seq[i]
    replaced = np.empty(n_v, np.int64)
    replaced_at = np.empty(n_v, np.int64)
    n_old = 0
    e, g, v = used[0], used[1], used[2]
    for r in range(runs):
        if first[r] == INF:
            continue
        u = own[order[starts[r]]]
        old = ar.cur[u]
        i, ie = (ar.v_es[old], ar.v_ee[old]) if old >= 0 else (0, 0)
        x, xe = starts[r], starts[r + 1]
        es, glab, okey = e, np.int64(-1), INF  # glab: the label of the version's last group
        while True:
            while x < xe and seq[order[x] >> 1] < first[r]:
                x += 1  # applied in place
            xkey = key[order[x]] if x < xe else INF
            while i < ie:  # the old version's live entries before the next op's neighbour: copied
                if ar.e_dt[i] != INF:
                    i += 1
                    continue
                w = ar.e_nbr[i]
                okey = (np.int64(ar.labels[w]) << 32) | w
                if okey >= xkey:
                    break
                g, glab = _put(ar, e, g, v, glab, w, ar.e_el[i], ar.e_ct[i], INF, okey >> 32)
                e += 1
                i += 1
            if x == xe:
                break
            op = order[x] >> 1
            if i < ie and okey == xkey:  # that neighbour's old entry, closed by the op
                g, glab = _put(ar, e, g, v, glab, ar.e_nbr[i], ar.e_el[i], ar.e_ct[i], seq[op], xkey >> 32)
                i += 1
                x += 1
            else:  # an insertion, closed by the next op if that is on the same neighbour
                closed = x + 1 < xe and key[order[x + 1]] == xkey
                g, glab = _put(ar, e, g, v, glab, nbr[order[x]], label[op], seq[op],
                               seq[order[x + 1] >> 1] if closed else INF, xkey >> 32)
                x += 2 if closed else 1
            e += 1
        if glab >= 0:
            ar.g_end[g - 1] = e
        ar.v_vertex[v], ar.v_ct_min[v], ar.v_prev[v], ar.v_es[v], ar.v_ee[v] = u, first[r], old, es, e
        ar.v_live[v] = True
        ar.cur[u] = v
        v += 1
        if old >= 0:
            replaced[n_old], replaced_at[n_old] = old, first[r]
            n_old += 1
    used[0], used[1], used[2] = e, g, v
    return True, True, 0, 0, 0, replaced[:n_old], replaced_at[:n_old]


@njit(cache=True, nogil=True)
def _compact(ar, used):
    """Move the live versions' entries down over the freed ones, in place: versions' entries lie
    in version order, so every move goes to a lower offset. Versions keep their ids, groups
    and entries move (e_key then names the group's new number). Advances used to what is kept."""
    e = 0
    shift = np.zeros(used[2], np.int64)
    for v in range(used[2]):
        if not ar.v_live[v]:
            continue
        s, t = ar.v_es[v], ar.v_ee[v]
        shift[v] = s - e
        for j in range(s, t):
            ar.e_nbr[e], ar.e_el[e], ar.e_ct[e], ar.e_dt[e] = ar.e_nbr[j], ar.e_el[j], ar.e_ct[j], ar.e_dt[j]
            e += 1
        ar.v_es[v], ar.v_ee[v] = s - shift[v], t - shift[v]
    g = 0
    for x in range(used[1]):
        v = ar.g_key[x] >> 31
        if not ar.v_live[v]:
            continue
        ar.g_key[g], ar.g_start[g], ar.g_end[g] = ar.g_key[x], ar.g_start[x] - shift[v], ar.g_end[x] - shift[v]
        for j in range(ar.g_start[g], ar.g_end[g]):
            ar.e_key[j] = (np.int64(g) << 31) | ar.e_nbr[j]
        g += 1
    used[0], used[1] = e, g


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
    """The multi-version graph with its batch apply and its compaction compiled (same results)."""

    def _arena(self) -> Arena:
        return Arena(self.labels.a, self.cur.a, *(buf.a for buf in self._entries + self._versions))

    @property
    def _entries(self):
        return self.e_nbr, self.e_el, self.e_ct, self.e_dt, self.e_key, self.g_key, self.g_start, self.g_end

    @property
    def _versions(self):
        return self.v_vertex, self.v_ct_min, self.v_prev, self.v_es, self.v_ee, self.v_live

    def _used(self) -> np.ndarray:
        return np.array([self.e_nbr.n, self.g_key.n, self.v_vertex.n], np.int64)

    def _set_used(self, used: np.ndarray) -> None:
        for buf in self._entries[:5]:
            buf.n = int(used[0])
        for buf in self._entries[5:]:
            buf.n = int(used[1])
        for buf in self._versions:
            buf.n = int(used[2])

    def apply(self, seq, a, b, label, sign):
        if not len(seq):
            return []
        ops = [np.asarray(x, np.int64) for x in (seq, a, b, label, sign)]
        used = self._used()
        while True:
            done, ok, n_e, n_g, n_v, old, at = _apply(self._arena(), used, *ops)
            if done:
                break
            for buf in self._entries[:5]:
                buf.reserve(n_e)
            for buf in self._entries[5:]:
                buf.reserve(n_g)
            for buf in self._versions:
                buf.reserve(n_v)
        if not ok:  # the sequencer only passes deletions of live edges
            raise RuntimeError("multi-version graph: deleting an edge that is not live")
        self._set_used(used)
        return list(zip(old.tolist(), at.tolist()))

    def _free(self, versions) -> int:
        return int(_free(self.v_live.a, self.v_es.a, self.v_ee.a, np.asarray(versions, np.int64)))

    def _compact(self) -> None:
        used = self._used()
        _compact(self._arena(), used)
        self._set_used(used)
        self.freed_entries = 0
        self.compactions += 1
