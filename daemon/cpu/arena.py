"""Reading the CPU multi-version graph (mvg.py) from compiled code, at a timestamp.

A vertex's version at t is the newest with ct_min < t; an entry is visible at t when
ct < t <= dt. A static graph is the same arena with every entry alive since before time 0.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from csmd.model.direction import HALF, HALF_MASK, LABEL_BITS

# Kernels that allocate nothing run without numba's reference counting: with it, every call
# increfs and decrefs each array it is passed (tens of them in the NamedTuples), which costs ten
# times the check being made.
hot = njit(cache=True, nogil=True, _nrt=False)


_UNTIMED = np.zeros(0, np.int64)  # e_ts and e_tsin without event time


class GraphView(NamedTuple):
    """The arrays of a multi-version graph that a search reads (see mvg.py for their meaning)."""

    labels: np.ndarray  # int32 per vertex
    cur: np.ndarray  # int64 per vertex: newest version, -1 none
    ct_min: np.ndarray  # int64 per version
    prev: np.ndarray  # int64 per version
    g_key: np.ndarray  # int64, sorted: version << 31 | neighbour label, one per group
    g_start: np.ndarray
    g_end: np.ndarray
    e_nbr: np.ndarray  # int32 per entry
    e_el: np.ndarray
    e_ct: np.ndarray  # int64 per entry
    e_dt: np.ndarray
    e_ts: np.ndarray  # int64 per entry under event time (else empty): the ts of the arc to the neighbour
    e_tsin: np.ndarray  # and of the arc back (model/time_constraints.py)
    v_es: np.ndarray  # int64 per version: its entries (the updater copies them)
    v_ee: np.ndarray
    v_gs: np.ndarray  # int64 per version: its groups
    v_ge: np.ndarray


def graph_view(mvg, cur: np.ndarray | None = None) -> GraphView:
    """The arrays of `mvg` now. Appends never change what a read at an earlier timestamp sees,
    but `cur` is updated in place: a search that may overlap the updater passes a copy."""
    return GraphView(mvg.labels.view(), mvg.cur.a if cur is None else cur, mvg.v_ct_min.a, mvg.v_prev.a,
                     mvg.g_key.view(), mvg.g_start.a, mvg.g_end.a, mvg.e_nbr.a, mvg.e_el.a, mvg.e_ct.a, mvg.e_dt.a,
                     mvg.e_ts.a if mvg.timed else _UNTIMED, mvg.e_tsin.a if mvg.timed else _UNTIMED, mvg.v_es.a, mvg.v_ee.a, mvg.v_gs.a, mvg.v_ge.a)


@hot
def lower_bound(a, lo, hi, x):
    """The first position in the sorted a[lo:hi] whose value is not below x."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@hot
def group_range(cur, ct_min, prev, v_gs, v_ge, g_key, g_start, g_end, v, label, t):
    """Entry range of v's neighbours with `label` in v's version at t (GraphView's arrays)."""
    vid = cur[v]
    while vid >= 0 and ct_min[vid] >= t:
        vid = prev[vid]
    if vid < 0:
        return 0, 0
    key = (vid << 31) | label
    lo = lower_bound(g_key, v_gs[vid], v_ge[vid], key)
    if lo < v_ge[vid] and g_key[lo] == key:
        return g_start[lo], g_end[lo]
    return 0, 0


@hot
def label_ok(label, test):
    """Does an entry's label pass a plan's packed edge-label test (model/direction.py label_test)?"""
    return (np.int64(label) & (test >> 32)) == (test & 0xFFFFFFFF)


@hot
def seed_ways(code, test, directed):
    """model/direction.py seed_ways for one op and one anchor (bit 0: the anchor's first vertex on
    the op's a, bit 1: on its b)."""
    if not directed:
        return 3 if label_ok(code, test) else 0
    q = test & 0xFFFFFFFF
    c = np.int64(code)
    back = ((c & HALF_MASK) << HALF) | (c >> HALF)
    fwd = 1 if (q >> LABEL_BITS) & 1 and label_ok(c, test) else 0
    rev = 2 if (q >> (HALF + LABEL_BITS)) & 1 and label_ok(back, test) else 0
    return fwd | rev


@hot
def find_entry(e_nbr, e_ct, e_dt, s, e, c, t):
    """The entry for neighbour c in [s, e) visible at t, -1 if none."""
    j = lower_bound(e_nbr, s, e, c)
    # a pair deleted and re-inserted within one version has several entries, one visible
    while j < e and e_nbr[j] == c:
        if e_ct[j] < t and t <= e_dt[j]:
            return j
        j += 1
    return -1


@njit(cache=True, nogil=True)
def edge_labels(gv, a, b, t):
    """The label of the edge {a[i], b[i]} visible at t[i], -1 where there is none."""
    out = np.full(len(a), -1, np.int32)
    for i in range(len(a)):
        s, e = group_range(gv.cur, gv.ct_min, gv.prev, gv.v_gs, gv.v_ge, gv.g_key, gv.g_start, gv.g_end, a[i],
                           gv.labels[b[i]], t[i])
        j = find_entry(gv.e_nbr, gv.e_ct, gv.e_dt, s, e, b[i], t[i])
        if j >= 0:
            out[i] = gv.e_el[j]
    return out
