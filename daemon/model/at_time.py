"""A timed graph as it stood at one event time (`csmd match --at TS [--window W]`).

The pipeline's window keeps the edges whose ts is at most the watermark and at least the
watermark less W (pipeline/event_time.py); a static query at TS sees the same edges: those of
the file with a ts after TS are left out, and with a window those with a ts before TS - W.
Edges without a ts never expire, so they are always kept; every vertex is kept. The kept
edges keep their ts (Graph.edge_ts), which the CPU engine's search reads for a query's
span and order constraints.
"""

from __future__ import annotations

import numpy as np

from csmd.errors import InputError
from csmd.model.graph import Graph
from csmd.model.time_constraints import NO_TS


def has_event_time(g: Graph) -> bool:
    """Whether some edge of g has a ts (a fifth field on an e line, or a non-null ts column)."""
    return g.edge_ts is not None and len(g.edge_ts[2]) > 0


def graph_at(g: Graph, at: int, window: int | None, where) -> Graph:
    """g without the edges whose ts is after `at` or (window: a span >= 0, None: none) before
    at - window. An edge given twice keeps its first ts, as the pipeline's clock does. Raises
    InputError naming `where` (g's file) when no edge of g has a ts."""
    if not has_event_time(g):
        raise InputError(where, None, "--at needs edges with event times (a fifth field on e lines, "
                                      "e u v label ts, or a ts column), and this graph has none")
    u, v, ts = g.edge_ts
    iu, iv = _internal(g, u), _internal(g, v)
    n = np.int64(max(g.n, 1))
    key = _pair_keys(iu, iv, n, g.directed)
    _, first = np.unique(key, return_index=True)
    first = first[iu[first] != iv[first]]  # a self-loop is no edge (the graph dropped it)
    oldest = NO_TS if window is None else max(at - window, int(NO_TS))
    gone = (ts[first] > at) | (ts[first] < oldest)
    s, d, e = g.arcs()  # undirected: s < d, as _pair_keys orders a pair
    keep = ~np.isin(_pair_keys(s, d, n, g.directed), key[first[gone]])
    out = Graph.from_edges(g.labels, s[keep], d[keep], e[keep], g.ext_ids, g.directed)
    kept = first[~gone]
    # kept even when empty: the graph is a timed one whose edges left all have no ts, so a
    # query's constraints constrain nothing there (not refused as on a graph without ts)
    out.edge_ts = (u[kept], v[kept], ts[kept])
    return out


def _internal(g: Graph, ext: np.ndarray) -> np.ndarray:
    """The internal ids of external ids that g holds (Graph.edge_ts names only its vertices)."""
    order = np.argsort(g.ext_ids, kind="stable")
    return order[np.searchsorted(g.ext_ids[order], ext)].astype(np.int64)


def _pair_keys(a: np.ndarray, b: np.ndarray, n, directed: bool) -> np.ndarray:
    """One int64 per edge: an arc's (a, b), an undirected pair's smaller id first."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    if not directed:
        a, b = np.minimum(a, b), np.maximum(a, b)
    return a * n + b
