"""R-MAT power-law graphs built entirely on the device (for the scale benchmark)."""

from __future__ import annotations

import cupy as cp

from .device_graph import DeviceGraph
from .launch import THREADS, flat_grid, i32, i64, u64
from .module import kernel

GRAPH500 = (0.57, 0.19, 0.19)  # quadrant probabilities a, b, c (d = 0.05)


def rmat_graph(scale: int, edges: int, num_labels: int = 1, seed: int = 1) -> DeviceGraph:
    """2^scale vertices, `edges` R-MAT draws; self-loops and repeats dropped, so the graph
    has somewhat fewer undirected edges than drawn. Labels uniform in [0, num_labels)."""
    n = 1 << scale
    src = cp.empty(edges, cp.int32)
    dst = cp.empty(edges, cp.int32)
    kernel("rmat", "rmat_edges")(flat_grid(edges), (THREADS,), (i64(edges), i32(scale), *GRAPH500, u64(seed), src, dst))
    lo = cp.minimum(src, dst).astype(cp.int64)
    hi = cp.maximum(src, dst).astype(cp.int64)
    del src, dst
    keep = lo != hi
    key = cp.unique(lo[keep] * n + hi[keep])
    del lo, hi, keep
    lo, hi = key // n, key % n
    del key
    # both directions, sorted by (row, column): each slice ascends by neighbour id
    both = cp.concatenate([lo * n + hi, hi * n + lo])
    del lo, hi
    both.sort()
    rows = both // n
    adj = (both % n).astype(cp.int32)
    del both
    indptr = cp.zeros(n + 1, cp.int64)
    indptr[1:] = cp.cumsum(cp.bincount(rows, minlength=n))
    del rows
    labels = cp.zeros(n, cp.int32)
    if num_labels > 1:
        kernel("rmat", "random_labels")(flat_grid(n), (THREADS,), (i64(n), i32(num_labels), u64(seed + 1), labels))
    return DeviceGraph.from_csr(labels, indptr, adj, None)
