"""The GPU executor against the CPU engine: per-update matches and counts on seeded random
mixed streams (insertions and deletions, edge labels), batch sizes 1, 7 and 64; count-only
trees (counted at the last depth at once) on a graph without edge labels until mid-stream;
count-only trees whose last depths are counted as a product (leaves with their own labels)."""

from __future__ import annotations

import numpy as np
import pytest

from csmd.engine import UpdateBatch
from csmd.backends import gpu_unavailable_reason
from csmd.model.graph import Graph
from csmd.pipeline.queries import continuous_query

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason()))]


def _graph(rng, n, m, labels, elabels) -> Graph:
    pairs = {tuple(sorted(p)) for p in rng.integers(0, n, (m, 2)).tolist() if p[0] != p[1]}
    src, dst = (np.array(x, np.int64) for x in zip(*pairs))
    return Graph.from_edges(rng.integers(0, labels, n).astype(np.int32), src, dst,
                            rng.integers(0, elabels, len(src)).astype(np.int32))


QUERIES = {  # (labels, edges (x, y, el))
    "edge": ([0, 1], [(0, 1, 0)]),
    "triangle": ([0, 0, 1], [(0, 1, 0), (1, 2, 0), (0, 2, 1)]),
    "path3": ([0, 1, 0], [(0, 1, 0), (1, 2, 0)]),
    "square": ([0, 1, 0, 1], [(0, 1, 0), (1, 2, 0), (2, 3, 1), (3, 0, 0)]),
    "star": ([1, 0, 0, 0], [(0, 1, 0), (0, 2, 1), (0, 3, 0)]),
    "diamond": ([0, 0, 0, 0], [(0, 1, 0), (1, 2, 0), (2, 0, 0), (2, 3, 0), (3, 0, 0)]),
}


def _query(labels, edges) -> Graph:
    s, d, e = (np.array(x, np.int64) for x in zip(*edges))
    return Graph.from_edges(np.array(labels, np.int32), s, d, e.astype(np.int32))


def _stream(rng, g: Graph, k: int, labelled_from: int = 0):
    """k valid edge ops in order: insert an absent pair, or delete a present edge (its label).
    Insertions before op labelled_from have edge label 0."""
    src, dst, lab = g.edge_list()
    live = {(int(a), int(b)): int(e) for a, b, e in zip(src, dst, lab)}
    ops = []
    for _ in range(k):
        if live and rng.random() < 0.45:
            key = list(live)[rng.integers(len(live))]
            ops.append((key[0], key[1], live.pop(key), -1))
        else:
            while True:
                a, b = sorted(rng.integers(0, g.n, 2).tolist())
                if a != b and (a, b) not in live:
                    break
            e = int(rng.integers(0, 2)) if len(ops) >= labelled_from else 0
            live[(a, b)] = e
            ops.append((a, b, e, 1) if rng.random() < 0.5 else (b, a, e, 1))
    return ops


def _batch(ops, first_seq: int) -> UpdateBatch:
    a, b, e, s = (np.array(x, np.int64) for x in zip(*ops))
    z = np.zeros(0, np.int64)
    return UpdateBatch(first_seq, first_seq + len(ops), np.arange(first_seq, first_seq + len(ops)), a, b,
                       e.astype(np.int32), s.astype(np.int8), z, z, z, np.zeros(0, np.int32), 0)


def _by_update(m, count_only: bool) -> dict:
    if m is None:
        return {}
    if count_only:
        return {int(s): int(c) for s, c in zip(m.seq, m.counts) if c}
    out: dict = {}
    for s, r in zip(m.seq.tolist(), m.rows.tolist()):
        out.setdefault(s, []).append(tuple(r))
    return {s: sorted(r) for s, r in out.items()}


def _lock_step(engines, cqs, ops, batch_size: int) -> int:
    """Apply and match the ops batch by batch on the CPU and the GPU engine, asserting equal
    matches per update for every query; returns the number of updates with matches."""
    prepared = [[e.prepare(cq) for cq in cqs] for e in engines]
    seen = 0
    for i in range(0, len(ops), batch_size):
        batch = _batch(ops[i: i + batch_size], 1 + i)
        results = []
        for e, pq in zip(engines, prepared):
            e.apply(batch)
            results.append(e.submit(batch, pq).result())
        for cq in cqs:
            cpu, gpu = (_by_update(r.get(cq.name), cq.count_only) for r in results)
            assert gpu == cpu, (cq.name, batch.first_seq)
            seen += len(cpu)
    return seen


@pytest.mark.parametrize("batch_size", [1, 7, 64])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gpu_executor_equals_cpu_engine(seed, batch_size):
    from csmd.cpu.numpy_engine import CpuEngine
    from csmd.gpu.engine import GpuEngine

    rng = np.random.default_rng(seed)
    g0 = _graph(rng, 60, 260, 2, 2)
    engines = [CpuEngine(g0), GpuEngine(g0)]
    cqs = [continuous_query(f"{name}/{co}", _query(*spec), g0.labels, count_only=co)
           for name, spec in QUERIES.items() for co in (False, True)]
    assert _lock_step(engines, cqs, _stream(rng, g0, 192), batch_size) > 50  # the stream does produce matches
    src = [np.sort(np.stack(e.live_edges()[:2], 1), axis=0) for e in engines]
    assert np.array_equal(src[0], src[1])


SYMMETRIC = {  # distinct queries: their constraints at the seed (edge, triangle, ...), deeper (square), at
    # leaves that count_suffix_at would count at once without them (star), and partial symmetry (edge labels)
    "edge": ([0, 0], [(0, 1, 0)]),
    "triangle": ([0, 0, 0], [(0, 1, 0), (1, 2, 0), (0, 2, 0)]),
    "square": ([0, 0, 0, 0], [(0, 1, 0), (1, 2, 0), (2, 3, 0), (3, 0, 0)]),
    "star": ([0, 0, 0, 0], [(0, 1, 0), (0, 2, 0), (0, 3, 0)]),
    "clique": ([0, 0, 0, 0], [(0, 1, 0), (0, 2, 0), (0, 3, 0), (1, 2, 0), (1, 3, 0), (2, 3, 0)]),
    "square-el": ([0, 0, 0, 0], [(0, 1, 0), (1, 2, 1), (2, 3, 0), (3, 0, 1)]),
    "path-el": ([0, 0, 0, 0], [(0, 1, 1), (1, 2, 0), (2, 3, 1)]),
}


@pytest.mark.parametrize("batch_size", [1, 7, 64])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_distinct_gpu_executor_equals_cpu_engine(seed, batch_size):
    """Distinct queries (symmetry constraints in the anchored plans, the seed's own one chosen on
    the host): the GPU's matches per update are the CPU engine's (the same representative of
    every instance), materialized and counted."""
    from csmd.cpu.numpy_engine import CpuEngine
    from csmd.gpu.engine import GpuEngine

    rng = np.random.default_rng(100 + seed)
    g0 = _graph(rng, 40, 200, 1, 2)
    engines = [CpuEngine(g0), GpuEngine(g0)]
    cqs = [continuous_query(f"{name}/{co}", _query(*spec), g0.labels, count_only=co, distinct=True)
           for name, spec in SYMMETRIC.items() for co in (False, True)]
    assert all(cq.sym for cq in cqs)
    assert _lock_step(engines, cqs, _stream(rng, g0, 192), batch_size) > 50


TREES = {  # last depths with one backward edge, same-label leaves (injectivity), labelled edges
    "path4": ([0, 1, 0, 1], [(0, 1, 0), (1, 2, 0), (2, 3, 0)]),
    "star": ([1, 0, 0, 0], [(0, 1, 0), (0, 2, 0), (0, 3, 0)]),
    "spider": ([0, 1, 1, 0, 0], [(0, 1, 0), (0, 2, 0), (1, 3, 0), (2, 4, 0)]),
    "tailed": ([0, 0, 1, 0], [(0, 1, 0), (1, 2, 0), (0, 2, 0), (2, 3, 0)]),
    "star-el": ([1, 0, 0, 0], [(0, 1, 0), (0, 2, 1), (0, 3, 0)]),
}


@pytest.mark.parametrize("batch_size", [1, 64, 1024])
@pytest.mark.parametrize("seed", [0, 1])
def test_count_only_trees_equal_cpu_engine(seed, batch_size):
    """Clean and unclean ranges: bulk versions, versions with entries newer than T or closed
    (deletions, re-insertions inside one batch), and edge labels from op 300 on."""
    from csmd.cpu.numpy_engine import CpuEngine
    from csmd.gpu.engine import GpuEngine

    rng = np.random.default_rng(seed)
    g0 = _graph(rng, 50, 400, 2, 1)
    engines = [CpuEngine(g0), GpuEngine(g0)]
    cqs = [continuous_query(name, _query(*spec), g0.labels, count_only=True) for name, spec in TREES.items()]
    assert _lock_step(engines, cqs, _stream(rng, g0, 600, labelled_from=300), batch_size) > 200


LEAFY = {  # several last depths counted as a product: leaves with distinct labels, some sharing one
    # with an earlier depth (injectivity against the prefix), two same-label leaves (the tail stops
    # before the second), a leaf edge with a label
    "fork": ([0, 1, 2, 3, 2], [(0, 1, 0), (1, 2, 0), (2, 3, 0), (0, 4, 0)]),
    "spider": ([0, 1, 2, 2, 3, 3, 1], [(0, 1, 0), (1, 2, 0), (0, 3, 0), (3, 4, 0), (0, 5, 0), (5, 6, 0)]),
    "twins": ([0, 1, 3, 3, 2], [(0, 1, 0), (1, 2, 0), (1, 3, 0), (0, 4, 0)]),
    "broom-el": ([1, 0, 2, 3, 1], [(0, 1, 0), (1, 2, 0), (1, 3, 1), (0, 4, 0)]),
}


@pytest.mark.parametrize("batch_size", [1, 64, 1024])
@pytest.mark.parametrize("seed", [0, 1])
def test_count_only_leaf_products_equal_cpu_engine(seed, batch_size):
    """Products of the leaves' candidate counts over clean and unclean ranges, as above."""
    from csmd.cpu.numpy_engine import CpuEngine
    from csmd.gpu.engine import GpuEngine
    from csmd.gpu.executor import PreparedQuery, _fast

    rng = np.random.default_rng(seed)
    g0 = _graph(rng, 60, 500, 4, 1)
    engines = [CpuEngine(g0), GpuEngine(g0)]
    cqs = [continuous_query(name, _query(*spec), g0.labels, count_only=True) for name, spec in LEAFY.items()]
    tables = np.concatenate([PreparedQuery(cq).tables for cq in cqs])
    tails = _fast(tables, tables[:, 0].astype(np.int64)).tolist()
    assert max(tails) >= 3 and 1 in tails  # long tails, and some of one depth only
    assert _lock_step(engines, cqs, _stream(rng, g0, 600, labelled_from=300), batch_size) > 200
