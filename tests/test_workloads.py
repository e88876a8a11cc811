"""bench/workloads.py on a tiny workload: what the full-size one promises, checked where it is cheap.

The generator is run as a user runs it (its command line); its files are read back with csmd's
own readers and, where the promise is about the text itself (no repeated pair, degrees that
RapidFlow's loader sizes its arrays by), parsed here independently.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from csmd.backends import static_matcher
from csmd.model.formats import query_files, read_graph, read_query, read_updates
from csmd.model.graph import Graph
from csmd.testing.kafka import REPO

SIZES, QUERIES = (4, 6, 8), 4  # a query set's size classes and queries per set, kept small


def build(out: Path, seed: int = 1) -> Path:
    subprocess.run([sys.executable, str(REPO / "bench" / "workloads.py"), "--out", str(out), "--seed", str(seed),
                    "--scale", "0.0005", "--queries", str(QUERIES), "--sizes", ",".join(map(str, SIZES))],
                   check=True, capture_output=True)
    return out


def files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def edge_lines(path: Path) -> np.ndarray:
    """(op sign, u, v) of every e / -e line, parsed without csmd."""
    rows = [(-1 if f[0] == "-e" else 1, int(f[1]), int(f[2])) for f in map(str.split, path.read_text().splitlines())
            if f and f[0] in ("e", "-e")]
    return np.array(rows, np.int64).reshape(-1, 3)


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    root = build(tmp_path_factory.mktemp("workload"))
    return root, json.loads((root / "workload.json").read_text())


def test_the_same_seed_builds_the_same_bytes_and_the_manifest_says_so(workload, tmp_path):
    root, _ = workload
    first, again = files(root), files(build(tmp_path / "again"))
    assert first == again
    listed = dict(reversed(line.split("  ", 1)) for line in first["MANIFEST.sha256"].decode().splitlines())
    assert listed == {name: hashlib.sha256(data).hexdigest() for name, data in first.items()
                      if name != "MANIFEST.sha256"}
    assert files(build(tmp_path / "other", seed=2))["data.graph"] != first["data.graph"]


def test_the_graph_and_the_streams_are_what_they_claim(workload):
    root, info = workload
    g = read_graph(root / "data.graph")  # csmd checks the `t N M` header against the lines
    assert (g.n, g.num_edges) == (info["vertices"], info["initial_edges"])
    assert g.labels.min() >= 0 and g.labels.max() < info["labels"]
    vertex = np.array([f[1:] for f in map(str.split, (root / "data.graph").read_text().splitlines()) if f[0] == "v"],
                      np.int64)
    initial = edge_lines(root / "data.graph")[:, 1:]
    assert np.array_equal(vertex[:, 0], np.arange(g.n))  # in id order, as RapidFlow's loader needs them
    assert np.array_equal(vertex[:, 2], np.bincount(initial.ravel(), minlength=g.n))  # the degrees it sizes by
    inserted = edge_lines(root / "insertion.graph")
    assert (inserted[:, 0] == 1).all() and len(inserted) == info["insertions"]
    whole = np.concatenate([initial, inserted[:, 1:]])
    assert (whole[:, 0] < whole[:, 1]).all() and whole.min() >= 0 and whole.max() < g.n  # no self-loop
    assert len({(u, v) for u, v in whole.tolist()}) == len(whole) == info["edges"]  # none twice, stream's new
    assert [(u.op, u.u, u.v) for u in read_updates(root / "insertion.graph")] == \
        [("e", u, v) for u, v in inserted[:, 1:].tolist()]


def test_every_op_of_the_mixed_stream_is_valid_where_it_stands(workload):
    root, info = workload
    live = {(u, v) for u, v in edge_lines(root / "data.graph")[:, 1:].tolist()}
    ops = edge_lines(root / "mixed.graph")
    for sign, u, v in ops.tolist():
        assert ((u, v) in live) == (sign < 0), (sign, u, v)
        (live.discard if sign < 0 else live.add)((u, v))
    deletions = ops[:, 0] < 0
    assert (deletions.sum(), (~deletions).sum()) == (info["mixed"]["deletions"], info["mixed"]["insertions"])
    ins = [(u, v) for u, v in ops[~deletions][:, 1:].tolist()]
    held = {tuple(e) for e in edge_lines(root / "insertion.graph")[:, 1:].tolist()}
    assert [e for e in ins if e in held] == [tuple(e) for e in edge_lines(root / "insertion.graph")[:, 1:].tolist()]
    assert 0 < info["mixed"]["deletions"] and len(ins) > len(held)  # deletions, and some edges inserted again
    assert [(u.op, u.u, u.v) for u in read_updates(root / "mixed.graph")] == \
        [("-e" if s < 0 else "e", u, v) for s, u, v in ops.tolist()]


def test_every_query_has_its_size_and_density_and_a_match_in_the_whole_graph(workload):
    root, info = workload
    g0 = read_graph(root / "data.graph")
    added = edge_lines(root / "insertion.graph")
    s, d, _ = g0.arcs()
    whole = Graph.from_edges(g0.labels, np.concatenate([s, added[:, 1]]), np.concatenate([d, added[:, 2]]))
    matcher = static_matcher("cpu")
    for k in SIZES:
        for density in ("tree", "sparse", "dense"):
            paths = query_files([root / "queries" / f"{density}_{k}"])
            assert len(paths) == QUERIES == info["query_sets"][f"{density}_{k}"]
            for path in paths:
                q = read_query(path)  # refuses a disconnected query
                m = q.num_edges
                assert q.n == k and {"tree": m == k - 1, "sparse": k <= m and 2 * m < 3 * k,
                                     "dense": 2 * m >= 3 * k}[density], (path.name, m)
                assert matcher.match(whole, q, limit=1).count >= 1, path.name


def test_csmd_replays_the_streams(workload):
    root, info = workload
    for stream, updates in (("insertion.graph", info["insertions"]),
                            ("mixed.graph", info["mixed"]["insertions"] + info["mixed"]["deletions"])):
        run = subprocess.run([sys.executable, "-m", "csmd", "replay", "--backend", "cpu", "--count-only", "--json",
                              "--data", str(root / "data.graph"), "--stream", str(root / stream), "--query",
                              str(root / "queries" / "dense_6"), str(root / "queries" / "tree_4")],
                             capture_output=True, text=True, check=True)
        rows = [json.loads(line) for line in run.stdout.splitlines()]
        assert len(rows) == 2 * QUERIES
        assert all(r["updates"] == updates and r["ignored"] == 0 for r in rows), rows[0]
