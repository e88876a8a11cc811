"""Graph.from_edges's packed-key sort (undirected, keys that fit) against its general path: the same
graph from seeded random edge lists with self-loops, repeats (the same label, and another label:
the first given wins), labels up to 2^31-1 (keys too wide for the packed sort) and no edges."""

from __future__ import annotations

import numpy as np
import pytest

import csmd.model.graph as graph
from csmd.model.graph import Graph


def _both(monkeypatch, labels, src, dst, els):
    fast = Graph.from_edges(labels, src, dst, els)
    with monkeypatch.context() as m:
        m.setattr(graph, "_packed_csr", lambda *a: None)
        slow = Graph.from_edges(labels, src, dst, els)
    return fast, slow


@pytest.mark.parametrize("seed", range(30))
def test_packed_sort_builds_the_general_paths_graph(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    m = int(rng.integers(0, 4 * n))
    src, dst = rng.integers(0, n, m), rng.integers(0, n, m)
    top = [1, 4, 2**31 - 1][seed % 3]
    els = rng.integers(0, top, m, endpoint=True).astype(np.int32)
    if seed % 2 and m:  # repeats of given pairs, with their label or, now and then, another
        k = rng.integers(0, m, m // 2)
        src, dst = np.concatenate([src, dst[k]]), np.concatenate([dst, src[k]])
        again = els[k].astype(np.int64)
        if seed % 4 == 1:
            j = max(1, len(again) // 8)
            again[:j] = (again[:j] + 1) % (top + 1)
        els = np.concatenate([els, again.astype(np.int32)])
    fast, slow = _both(monkeypatch, rng.integers(0, 3, n).astype(np.int32), src, dst, els)
    for field in ("indptr", "indices", "elabels"):
        assert np.array_equal(getattr(fast, field), getattr(slow, field)), field
