"""The GPU sampler against the CPU sampler (sample by sample) and yeast's exact counts.

Skipped without CUDA. The checks shared with the CPU sampler (unbiasedness, HPRD coverage,
same seed) are in test_estimate.py, run on both backends.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from conftest import dataset
from csmd.engines import gpu_unavailable_reason
from csmd.errors import CsmdError
from csmd.cli.estimate import make_sampler, run_estimate
from csmd.model.estimate import CandidateGraph
from csmd.model.formats import read_graph, read_query
from csmd.model.graph import Graph
from csmd.model.plan import plan_query
from test_estimate import hprd, host, random_case  # noqa: F401 (hprd: a fixture)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason()))]

YEAST_CLASSES = ("query_dense_8", "query_sparse_8", "query_dense_16")
YEAST_PER_CLASS = 100
EXACT_TIME_LIMIT = 20.0  # yeast queries the GPU matcher cannot count in this time are left out


def same_weights(g, q, method: str, seed: int, lanes: int) -> None:
    from csmd.gpu.sampler import GpuSampler

    cg = CandidateGraph(g, plan_query(g, q))
    cpu, gpu = make_sampler("cpu", g, cg, method, seed), GpuSampler(cg, method, seed, inherit=False)
    for rnd in (0, 3):
        w = cpu.draw(rnd, lanes)
        assert np.count_nonzero(w), "a case whose walks all fail checks nothing"
        assert np.array_equal(host(gpu.draw(rnd, lanes)), w)


@pytest.mark.parametrize("method", ["wj", "alley"])
@pytest.mark.parametrize("case", range(10))
def test_gpu_weights_are_the_cpu_samplers_on_random_graphs(case, method):
    """Same seed, same round, no inheritance: the same walks, so the same float64 weights, lane by lane.
    (With inheritance, the default, test_estimate's unbiasedness and coverage checks hold the GPU.)"""
    g, q, _, _ = random_case(case)
    same_weights(g, q, method, seed=case * 1000 + 17, lanes=4096)


@pytest.mark.parametrize("method", ["wj", "alley"])
def test_gpu_weights_are_the_cpu_samplers_on_hprd(hprd, method):
    g, queries = hprd
    for name in sorted(queries)[:20]:
        same_weights(g, queries[name][0], method, seed=2**100 + 5, lanes=8192)


@pytest.fixture(scope="module")
def yeast():
    root = dataset("yeast")
    return read_graph(root / "data.graph"), root / "queries"


@pytest.mark.slow
def test_intervals_cover_yeast_exact_counts(yeast):
    """The first 100 dense and sparse 8-vertex and dense 16-vertex yeast queries whose exact count
    the GPU static matcher finds in time, 2^20 Alley samples each, one seed per query."""
    from csmd.gpu.engine import match_many

    g, qdir = yeast
    files = [p for cls in YEAST_CLASSES for p in sorted(qdir.glob(f"{cls}_*.graph"),
                                                        key=lambda p: int(re.findall(r"\d+", p.stem)[-1]))
             [:YEAST_PER_CLASS]]
    queries = [read_query(p) for p in files]
    exact = match_many(g, queries, time_limit=EXACT_TIME_LIMIT)
    cases = [(p.stem, q, r.count) for p, q, r in zip(files, queries, exact) if r.complete and r.count]
    assert len(cases) >= 200, len(cases)
    missed = []
    for seed, (name, q, count) in enumerate(cases):
        res = run_estimate(g, q, name, method="alley", samples=1 << 20, seed=seed, backend="gpu")
        if not (res["ci_low"] is not None and res["ci_low"] <= count <= res["ci_high"]):
            missed.append((name, count, res["estimate"]))
    assert len(missed) <= 0.1 * len(cases), missed


def test_gpu_refuses_queries_over_32_vertices():
    def path(n):
        return Graph.from_edges([0] * n, list(range(n - 1)), list(range(1, n)))

    with pytest.raises(CsmdError, match="at most 32 vertices, not 33"):
        run_estimate(path(40), path(33), "q", samples=64, backend="gpu")
