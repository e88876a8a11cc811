"""Both text formats and Arrow/Parquet tables load to the same graph."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from csmd.model.formats import read_graph, write_graph_tables
from csmd.model.graph import Graph

from helpers import dataset


def write_ve_format(g: Graph, path, ext=None):
    """The `v id label` / `e u v label` format, vertices in reverse order to scramble internal ids."""
    ext = g.ext_ids if ext is None else ext
    s, d, e = g.edge_list()
    lines = ["# written by the test"] + [f"v {ext[i]} {g.labels[i]}" for i in range(g.n - 1, -1, -1)]
    lines += [f"e {ext[a]} {ext[b]} {c}" for a, b, c in zip(s, d, e)]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("name", ["hprd", "human"])
def test_all_formats_load_the_same_graph(tmp_path, name):
    g = read_graph(dataset(name) / "data.graph")
    assert g.n > 1000 and g.num_edges > 10000
    write_ve_format(g, tmp_path / "g.txt")
    write_graph_tables(g, tmp_path / "g.parquet")
    write_graph_tables(g, tmp_path / "g.arrow")
    for other in ("g.txt", "g.parquet", "g.arrow"):
        h = read_graph(tmp_path / other)
        assert g.same_as(h), other
        assert h.same_as(g), other


def test_known_small_graph_in_every_format(tmp_path):
    (tmp_path / "a.graph").write_text("t 3 3\nv 10 1 2\nv 20 2 2\nv 30 1 2\ne 10 20 1\ne 20 30\ne 30 10 2\n")
    (tmp_path / "b.graph").write_text("v 30 1\nv 20 2\nv 10 1\ne 20 10 1\ne 30 20 0\ne 10 30 2\ne 10 10 0\n")
    pq.write_table(pa.table({"src": [10, 20, 10, 20], "dst": [20, 30, 30, 10], "label": [1, 0, 2, 1]}), tmp_path / "c.parquet")
    pq.write_table(pa.table({"id": [10, 20, 30], "label": [1, 2, 1]}), tmp_path / "c.vertices.parquet")
    graphs = [read_graph(tmp_path / f) for f in ("a.graph", "b.graph", "c.parquet")]
    for g in graphs:
        assert g.n == 3 and g.num_edges == 3  # the self-loop and the repeated pair are dropped
        assert g.labels[g.index_of(20)] == 2
        a, b = g.index_of(10), g.index_of(30)
        assert g.edge_label_between(np.array([a]), np.array([b]))[0] == 2
        assert np.array_equal(g.neighbors(a), np.sort(g.neighbors(a)))
    assert graphs[0].same_as(graphs[1]) and graphs[0].same_as(graphs[2])


def test_string_vertex_ids_in_tables(tmp_path):
    pq.write_table(pa.table({"src": ["alice", "bob"], "dst": ["bob", "carol"]}), tmp_path / "s.parquet")
    g = read_graph(tmp_path / "s.parquet")
    assert g.n == 3 and g.num_edges == 2
    assert sorted(g.ext_ids.tolist()) == ["alice", "bob", "carol"]
    b = g.index_of("bob")
    assert sorted(g.ext_ids[g.neighbors(b)].tolist()) == ["alice", "carol"]
    write_graph_tables(g, tmp_path / "t.arrow")
    assert read_graph(tmp_path / "t.arrow").same_as(g)
