"""The GPU static matcher against published counts, brute force and the CPU engine.

Skipped without CUDA. The random cases are the CPU engine's (static_cases.py, test_random_static), plus
larger hub-heavy graphs (hubs of degree in the thousands) with queries of 2 to 16
vertices, where the CPU engine (itself checked against brute force) is the reference.
Batches (many queries in one search) are checked the same ways.
"""

from __future__ import annotations

import random
from functools import lru_cache

import numpy as np
import pytest

from csmd.cpu.matcher import search
from csmd.backends import gpu_unavailable_reason
from csmd.model.formats import read_graph, read_query
from csmd.model.plan import plan_query, symmetry_constraints

from brute import adjacency, brute_force
from helpers import dataset, read_expected
from static_cases import (extracted_query, make_case, random_connected_query, run_cli, to_graph, write_graph_file,
                          write_query_file)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason()))]

NUM_CASES = 300
NUM_HUB_CASES = 40
CPU_TIME_LIMIT = 2.0  # hub cases whose CPU reference takes longer are redrawn
MAX_SET = 300_000  # match sets compared row by row up to this size


def gpu_match(g, q, **kw):
    from csmd.gpu.engine import match

    return match(g, q, **kw)


def gpu_collect(g, q, **kw):
    rows = []
    res = gpu_match(g, q, sink=lambda r: rows.append(np.array(r)), **kw)
    for r in rows:
        assert r.dtype == np.int32 and r.ndim == 2 and r.shape[1] == q.n
    return res, [tuple(x) for r in rows for x in r.tolist()]


def gpu_match_many(g, qs, **kw):
    from csmd.gpu.engine import match_many

    return match_many(g, qs, **kw)


def tuning(**kw):
    from csmd.gpu.matcher import Tuning

    return Tuning(**kw)


# ---- published counts ---------------------------------------------------------------------
def test_hprd_all_queries_match_expected_counts():
    root = dataset("hprd")
    g, expected = read_graph(root / "data.graph"), read_expected(root / "expected_counts.txt")
    assert len(expected) == 200
    wrong = {}
    for name, count in expected.items():
        res = gpu_match(g, read_query(root / "queries" / f"{name}.graph"))
        if (res.count, res.complete) != (count, True):
            wrong[name] = (res.count, res.complete, count)
    assert wrong == {}


def test_hprd_all_queries_in_one_batch():
    root = dataset("hprd")
    g, expected = read_graph(root / "data.graph"), read_expected(root / "expected_counts.txt")
    names = list(expected)
    res = gpu_match_many(g, [read_query(root / "queries" / f"{name}.graph") for name in names])
    assert {n: (r.count, r.complete) for n, r in zip(names, res)} == {n: (c, True) for n, c in expected.items()}


# ---- the CPU engine's random cases, against brute force -------------------------------------
@pytest.mark.parametrize("seed", range(NUM_CASES), ids=lambda s: f"seed{s}")
def test_random_case(seed):
    kind, glabels, gedges, qlabels, qedges, truth = make_case(seed)
    g, q = to_graph(glabels, gedges, random.Random(seed * 7919 + 1)), to_graph(qlabels, qedges)
    ctx = f"seed={seed} kind={kind} q={qlabels} {qedges}"
    total = len(truth)
    res = gpu_match(g, q)
    assert (res.count, res.complete) == (total, True), ctx
    res, listed = gpu_collect(g, q)
    assert res.count == len(listed) == total and res.complete, ctx
    assert set(listed) == truth, ctx

    qadj = adjacency(len(qlabels), qedges)
    autos = brute_force(qadj, qlabels, qadj, qlabels)
    dres, dlisted = gpu_collect(g, q, distinct=True)
    assert dres.complete and dres.count * len(autos) == total == gpu_match(g, q, distinct=True).count * len(autos), ctx
    expanded = [tuple(m[a[u]] for u in range(len(qlabels))) for m in dlisted for a in autos]
    assert len(expanded) == len(set(expanded)) and set(expanded) == truth, ctx

    for limit in sorted({0, 1, total // 2, max(total - 1, 0), total, total + 1}):
        r = gpu_match(g, q, limit=limit)
        assert r.count == min(limit, total), f"limit={limit}; {ctx}"
        if limit != total:
            assert r.complete is (limit > total), f"limit={limit}; {ctx}"
        r, lim = gpu_collect(g, q, limit=limit, tuning=tuning(out_rows=32))
        assert r.count == len(lim) == min(limit, total), f"limit={limit} (rows); {ctx}"
        assert len(set(lim)) == len(lim) and set(lim) <= truth, f"limit={limit}; {ctx}"
        if limit != total:
            assert r.complete is (limit > total), f"limit={limit} (rows); {ctx}"

    # the smallest output buffer pauses and resumes the search at every batch
    r, small = gpu_collect(g, q, tuning=tuning(out_rows=32, offload_us=0.001))
    assert r.complete and len(small) == total and set(small) == truth, ctx


# ---- larger hub-heavy graphs, queries of 2..16 vertices, against the CPU engine ---------------
@lru_cache(maxsize=None)
def hub_case(seed: int):
    """A sparse random graph with 1-4 hubs of degree in the thousands and a query whose CPU
    count finishes within CPU_TIME_LIMIT (queries are redrawn, smaller, until one does)."""
    rng = random.Random(seed)
    n = rng.randint(2000, 4000)
    nlabels = rng.randint(2, 6)
    nelabels = 2 if rng.random() < 0.3 else 1
    labels = [rng.randrange(nlabels) for _ in range(n)]
    edges = {}
    for _ in range(n * rng.randint(1, 3)):
        a, b = rng.randrange(n), rng.randrange(n)
        if a != b:
            edges[(min(a, b), max(a, b))] = rng.randrange(nelabels)
    for h in rng.sample(range(n), rng.randint(1, 4)):
        for v in rng.sample(range(n), rng.randint(1000, n - 1)):
            if v != h:
                edges.setdefault((min(h, v), max(h, v)), rng.randrange(nelabels))
    gedges = [(a, b, el) for (a, b), el in edges.items()]
    g = to_graph(labels, gedges)
    gadj = adjacency(n, gedges)
    k = rng.randint(2, 16)
    while True:
        qd = extracted_query(rng, k, labels, gadj) if rng.random() < 0.8 else None
        qd = qd or random_connected_query(rng, k, nlabels, nelabels)
        q = to_graph(*qd)
        res = search(g, plan_query(g, q), time_limit=CPU_TIME_LIMIT)
        if res.complete:
            return g, q, res.count
        k = max(2, k - 2)


@pytest.mark.parametrize("seed", range(NUM_HUB_CASES), ids=lambda s: f"hub{s}")
def test_hub_case_equals_cpu(seed):
    g, q, total = hub_case(seed)
    ctx = f"seed={seed} |V(q)|={q.n} |E(q)|={q.num_edges} count={total} max degree={int(g.degrees.max())}"
    res = gpu_match(g, q)
    assert (res.count, res.complete) == (total, True), ctx
    _, aut = symmetry_constraints(q)
    d = gpu_match(g, q, distinct=True)
    assert d.complete and d.count * aut == total, ctx
    if total <= MAX_SET:
        cpu_rows = []
        search(g, plan_query(g, q), sink=lambda r: cpu_rows.append(np.array(r)))
        want = {tuple(x) for r in cpu_rows for x in r.tolist()}
        r, got = gpu_collect(g, q, tuning=tuning(out_rows=4096, offload_us=1.0))
        assert r.complete and len(got) == len(set(got)) == total and set(got) == want, ctx


@pytest.mark.parametrize("seed", range(0, NUM_HUB_CASES, 4), ids=lambda s: f"hub{s}")
def test_hub_graph_batch_equals_cpu(seed):
    """Many queries on one hub-heavy graph in one search: random ones (with edge labels the
    graph may lack), a one-vertex query and one whose label the graph lacks, beside the
    hub case's own; counts equal the CPU engine's, with --distinct too."""
    g, q, total = hub_case(seed)
    rng = random.Random(seed + 7)
    nlabels = int(g.labels.max()) + 1
    queries, want = [q], [total]
    while len(queries) < 24:
        cand = to_graph(*random_connected_query(rng, rng.randint(2, 8), nlabels, 2))
        res = search(g, plan_query(g, cand), time_limit=CPU_TIME_LIMIT)
        if res.complete:
            queries.append(cand)
            want.append(res.count)
    queries += [to_graph([1], []), to_graph([nlabels, 0], [(0, 1, 0)])]
    want += [int((g.labels == 1).sum()), 0]
    got = gpu_match_many(g, queries)
    assert [(r.count, r.complete) for r in got] == [(w, True) for w in want], f"seed={seed}"
    auts = [symmetry_constraints(x)[1] for x in queries]
    dist = gpu_match_many(g, queries, distinct=True)
    assert [r.count * a for r, a in zip(dist, auts)] == want and all(r.complete for r in dist), f"seed={seed}"


def test_hub_cases_are_varied():
    sizes, degrees, counts = set(), [], []
    for seed in range(0, NUM_HUB_CASES, 2):
        g, q, total = hub_case(seed)
        sizes.add(q.n)
        degrees.append(int(g.degrees.max()))
        counts.append(total)
    assert min(degrees) >= 1000
    assert max(sizes) >= 10 and min(sizes) <= 4
    assert sum(c > MAX_SET for c in counts) >= 1 and sum(0 < c <= MAX_SET for c in counts) >= 3


# ---- stopping early ------------------------------------------------------------------------
def star_graph():
    """A hub with 3000 leaves: a 7-vertex star query has ~3000^6 embeddings."""
    n = 3001
    return to_graph([0] * n, [(0, v, 0) for v in range(1, n)]), to_graph([0] * 7, [(0, v, 0) for v in range(1, 7)])


def test_time_limit_stops_inside_the_search():
    g, q = star_graph()
    res = gpu_match(g, q, time_limit=0.2)
    assert not res.complete and res.seconds < 2.0 and res.count > 0
    res, rows = gpu_collect(g, q, time_limit=0.2)
    assert not res.complete and res.seconds < 2.0 and len(rows) == res.count == len(set(rows))


def test_batch_time_limit_marks_only_unfinished_queries():
    g, star = star_graph()
    edge = to_graph([0, 0], [(0, 1, 0)])
    res = gpu_match_many(g, [edge, star, edge], time_limit=0.5)
    assert [(r.count, r.complete) for r in (res[0], res[2])] == [(6000, True)] * 2
    assert not res[1].complete and res[1].seconds < 3.0


def test_limit_stops_a_huge_search():
    g, q = star_graph()
    assert (gpu_match(g, q, limit=10**9).count, gpu_match(g, q, limit=10**9).complete) == (10**9, False)
    res, rows = gpu_collect(g, q, limit=100_000, tuning=tuning(out_rows=1000))
    assert res.count == len(rows) == len(set(rows)) == 100_000 and not res.complete


# ---- the command line ------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["gpu", "auto"])
def test_cli_match_on_gpu(backend, tmp_path, capsys):
    _, glabels, gedges, qlabels, qedges, truth = make_case(1037)
    write_graph_file(tmp_path / "data.graph", glabels, gedges, random.Random(1))
    write_query_file(tmp_path / "q.graph", qlabels, qedges)
    (res,) = run_cli(capsys, ["match", "--backend", backend, "--json", "--data", str(tmp_path / "data.graph"),
                              "--query", str(tmp_path / "q.graph")])
    assert res["backend"] == "gpu" and res["matches"] == len(truth) and res["complete"] is True


def test_cli_match_batch_on_gpu(tmp_path, capsys):
    """Several queries without --limit or --output run as one batch: counts equal the CPU's."""
    _, glabels, gedges, _, _, _ = make_case(1037)
    write_graph_file(tmp_path / "data.graph", glabels, gedges, random.Random(1))
    rng = random.Random(5)
    (tmp_path / "qs").mkdir()
    for i in range(12):
        write_query_file(tmp_path / "qs" / f"q{i}.graph", *random_connected_query(rng, rng.randint(2, 6), 3, 1))
    argv = ["match", "--json", "--data", str(tmp_path / "data.graph"), "--query", str(tmp_path / "qs")]
    gpu = run_cli(capsys, argv + ["--backend", "gpu"])
    cpu = run_cli(capsys, argv + ["--backend", "cpu"])
    assert [(r["query"], r["matches"], r["complete"]) for r in gpu] == \
        [(r["query"], r["matches"], r["complete"]) for r in cpu]
    assert sum(r["matches"] for r in cpu) > 0 and {r["backend"] for r in gpu} == {"gpu"}


# ---- github: trillions of matches ------------------------------------------------------------
@pytest.mark.slow
def test_github_queries_complete():
    root = dataset("github")
    g = read_graph(root / "data.graph")
    for i in range(22):
        res = gpu_match(g, read_query(root / "queries" / f"Q_{i}.graph"))
        assert res.complete and res.count > 0, f"Q_{i}"
