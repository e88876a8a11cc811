"""The multi-version graph, numpy and compiled, against a model of every edge's lifetimes: reads at
any still readable timestamp, through batches that name a pair several times, versions freed as
the GC frees them, and compactions (which renumber the versions, so the version table does not
grow with every version ever made)."""

from __future__ import annotations

import numpy as np
import pytest

from csmd.cpu.arena import edge_labels, graph_view
from csmd.cpu.mvg import INF, MultiVersionGraph
from csmd.cpu.updater import CompiledGraph
from csmd.model.graph import Graph


def model_label(lives: dict, a: int, b: int, t: int) -> int:
    """The label of the edge {a, b} at timestamp t: its lifetime (ct, dt] holds t."""
    for ct, dt, lab in lives.get((min(a, b), max(a, b)), ()):
        if ct < t <= dt:
            return lab
    return -1


@pytest.mark.parametrize("graph_type", [MultiVersionGraph, CompiledGraph])
@pytest.mark.parametrize("seed", range(6))
def test_reads_at_every_readable_timestamp_match_the_model(graph_type, seed):
    rng = np.random.default_rng(seed)
    n = 24
    vlabel = rng.integers(0, 3, n)
    pairs = {(int(min(a, b)), int(max(a, b))) for a, b in rng.integers(0, n, (80, 2)) if a != b}
    lives = {p: [[-1, INF, int(rng.integers(0, 2))]] for p in pairs}  # per pair: [ct, dt, label], oldest first
    src, dst = np.array(sorted(pairs)).T
    g = graph_type(Graph.from_edges(vlabel, src, dst, np.array([lives[p][0][2] for p in sorted(pairs)])))
    held, seq = [], 0  # replaced versions (replaced_at, token)
    for step in range(150):
        ops = []
        # a batch: valid where each op stands, pairs repeat; odd seeds make long ones (a vertex
        # with dozens of ops: the updater sorts those runs another way)
        for _ in range(int(rng.integers(1, 300 if seed % 2 else 40))):
            a, b = (int(x) for x in rng.choice(n, 2, replace=False))
            p = (min(a, b), max(a, b))
            alive = p in lives and lives[p][-1][1] == INF
            if alive:
                lives[p][-1][1] = seq
                ops.append((seq, a, b, lives[p][-1][2], -1))
            else:
                lab = int(rng.integers(0, 2))
                lives.setdefault(p, []).append([seq, INF, lab])
                ops.append((seq, a, b, lab, 1))
            seq += 1
        first = ops[0][0]
        held += [(at, tok) for tok, at in g.apply(*(np.array(c, np.int64) for c in zip(*ops)))]
        # every update of earlier batches finished: reads come at `first` or later from now on
        g.free([tok for at, tok in held if at < first])
        held = [(at, tok) for at, tok in held if at >= first]
        if step % 25 == 24:
            g.compact()  # renumbers versions: the held tokens follow, the freed ids are gone
            assert g.v_vertex.n == g.live_versions
        k = 64
        a, b = rng.integers(0, n, (2, k))
        t = rng.integers(first, seq + 1, k)
        want = [model_label(lives, x, y, z) for x, y, z in zip(a.tolist(), b.tolist(), t.tolist())]
        assert g.edge_label_between(a, b, t).tolist() == want
        # the compiled reads (through each version's group range) of either graph agree
        assert edge_labels(graph_view(g), a, b, t).tolist() == want
    assert g.compactions >= 6
    live = sorted((p[0], p[1], lv[-1][2]) for p, lv in lives.items() if lv[-1][1] == INF)
    assert sorted(zip(*(x.tolist() for x in g.live_edges()))) == live


@pytest.mark.parametrize("vertices", [40, 100_000])  # counting sort by endpoint; a mergesort (few ops, many vertices)
@pytest.mark.parametrize("seed", range(4))
def test_batch_ops_are_ordered_by_endpoint_neighbour_label_neighbour_then_time(vertices, seed):
    from csmd.cpu.updater import _by_vertex

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 3, vertices).astype(np.int32)
    ops = int(rng.integers(1, 400))
    a, b = rng.integers(0, 40, (2, ops))  # ops on the first 40 vertices: endpoints and pairs repeat
    order, own, nbr, key = _by_vertex(labels, a, b)
    assert own.tolist() == np.column_stack([a, b]).reshape(-1).tolist()
    assert nbr.tolist() == np.column_stack([b, a]).reshape(-1).tolist()
    want = np.lexsort((np.arange(2 * ops), nbr, labels[nbr], own))  # the last key sorts first
    assert order.tolist() == want.tolist()
