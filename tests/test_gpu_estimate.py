"""The GPU sampler against the CPU sampler (sample by sample, trawling included), its device-built
candidate graph against the host's, and yeast's exact counts.

Skipped without CUDA. The checks shared with the CPU sampler (unbiasedness, HPRD coverage,
same seed) are in test_estimate.py, run on both backends.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from csmd.backends import gpu_unavailable_reason, make_sampler
from csmd.errors import CsmdError
from csmd.jobs.estimate import run_estimate
from csmd.model.estimate import CandidateGraph
from csmd.model.formats import read_graph, read_query
from csmd.model.graph import Graph
from csmd.model.plan import plan_query

from helpers import dataset, host
from static_cases import random_case

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason()))]

YEAST_CLASSES = ("query_dense_8", "query_sparse_8", "query_dense_16")
YEAST_PER_CLASS = 100
EXACT_TIME_LIMIT = 20.0  # yeast queries the GPU matcher cannot count in this time are left out


def same_weights(g, q, method: str, seed: int, lanes: int, trawl: int = 0) -> None:
    """No inheritance, no streaming: the GPU sampler (on its device-built candidate graph) draws the
    CPU sampler's walks, so the same float64 weights, lane by lane; with trawling, the exact
    completion counts of the GPU's search equal the CPU static matcher's."""
    from csmd.gpu.sampler import GpuSampler, build

    plan = plan_query(g, q)
    cpu = make_sampler("cpu", g, plan, method, seed, trawl)
    gpu = GpuSampler(plan, build(g, plan), method, seed, inherit=False, trawl=trawl, stream=0)
    for rnd in (0, 3):
        w = cpu.draw(rnd, lanes)
        assert np.count_nonzero(w), "a case whose walks all fail checks nothing"
        assert np.array_equal(host(gpu.draw(rnd, lanes)), w)


@pytest.mark.parametrize("trawl", [0, 1, 2])
@pytest.mark.parametrize("method", ["wj", "alley"])
@pytest.mark.parametrize("case", range(10))
def test_gpu_weights_are_the_cpu_samplers_on_random_graphs(case, method, trawl):
    """(With inheritance, the default, test_estimate's unbiasedness and coverage checks hold the GPU.)"""
    g, q, _, _ = random_case(case)
    same_weights(g, q, method, seed=case * 1000 + 17, lanes=4096, trawl=trawl)


@pytest.mark.parametrize("method, trawl", [("wj", 0), ("alley", 0), ("alley", 2)])
def test_gpu_weights_are_the_cpu_samplers_on_hprd(hprd_queries, method, trawl):
    g, queries = hprd_queries
    for name in sorted(queries)[:20 if not trawl else 5]:
        same_weights(g, queries[name][0], method, seed=2**100 + 5, lanes=8192 if not trawl else 1024, trawl=trawl)


def same_candidates(g, q) -> None:
    from csmd.gpu.sampler import build, upload

    plan = plan_query(g, q)
    dev, hosts = build(g, plan), upload(CandidateGraph(g, plan))
    for name, a, b in zip(("first", "rows", "ipbase", "indptr", "local"), dev.arrays(), hosts.arrays()):
        assert a.dtype == b.dtype and np.array_equal(a.get(), b.get()), name


@pytest.mark.parametrize("case", range(10))
def test_device_candidate_graph_is_the_hosts_on_random_graphs(case):
    """Odd cases have edge labels."""
    g, q, _, _ = random_case(case)
    same_candidates(g, q)


def test_device_candidate_graph_is_the_hosts_on_hprd_and_github(hprd_queries):
    g, queries = hprd_queries
    for name in sorted(queries)[::10]:
        same_candidates(g, queries[name][0])
    root = dataset("github")
    g = read_graph(root / "data.graph")
    for i in (0, 7, 14, 21):
        same_candidates(g, read_query(root / "queries" / f"Q_{i}.graph"))


def test_warp_streaming_counts_as_one_lane_and_keeps_its_seed(hprd_queries):
    """With streaming from 1 entry on, a query of one edge still gets the CPU sampler's weights
    (its weight is the refine set's size, whichever member the warp picks); a longer one gets
    other walks (the path is taken), the same for the same seed."""
    from csmd.gpu.sampler import GpuSampler, upload

    g, queries = hprd_queries
    q = queries["query_dense_16_11"][0]
    edge = Graph.from_edges([int(q.labels[0]), int(q.labels[q.neighbors(0)[0]])], [0], [1])  # one of q's edges
    for query, same in ((edge, True), (q, False)):
        plan = plan_query(g, query)
        cands = upload(CandidateGraph(g, plan))
        cpu = make_sampler("cpu", g, plan, "alley", 9).draw(1, 4096)
        assert np.count_nonzero(cpu)
        streamed = GpuSampler(plan, cands, "alley", 9, inherit=False, stream=1)
        w = host(streamed.draw(1, 4096))
        assert np.array_equal(w, cpu) == same
        assert np.array_equal(host(streamed.draw(1, 4096)), w)


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
