"""Randomized tests of the static CPU matcher against independent truth.

Truth comes from two places that share no code with csmd:
  * `brute_force` (brute.py): plain Python backtracking over injective maps with
    vertex-label and edge-label checks (non-induced; automorphic embeddings are
    separate matches, docs/design.md section 1);
  * networkx's GraphMatcher monomorphism enumeration.

Every case is seeded (static_cases.py): a failure names the seed, and `make_case(seed)` rebuilds it.
"""

from __future__ import annotations

import random

import networkx as nx
import numpy as np
import pyarrow.ipc as ipc
import pytest
from networkx.algorithms.isomorphism import GraphMatcher

from csmd.cpu import compiled, matcher
from csmd.model.plan import plan_query, symmetry_constraints

from brute import adjacency, brute_force
from static_cases import ext_of, make_case, run_cli, to_graph, write_graph_file, write_query_file

NUM_CASES = 300
NX_MAX = 4_000  # networkx cross-check only below this many embeddings (it is the slowest part)


# ---- independent truth ---------------------------------------------------------------
def networkx_embeddings(gadj, glab, qadj, qlab):
    def build(adj, lab):
        G = nx.Graph()
        for v, l in enumerate(lab):
            G.add_node(v, label=l)
        for a, nb in enumerate(adj):
            for b, el in nb.items():
                if a < b:
                    G.add_edge(a, b, label=el)
        return G

    gm = GraphMatcher(build(gadj, glab), build(qadj, qlab),
                      node_match=lambda x, y: x["label"] == y["label"],
                      edge_match=lambda x, y: x["label"] == y["label"])
    out = []
    for m in gm.subgraph_monomorphisms_iter():  # data vertex -> query vertex
        row = [-1] * len(qlab)
        for v, u in m.items():
            row[u] = v
        out.append(tuple(row))
    return out


# ---- random cases ------------------------------------------------------------------
# the static searches of the compiled and the numpy CPU engine, each against the truth
SEARCHES = {"cpu": compiled.search, "numpy": matcher.search}


@pytest.fixture(params=sorted(SEARCHES))
def search(request):
    return SEARCHES[request.param]


def collect(search, g, plan, **kw):
    rows = []
    res = search(g, plan, sink=lambda r: rows.append(np.array(r)), **kw)
    for r in rows:
        assert r.dtype == np.int32 and r.ndim == 2 and r.shape[1] == plan.query.n
    listed = [tuple(x) for r in rows for x in r.tolist()]
    return res, listed


# ---- the random static cases -----------------------------------------------------------
@pytest.mark.parametrize("seed", range(NUM_CASES), ids=lambda s: f"seed{s}")
def test_random_case(seed, search):
    kind, glabels, gedges, qlabels, qedges, truth = make_case(seed)
    rng = random.Random(seed * 7919 + 1)
    g = to_graph(glabels, gedges, rng)
    q = to_graph(qlabels, qedges)
    gadj, qadj = adjacency(len(glabels), gedges), adjacency(len(qlabels), qedges)
    ctx = f"seed={seed} kind={kind} |V(G)|={len(glabels)} |E(G)|={len(gedges)} q={qlabels} {qedges}"
    total = len(truth)

    # the graph csmd built is the one the truth was computed on
    s, d, e = g.edge_list()
    assert sorted(zip(s.tolist(), d.tolist(), e.tolist())) == sorted(gedges), ctx

    # (2) counts and the streamed match set
    plan = plan_query(g, q)
    res = search(g, plan)
    assert (res.count, res.complete) == (total, True), ctx
    res, listed = collect(search, g, plan)
    assert res.count == total and res.complete, ctx
    assert len(listed) == len(set(listed)), f"duplicate matches streamed; {ctx}"
    assert set(listed) == truth, ctx

    if total <= NX_MAX:
        nxm = networkx_embeddings(gadj, glabels, qadj, qlabels)
        assert len(nxm) == total and set(nxm) == truth, ctx

    # (3) symmetry breaking: distinct * |Aut(q)| = embeddings, |Aut(q)| by brute force
    autos = brute_force(qadj, qlabels, qadj, qlabels)
    _, aut_size = symmetry_constraints(q)
    assert aut_size == len(autos), ctx
    dplan = plan_query(g, q, distinct=True)
    dres, dlisted = collect(search, g, dplan)
    assert dres.complete and dres.count * aut_size == total, ctx
    assert len(dlisted) == dres.count, ctx
    # each distinct match stands for one Aut(q) orbit of embeddings; together they cover all
    expanded = [tuple(m[a[u]] for u in range(len(qlabels))) for m in dlisted for a in autos]
    assert len(expanded) == len(set(expanded)) and set(expanded) == truth, ctx

    # (4) limit: count == min(limit, total); complete is False when matches were left
    # unreported and True when the search ran out first. At limit == total the search
    # stops on reaching the limit without looking further, so complete is not asserted.
    for limit in sorted({0, 1, total // 2, max(total - 1, 0), total, total + 1, total + 10}):
        r = search(g, plan, limit=limit)
        assert r.count == min(limit, total), f"limit={limit}; {ctx}"
        if limit < total:
            assert not r.complete, f"limit={limit}; {ctx}"
        if limit > total:
            assert r.complete, f"limit={limit}; {ctx}"
        r, lim_listed = collect(search, g, plan, limit=limit)
        assert r.count == min(limit, total) == len(lim_listed), f"limit={limit} (sink); {ctx}"
        assert len(set(lim_listed)) == len(lim_listed) and set(lim_listed) <= truth, f"limit={limit}; {ctx}"
        if limit > total:
            assert r.complete, f"limit={limit} (sink); {ctx}"
        elif limit < total:
            assert not r.complete, f"limit={limit} (sink); {ctx}"

    # (5) a tiny memory budget (smallest chunks) changes nothing
    r = search(g, plan, budget_bytes=1)
    assert (r.count, r.complete) == (total, True), ctx
    r, small = collect(search, g, plan, budget_bytes=1)
    assert len(small) == len(set(small)) and set(small) == truth, ctx
    r = search(g, dplan, budget_bytes=1)
    assert r.count == dres.count, ctx


def test_cases_are_varied():
    """The random cases cover empty and non-empty results, edge labels and larger counts."""
    counts, elabelled = [], 0
    for seed in range(0, NUM_CASES, 3):
        _, _, gedges, _, qedges, truth = make_case(seed)
        counts.append(len(truth))
        elabelled += any(el for *_, el in gedges + qedges)
    assert sum(c == 0 for c in counts) >= 5
    assert sum(c > 0 for c in counts) >= 50
    assert sum(c > 2048 for c in counts) >= 3  # several chunks even at the default cap floor
    assert elabelled >= 10


# ---- hubs larger than one chunk --------------------------------------------------------
def hub_graph(seed: int, leaves: int):
    """One hub (label 0) with many label-1 leaves, a few label-2 leaves, and sparse leaf edges."""
    rng = random.Random(seed)
    n = 1 + leaves + 6
    labels = [0] + [1] * leaves + [2] * 6
    edges = {(0, v): 0 for v in range(1, n)}
    for _ in range(leaves // 2):
        a, b = sorted(rng.sample(range(1, n), 2))
        edges[(a, b)] = rng.randrange(2)
    second = rng.randrange(1, leaves)  # a second, smaller hub among the leaves
    for v in rng.sample(range(1, n), leaves // 3):
        if v != second:
            edges.setdefault((min(second, v), max(second, v)), 0)
    return labels, [(a, b, el) for (a, b), el in edges.items()]


HUB_QUERIES = {
    "edge": ([0, 1], [(0, 1, 0)]),
    "triangle": ([0, 1, 1], [(0, 1, 0), (0, 2, 0), (1, 2, 0)]),
    "triangle_el1": ([0, 1, 1], [(0, 1, 0), (0, 2, 0), (1, 2, 1)]),
    "fan": ([1, 0, 2], [(0, 1, 0), (1, 2, 0)]),
    "tailed": ([0, 1, 1, 2], [(0, 1, 0), (1, 2, 0), (0, 2, 0), (0, 3, 0)]),
    "leafpath": ([1, 1, 0], [(0, 1, 0), (1, 2, 0)]),
}


@pytest.mark.parametrize("name", sorted(HUB_QUERIES))
def test_hub_ranges_split(name, search):
    """Hub degree > 2 x the smallest chunk cap (1024), so budget_bytes=1 splits its ranges."""
    glabels, gedges = hub_graph(5, 2600)
    qlabels, qedges = HUB_QUERIES[name]
    gadj, qadj = adjacency(len(glabels), gedges), adjacency(len(qlabels), qedges)
    truth = brute_force(gadj, glabels, qadj, qlabels)
    assert truth, name
    g, q = to_graph(glabels, gedges), to_graph(qlabels, qedges)
    plan = plan_query(g, q)
    for budget in (1, 64 << 10, 256 << 20):
        r, listed = collect(search, g, plan, budget_bytes=budget)
        assert (r.count, r.complete) == (len(truth), True), f"{name} budget={budget}"
        assert len(listed) == len(set(listed)) and set(listed) == truth, f"{name} budget={budget}"
        assert search(g, plan, budget_bytes=budget).count == len(truth), f"{name} budget={budget}"
    k = len(truth) // 3 + 1
    r, listed = collect(search, g, plan, budget_bytes=1, limit=k)
    assert r.count == len(listed) == k and not r.complete and set(listed) <= truth, name
    _, aut = symmetry_constraints(q)
    assert search(g, plan_query(g, q, distinct=True), budget_bytes=1).count * aut == len(truth), name


# ---- end to end through the CLI ------------------------------------------------------------
def read_matches(path):
    table = ipc.open_file(str(path)).read_all()
    assert table.column_names == ["query", "index", "vertices"]
    by_query = {}
    for name, idx, verts in zip(*(table.column(c).to_pylist() for c in table.column_names)):
        by_query.setdefault(name, []).append((idx, tuple(verts)))
    return by_query


CLI_SEEDS = [1000 + 37 * i for i in range(20)]


@pytest.mark.parametrize("seed", CLI_SEEDS, ids=lambda s: f"seed{s}")
def test_cli_match_output(seed, tmp_path, capsys):
    kind, glabels, gedges, qlabels, qedges, truth = make_case(seed)
    rng = random.Random(seed)
    write_graph_file(tmp_path / "data.graph", glabels, gedges, rng)
    write_query_file(tmp_path / "qa.graph", qlabels, qedges)
    # a second query: the data-graph edge (with its labels), so files hold two queries
    a, b, el = gedges[0]
    q2 = ([glabels[a], glabels[b]], [(0, 1, el)])
    write_query_file(tmp_path / "qb.graph", *q2)
    gadj = adjacency(len(glabels), gedges)
    truth2 = brute_force(gadj, glabels, adjacency(2, q2[1]), q2[0])
    out = tmp_path / "m.arrow"
    results = run_cli(capsys, ["match", "--data", str(tmp_path / "data.graph"),
                               "--query", str(tmp_path / "qa.graph"), str(tmp_path / "qb.graph"),
                               "--output", str(out), "--json"])
    ctx = f"seed={seed} kind={kind} q={qlabels} {qedges}"
    assert [r["query"] for r in results] == ["qa", "qb"], ctx
    assert [r["matches"] for r in results] == [len(truth), len(truth2)], ctx
    assert all(r["complete"] is True and r["distinct"] is False for r in results), ctx
    written = read_matches(out)
    for name, t in (("qa", truth), ("qb", truth2)):
        rows = written.get(name, [])
        assert [i for i, _ in rows] == list(range(len(t))), f"{name}: index column; {ctx}"
        got = [v for _, v in rows]
        want = {tuple(ext_of(x) for x in m) for m in t}
        assert len(got) == len(set(got)) and set(got) == want, f"{name}; {ctx}"


@pytest.mark.parametrize("seed", CLI_SEEDS[:5], ids=lambda s: f"seed{s}")
def test_cli_distinct(seed, tmp_path, capsys):
    kind, glabels, gedges, qlabels, qedges, truth = make_case(seed)
    rng = random.Random(seed + 1)
    write_graph_file(tmp_path / "data.graph", glabels, gedges, rng)
    write_query_file(tmp_path / "q.graph", qlabels, qedges)
    qadj = adjacency(len(qlabels), qedges)
    autos = brute_force(qadj, qlabels, qadj, qlabels)
    out = tmp_path / "m.arrow"
    (res,) = run_cli(capsys, ["match", "--data", str(tmp_path / "data.graph"), "--query",
                              str(tmp_path / "q.graph"), "--distinct", "--output", str(out), "--json"])
    ctx = f"seed={seed} kind={kind} q={qlabels} {qedges}"
    assert res["distinct"] is True and res["complete"] is True, ctx
    assert res["matches"] * len(autos) == len(truth), ctx
    got = [v for _, v in read_matches(out).get("q", [])]
    assert len(got) == res["matches"], ctx
    expanded = [tuple(m[a[u]] for u in range(len(qlabels))) for m in got for a in autos]
    want = {tuple(ext_of(x) for x in m) for m in truth}
    assert len(expanded) == len(set(expanded)) and set(expanded) == want, ctx


@pytest.mark.parametrize("seed", CLI_SEEDS[5:8], ids=lambda s: f"seed{s}")
def test_cli_limit(seed, tmp_path, capsys):
    _, glabels, gedges, qlabels, qedges, truth = make_case(seed)
    write_graph_file(tmp_path / "data.graph", glabels, gedges, random.Random(seed))
    write_query_file(tmp_path / "q.graph", qlabels, qedges)
    want = {tuple(ext_of(x) for x in m) for m in truth}
    for limit in sorted({0, len(truth) // 2, len(truth) + 1}):
        out = tmp_path / f"m{limit}.arrow"
        (res,) = run_cli(capsys, ["match", "--data", str(tmp_path / "data.graph"), "--query",
                                  str(tmp_path / "q.graph"), "--limit", str(limit), "--output", str(out), "--json"])
        assert res["matches"] == min(limit, len(truth)), f"seed={seed} limit={limit}"
        if limit != len(truth):  # at exactly the total, complete is not pinned down (see test_random_case)
            assert res["complete"] is (limit > len(truth)), f"seed={seed} limit={limit}"
        got = [v for _, v in read_matches(out).get("q", [])]
        assert len(got) == res["matches"] and len(set(got)) == len(got) and set(got) <= want
