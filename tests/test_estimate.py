"""Approximate counting against independent truth: brute-force counts and HPRD's expected counts.

Each check runs on the CPU sampler and, where CuPy sees a device, on the GPU sampler (marked gpu).

Every run is seeded, so each statistical check below either always passes or always
fails; the tolerances are wide enough (4 standard errors, 90% coverage of nominal 95%
intervals) that a correct estimator passes them for all but a vanishing share of seeds.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from csmd.cli import main
from csmd.backends import gpu_unavailable_reason, make_sampler
from csmd.jobs.estimate import run_estimate
from csmd.model.graph import Graph
from csmd.model.labels import NO_NAMES
from csmd.model.plan import plan_query
from csmd.service.admin import _estimate

from brute import embeddings
from helpers import host
from static_cases import random_case

RUNS = 40  # seeded runs per case for the unbiasedness check
TOLERANCE_SE = 4.0
GPU_MARKS = [pytest.mark.gpu, pytest.mark.skipif(gpu_unavailable_reason() is not None,
                                                 reason=str(gpu_unavailable_reason()))]
GPU = pytest.param("gpu", marks=GPU_MARKS)
BACKENDS = ["cpu", GPU]


def gpu_case(method, trawl=0, stream=None):
    return pytest.param("gpu", method, trawl, stream, marks=GPU_MARKS)


def force_streaming(monkeypatch, stream) -> None:
    """Run the GPU sampler's warp streaming from refine sets of `stream` entries on (None: its default)."""
    if stream is not None:
        import csmd.gpu.sampler

        monkeypatch.setattr(csmd.gpu.sampler, "STREAM_MIN", stream)


@pytest.mark.parametrize("backend, method, trawl, stream", [
    ("cpu", "wj", 0, None), ("cpu", "alley", 0, None), ("cpu", "wj", 2, None),
    gpu_case("wj"), gpu_case("alley"), gpu_case("alley", stream=1), gpu_case("wj", 2), gpu_case("alley", 2),
    gpu_case("alley", 1, stream=1)])
@pytest.mark.parametrize("case", range(10))
def test_mean_of_seeded_runs_is_within_its_standard_errors_of_the_exact_count(backend, method, trawl, stream, case,
                                                                             monkeypatch):
    """stream=1: every Alley refine set is scanned by the whole warp (warp streaming)."""
    force_streaming(monkeypatch, stream)
    g, q, adj, labels = random_case(case)
    exact = sum(1 for _ in embeddings(adj, labels, q))
    assert exact > 0
    runs = np.array([run_estimate(g, q, "q", method=method, samples=1024, seed=s, trawl=trawl,
                                  backend=backend)["estimate"] for s in range(RUNS)])
    se = runs.std(ddof=1) / np.sqrt(RUNS)
    assert abs(runs.mean() - exact) <= TOLERANCE_SE * se + 1e-9 * exact, (runs.mean(), se, exact)


def dense_graph(n: int, p: float, seed: int) -> Graph:
    rnd = np.random.default_rng(seed)
    a, b = np.triu_indices(n, 1)
    keep = rnd.random(len(a)) < p
    return Graph.from_edges([0] * n, a[keep], b[keep])


@pytest.mark.parametrize("backend, stream", [("cpu", None), pytest.param("gpu", None, marks=GPU_MARKS),
                                             pytest.param("gpu", 1, marks=GPU_MARKS)])
def test_triangles_in_a_dense_graph(backend, stream, monkeypatch):
    """Alley's refine sets of ~50 members out of ~100 entries: several steps of warp streaming's
    reservoir sampling. Exact: the ordered triangles, trace(A^3)."""
    force_streaming(monkeypatch, stream)
    g = dense_graph(200, 0.5, seed=3)
    a = np.zeros((g.n, g.n), np.int64)
    a[np.repeat(np.arange(g.n), np.diff(g.indptr)), g.indices] = 1
    exact = int(np.trace(a @ a @ a))
    runs = np.array([run_estimate(g, cycle_graph(3), "q", method="alley", samples=1024, seed=s,
                                  backend=backend)["estimate"] for s in range(RUNS)])
    se = runs.std(ddof=1) / np.sqrt(RUNS)
    assert abs(runs.mean() - exact) <= TOLERANCE_SE * se, (runs.mean(), se, exact)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["wj", "alley"])
def test_intervals_cover_hprd_expected_counts(hprd_queries, method, backend):
    """All 200 HPRD queries, 8,192 samples each (32 blocks); each query its own seed, so the
    200 coverage events are independent."""
    g, queries = hprd_queries
    covered = 0
    for seed, (name, (q, exact)) in enumerate(sorted(queries.items())):
        res = run_estimate(g, q, name, method=method, samples=8192, seed=seed, backend=backend)
        covered += res["ci_low"] <= exact <= res["ci_high"]
    assert covered >= 0.9 * len(queries), covered


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_seed_same_estimate(hprd_queries, backend):
    g, queries = hprd_queries
    q, _ = queries["query_dense_16_11"]  # one whose walks have different weights
    runs = [run_estimate(g, q, "q", method="wj", samples=4096, seed=s, backend=backend) for s in (7, 7, 8)]
    for r in runs:
        r.pop("seconds")
    assert runs[0] == runs[1]
    assert runs[0]["estimate"] != runs[2]["estimate"]
    # a round's samples depend on (seed, round) alone, not on what was drawn before
    s = make_sampler(backend, g, plan_query(g, q), "alley", 3)
    later = host(s.draw(5, 2048))
    s.draw(0, 4096)
    assert np.array_equal(host(s.draw(5, 2048)), later)


def cycle_graph(n: int) -> Graph:
    return Graph.from_edges([0] * n, list(range(n)), [(i + 1) % n for i in range(n)])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["wj", "alley"])
def test_no_valid_sample_is_no_information(method, backend):
    """A triangle in a hexagon: every vertex passes the filters, every walk fails."""
    res = run_estimate(cycle_graph(6), cycle_graph(3), "triangle", method=method, samples=2048, backend=backend)
    assert res["valid_samples"] == 0 and res["samples"] >= 2048
    assert res["estimate"] is None and res["ci_low"] is None and res["ci_high"] is None
    assert res["exact"] is False


def test_filter_proof_of_no_match_is_exact_zero():
    q = Graph.from_edges([0, 1], [0], [1])  # label 1 does not occur in the data
    res = run_estimate(cycle_graph(6), q, "q", samples=100)
    assert res["estimate"] == 0 and res["ci_low"] == res["ci_high"] == 0 and res["exact"] is True
    assert res["samples"] == 0


def test_rel_error_stop_reaches_its_target(hprd_queries):
    g, queries = hprd_queries
    q, exact = queries["query_dense_16_160"]
    res = run_estimate(g, q, "q", rel_error=0.01, time_limit=30)
    assert (res["ci_high"] - res["estimate"]) / res["estimate"] <= 0.01
    assert res["ci_low"] <= exact <= res["ci_high"]


# ---- the command line ------------------------------------------------------------------------------
def write_graph(path, g: Graph):
    s, d, e = g.edge_list()
    lines = [f"v {v} {lab}" for v, lab in enumerate(g.labels.tolist())]
    lines += [f"e {a} {b} {el}" for a, b, el in zip(s.tolist(), d.tolist(), e.tolist())]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_cli_json_lines(tmp_path, capsys):
    g, q, adj, labels = random_case(3)
    exact = sum(1 for _ in embeddings(adj, labels, q))
    data, query = write_graph(tmp_path / "g.graph", g), write_graph(tmp_path / "q.graph", q)
    assert main(["estimate", "--json", "--data", data, "--query", query, query, "--samples", "20000",
                 "--seed", "4", "--method", "wj"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 and rows[0] == {**rows[1], "seconds": rows[0]["seconds"]}
    r = rows[0]
    assert {"query", "estimate", "ci_low", "ci_high", "confidence", "samples", "valid_samples", "seconds",
            "method", "backend"} <= set(r)
    assert r["query"] == "q" and r["method"] == "wj" and r["confidence"] == 0.95
    assert r["backend"] == ("cpu" if gpu_unavailable_reason() else "gpu")  # auto
    assert r["samples"] >= 20000 and 0 < r["valid_samples"] <= r["samples"]
    assert r["ci_low"] <= exact <= r["ci_high"]


def test_cli_table_says_no_information(tmp_path, capsys):
    data, query = write_graph(tmp_path / "g.graph", cycle_graph(6)), write_graph(tmp_path / "q.graph", cycle_graph(3))
    assert main(["estimate", "--data", data, "--query", query, "--samples", "512"]) == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[:4] == ["q", "no", "info", "-"]


@pytest.mark.parametrize("flag, value, message", [
    ("--query", "BAD.graph", "BAD.graph:2: "),
    ("--data", "MISSING.graph", "MISSING.graph: No such file or directory"),
    ("--seed", str(2**128), "seed must be in 0 .. 2**128 - 1"),
])
def test_cli_errors_exit_2(tmp_path, capsys, flag, value, message):
    (tmp_path / "BAD.graph").write_text("v 0 0\nv 1 x\n")
    opts = {"--data": write_graph(tmp_path / "g.graph", cycle_graph(6)),
            "--query": write_graph(tmp_path / "q.graph", cycle_graph(3)), "--backend": "gpu", "--seed": "0"}
    if gpu_unavailable_reason() is not None:
        opts["--backend"] = "auto"
    opts[flag] = str(tmp_path / value) if flag in ("--data", "--query") else value
    assert main(["estimate", *[x for kv in opts.items() for x in kv]]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("args", [["--samples", "10", "--rel-error", "0.1"], ["--seed", "-1"],
                                  ["--method", "exact"], ["--rel-error", "0"]])
def test_cli_bad_options_exit_2(tmp_path, args):
    with pytest.raises(SystemExit) as exc:
        main(["estimate", "--data", "g", "--query", "q", *args])
    assert exc.value.code == 2


# ---- the admin endpoint --------------------------------------------------------------------------------
class LiveGraph:
    """What the admin endpoint reads of a daemon: the live graph, its timestamp, the engine's name and
    the label names."""

    def __init__(self, g: Graph, seq: int, engine: str = "cpu"):
        self.g, self.seq, self.labels = g, seq, NO_NAMES
        self.pipe = SimpleNamespace(engine=SimpleNamespace(name=engine))

    def live_graph(self):
        return self.g, self.seq


@pytest.mark.parametrize("engine", BACKENDS)
def test_admin_estimate_reads_the_live_graph_at_its_timestamp(tmp_path, engine):
    g, q, adj, labels = random_case(5)
    exact = sum(1 for _ in embeddings(adj, labels, q))
    text = open(write_graph(tmp_path / "q.graph", q)).read()
    res = _estimate(LiveGraph(g, 1234, engine), {"query": text, "name": "q", "samples": 20000, "seed": 2})
    assert res["seq"] == 1234 and res["edges"] == g.num_edges and res["backend"] == engine
    assert res["ci_low"] <= exact <= res["ci_high"]
    with pytest.raises(Exception, match="samples"):
        _estimate(LiveGraph(g, 0), {"query": text, "samples": -5})
    with pytest.raises(Exception, match="method"):
        _estimate(LiveGraph(g, 0), {"query": text, "method": "exact"})
