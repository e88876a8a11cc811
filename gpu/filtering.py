"""Candidate filtering on the device (GUIDE 3): LDF + NLF, then arc-consistency rounds.

The result is one uint32 per data vertex with one bit per query vertex; only the
per-query-vertex counts come back to the host (to choose the matching order).
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from csmd.graph import Graph

from .device_graph import DeviceGraph
from .launch import THREADS, flat_grid, i32, i64, or_dummy
from .module import kernel

REFINE_ROUNDS = 3  # as the CPU planner: later rounds rarely remove anything


def _query_arrays(q: Graph):
    """NLF pairs and arcs of q as flat int32 arrays with per-vertex pointers."""
    nlf_ptr, nlf_lab, nlf_cnt = [0], [], []
    arc_ptr, arc_w, arc_el, arc_wl = [0], [], [], []
    for u in range(q.n):
        nb = q.neighbors(u)
        labs, cnts = np.unique(q.labels[nb], return_counts=True)
        nlf_lab += labs.tolist()
        nlf_cnt += cnts.tolist()
        nlf_ptr.append(len(nlf_lab))
        els = q.elabels[q.indptr[u]:q.indptr[u + 1]]
        arc_w += nb.tolist()
        arc_el += els.tolist()
        arc_wl += q.labels[nb].tolist()
        arc_ptr.append(len(arc_w))
    dev = lambda x: cp.asarray(np.asarray(x, np.int32))  # noqa: E731
    return (dev(q.labels), dev(q.degrees), dev(nlf_ptr), dev(nlf_lab), dev(nlf_cnt),
            dev(arc_ptr), dev(arc_w), dev(arc_el), dev(arc_wl))


def filter_candidates(dg: DeviceGraph, q: Graph) -> tuple[cp.ndarray, np.ndarray]:
    """(cbits, sizes): cbits[v] bit u <=> v is a candidate of query vertex u; sizes[u] = |C(u)|."""
    qlabel, qdeg, nlf_ptr, nlf_lab, nlf_cnt, arc_ptr, arc_w, arc_el, arc_wl = _query_arrays(q)
    cbits = cp.empty(dg.n, cp.uint32)
    grid, n = flat_grid(dg.n), i64(dg.n)
    index = (or_dummy(dg.hub_of), or_dummy(dg.hub_tab), i32(dg.num_labels), i32(dg.single_label))
    kernel("filter", "ldf_nlf")(grid, (THREADS,), (n, dg.indptr, dg.gadj, dg.labels, *index, i32(q.n), qlabel, qdeg,
                                                    nlf_ptr, nlf_lab, nlf_cnt, cbits))
    changed = cp.zeros(1, cp.int32)
    for _ in range(REFINE_ROUNDS):
        changed.fill(0)
        kernel("filter", "refine")(grid, (THREADS,), (n, dg.indptr, dg.gadj, or_dummy(dg.gadj_el), dg.labels, *index,
                                                       i32(dg.has_edge_labels), arc_ptr, arc_w, arc_el, arc_wl,
                                                       cbits, changed))
        if not int(changed.get()[0]):
            break
    sizes = cp.zeros(32, cp.uint64)
    kernel("filter", "count_bits")(grid, (THREADS,), (n, cbits, i32(q.n), sizes))
    return cbits, sizes.get()[: q.n].astype(np.int64)


def by_depth(dg: DeviceGraph, cbits: cp.ndarray, order: list[int]) -> cp.ndarray:
    """Renumber cbits in place to matching depths; returns the root candidates (depth 0)."""
    roots = cp.empty(dg.n, cp.int32)
    count = cp.zeros(1, cp.uint64)
    order_d = cp.asarray(np.asarray(order, np.int32))
    kernel("filter", "by_depth")(flat_grid(dg.n), (THREADS,), (i64(dg.n), cbits, order_d, i32(len(order)), roots,
                                                              count))
    return roots[: int(count.get()[0])]
