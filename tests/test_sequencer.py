"""The sequencer's numpy path for edge-only batches gives exactly what its one-record-at-a-time
path gives (ops, labels, sequence numbers, ignored counts), on seeded random batches that mix
valid and invalid inserts and deletes, self-loops and edge labels."""

from __future__ import annotations

import numpy as np
import pytest

from csmd.cpu.engine import CpuEngine
from csmd.model.formats import DELETE_EDGE, INSERT_EDGE, Update
from csmd.model.graph import Graph
from csmd.pipeline.sequencer import Sequencer, Vertices

FIELDS = ("first_seq", "end_seq", "edge_seq", "edge_a", "edge_b", "edge_label", "edge_sign", "vertex_seq",
          "new_labels", "first_vertex", "records")


@pytest.mark.parametrize("seed", range(8))
def test_edge_only_batches_take_the_numpy_path_with_the_general_paths_result(seed):
    rng = np.random.default_rng(seed)
    n = 30
    src, dst = rng.integers(0, n, (2, 60))
    g0 = Graph.from_edges(rng.integers(0, 3, n), src, dst, rng.integers(0, 2, 60), ext_ids=np.arange(n) * 7 - 50)
    fast, slow = (Sequencer(Vertices(g0), CpuEngine(g0)) for _ in range(2))
    took_fast = 0
    for _ in range(40):
        k = int(rng.integers(1, 12))
        u, v = (g0.ext_ids[rng.integers(0, n, k)] for _ in range(2))
        ops = rng.choice([INSERT_EDGE, DELETE_EDGE], k)
        recs = [Update(str(op), int(x), int(y), int(rng.integers(0, 2))) for op, x, y in zip(ops, u, v)]
        got = fast._edges_only(recs, [0.0] * k)
        want = slow._general(recs, [0.0] * k)
        if got is None:  # a pair named twice: the general path for both
            got = fast._general(recs, [0.0] * k)
        else:
            took_fast += 1
        for f in FIELDS:
            assert np.array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(want, f))), f
        assert got.record_of == want.record_of
        assert fast.ignored == slow.ignored and fast.next_seq == slow.next_seq
        fast.engine.apply(got)
        slow.engine.apply(want)
    assert took_fast > 10 and sum(slow.ignored.values()) > 10
