"""The compiled engine's graph updater: MultiVersionGraph.apply with its per-vertex work in numba.

Same rules and same arena layout as mvg.py (whose numpy apply is the fallback): per
touched vertex, the deletions before its first insertion of the batch set dt in
place; from that insertion on, its live entries are copied, the batch's ops replayed
in time order (an insertion adds an entry, a deletion closes the open one), and the
whole sorted by (neighbour label, neighbour, ct) into a new version. The numpy
version pays tens of array calls per batch whatever its size; here a batch is two
kernel calls (sizes, then writes into the reserved arena).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from csmd.cpu.arena import find_entry, graph_view, group_range
from csmd.cpu.mvg import INF, MultiVersionGraph


class Arena(NamedTuple):
    """The arena's arrays with room reserved for a batch's new versions (mvg.py names them)."""

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
def _sizes(gv, own, nbr, ts, sgn, starts):
    """Per run of ops of one vertex: its first insertion (INF: none) and its new version's size.
    Applies the deletions before the first insertion in place. Returns (first, size, ok); ok is
    False if such a deletion finds no live entry."""
    runs = len(starts) - 1
    first = np.full(runs, INF, np.int64)
    size = np.zeros(runs, np.int64)
    for r in range(runs):
        for i in range(starts[r], starts[r + 1]):
            if sgn[i] > 0:
                first[r] = ts[i]
                break
            s, e = group_range(gv.cur, gv.ct_min, gv.prev, gv.g_key, gv.g_start, gv.g_end, own[i],
                               gv.labels[nbr[i]], INF - 1)
            j = find_entry(gv.e_nbr, gv.e_ct, gv.e_dt, s, e, nbr[i], INF - 1)  # the live entry: dt == INF
            if j < 0:
                return first, size, False
            gv.e_dt[j] = ts[i]
        if first[r] == INF:
            continue
        old = gv.cur[own[starts[r]]]
        if old >= 0:
            for j in range(gv.v_es[old], gv.v_ee[old]):
                size[r] += gv.e_dt[j] == INF
        for i in range(starts[r], starts[r + 1]):
            size[r] += sgn[i] > 0
    return first, size, True


@njit(cache=True, nogil=True)
def _write(ar, own, nbr, ts, lab, sgn, starts, first, size, e0, g0, v0):
    """Write the new version of every run with an insertion at arena offsets e0 (entries), g0
    (groups), v0 (versions), in run order. Returns the number of groups written."""
    e, g, v = e0, g0, v0
    cap = size.max() if len(size) else 0
    t_nbr = np.empty(cap, np.int32)
    t_el = np.empty(cap, np.int32)
    t_ct = np.empty(cap, np.int64)
    t_dt = np.empty(cap, np.int64)
    t_key = np.empty(cap, np.int64)
    for r in range(len(first)):
        if first[r] == INF:
            continue
        u = own[starts[r]]
        old = ar.cur[u]
        k = 0
        if old >= 0:  # the live entries, already in (label, neighbour) order
            for j in range(ar.v_es[old], ar.v_ee[old]):
                if ar.e_dt[j] == INF:
                    t_nbr[k], t_el[k], t_ct[k], t_dt[k] = ar.e_nbr[j], ar.e_el[j], ar.e_ct[j], INF
                    k += 1
        copied = k
        for i in range(starts[r], starts[r + 1]):
            if ts[i] < first[r]:
                continue  # applied in place
            if sgn[i] > 0:
                t_nbr[k], t_el[k], t_ct[k], t_dt[k] = nbr[i], lab[i], ts[i], INF
                k += 1
            else:  # closes the open entry of that neighbour (the latest one)
                x = k - 1
                while t_nbr[x] != nbr[i] or t_dt[x] != INF:
                    x -= 1
                t_dt[x] = ts[i]
        for x in range(k):
            t_key[x] = (np.int64(ar.labels[t_nbr[x]]) << 32) | t_nbr[x]
        # merge the copied entries with the inserted ones sorted stably (equal pairs keep their
        # time order): the version is in (label, neighbour, ct) order
        ins = copied + np.argsort(t_key[copied:k], kind="mergesort")
        es, a, b = e, 0, 0
        while a < copied or b < k - copied:
            if b == k - copied or (a < copied and t_key[a] <= t_key[ins[b]]):
                x = a
                a += 1
            else:
                x = ins[b]
                b += 1
            label = t_key[x] >> 32
            if e == es or label != ar.g_key[g - 1] & ((1 << 31) - 1):
                if e > es:
                    ar.g_end[g - 1] = e
                ar.g_key[g] = (np.int64(v) << 31) | label
                ar.g_start[g] = e
                g += 1
            ar.e_nbr[e], ar.e_el[e], ar.e_ct[e], ar.e_dt[e] = t_nbr[x], t_el[x], t_ct[x], t_dt[x]
            ar.e_key[e] = (np.int64(g - 1) << 31) | t_nbr[x]
            e += 1
        if e > es:
            ar.g_end[g - 1] = e
        ar.v_vertex[v], ar.v_ct_min[v], ar.v_prev[v], ar.v_es[v], ar.v_ee[v] = u, first[r], old, es, e
        ar.v_live[v] = True
        v += 1
    return g - g0


@njit(cache=True, nogil=True)
def _by_vertex(seq, a, b, label, sign):
    """Each op once per endpoint (own -> nbr), grouped by own in time order, and where each
    vertex's run starts (with the end appended)."""
    k = len(seq)
    own = np.empty(2 * k, np.int64)
    for i in range(k):  # interleaved, the ops stay in time order; a stable sort groups them
        own[2 * i], own[2 * i + 1] = a[i], b[i]
    order = np.argsort(own, kind="mergesort")
    own = own[order]
    half = order >> 1
    nbr = np.where(order & 1, a[half], b[half]).astype(np.int32)
    ts, lab, sgn = seq[half], label[half].astype(np.int32), sign[half]
    starts = [0]
    for i in range(1, 2 * k):
        if own[i] != own[i - 1]:
            starts.append(i)
    starts.append(2 * k)
    return own, nbr, ts, lab, sgn, np.array(starts, np.int64)


def apply_edges(mvg: MultiVersionGraph, seq, a, b, label, sign):
    """MultiVersionGraph.apply, compiled: same result, same (version, replaced_at) list."""
    if not len(seq):
        return []
    own, nbr, ts, lab, sgn, starts = _by_vertex(*(np.asarray(x, np.int64) for x in (seq, a, b, label, sign)))
    first, size, ok = _sizes(graph_view(mvg), own, nbr, ts, sgn, starts)
    if not ok:  # the sequencer only passes deletions of live edges
        raise RuntimeError("multi-version graph: deleting an edge that is not live")
    grow = first < INF
    nv, ne = int(grow.sum()), int(size[grow].sum())
    if not nv:
        return []
    e0, g0, v0 = mvg.e_nbr.n, mvg.g_key.n, mvg.v_vertex.n
    ar = Arena(mvg.labels.a, mvg.cur.a, *(buf.reserve(ne) for buf in (mvg.e_nbr, mvg.e_el, mvg.e_ct, mvg.e_dt,
                                                                       mvg.e_key, mvg.g_key, mvg.g_start, mvg.g_end)),
               *(buf.reserve(nv) for buf in (mvg.v_vertex, mvg.v_ct_min, mvg.v_prev, mvg.v_es, mvg.v_ee, mvg.v_live)))
    groups = _write(ar, own, nbr, ts, lab, sgn, starts, first, size, e0, g0, v0)
    for buf in (mvg.e_nbr, mvg.e_el, mvg.e_ct, mvg.e_dt, mvg.e_key):
        buf.n += ne
    for buf in (mvg.g_key, mvg.g_start, mvg.g_end):
        buf.n += groups
    for buf in (mvg.v_vertex, mvg.v_ct_min, mvg.v_prev, mvg.v_es, mvg.v_ee, mvg.v_live):
        buf.n += nv
    vs = own[starts[:-1][grow]]
    old = mvg.cur.a[vs]
    mvg.cur.a[vs] = v0 + np.arange(nv)
    has_old = old >= 0
    return list(zip(old[has_old].tolist(), first[grow][has_old].tolist()))
