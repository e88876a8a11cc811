"""Directed graphs against brute force: static counts and continuous deltas on every engine, on
seeded random directed graphs with labels (reciprocal arcs, deletions, vertex deletions and
relabels included), and the messages where direction would silently change meaning."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import numpy as np
import pyarrow.ipc as ipc
import pytest

from brute import assert_deltas_equal, directed_embeddings
from csmd.jobs.replay import replay
from csmd.backends import static_matcher
from csmd.errors import CsmdError, InputError
from csmd.model.formats import parse_query_text, read_graph, read_query
from csmd.model.graph import Graph


def _query(rng: random.Random, k: int, labels: int, elabels: int) -> tuple[list[int], dict]:
    """A connected directed query of k vertices: a random tree with random directions, a few more
    arcs, sometimes the reverse of one (a reciprocal pair)."""
    qlabels = [rng.randrange(labels) for _ in range(k)]
    qarcs = {}
    for i in range(1, k):
        j = rng.randrange(i)
        qarcs[(i, j) if rng.random() < 0.5 else (j, i)] = rng.randrange(elabels)
    for _ in range(rng.randrange(3)):
        a, b = rng.sample(range(k), 2)
        qarcs.setdefault((a, b), rng.randrange(elabels))
    if rng.random() < 0.3:
        a, b = rng.choice(list(qarcs))
        qarcs.setdefault((b, a), rng.randrange(elabels))
    return qlabels, qarcs


def _query_text(qlabels, qarcs) -> str:
    return "".join(f"v {i} {lab}\n" for i, lab in enumerate(qlabels)) + \
        "".join(f"e {a} {b} {lab}\n" for (a, b), lab in qarcs.items())


def _graph(labels: dict, arcs: dict) -> Graph:
    ids = list(labels)
    pos = {v: i for i, v in enumerate(ids)}
    return Graph.from_edges([labels[v] for v in ids], [pos[a] for a, _ in arcs], [pos[b] for _, b in arcs],
                            list(arcs.values()), ids, directed=True)


def _automorphisms(qlabels, qarcs) -> int:
    k = len(qlabels)
    return sum(all(qlabels[p[u]] == qlabels[u] for u in range(k)) and
               all(qarcs.get((p[a], p[b])) == lab for (a, b), lab in qarcs.items())
               for p in itertools.permutations(range(k)))


@pytest.mark.parametrize("seed", range(40))
def test_static_counts_equal_brute_force(seed, backend):
    rng = random.Random(seed)
    n, nl, ne = rng.randrange(4, 11), rng.randrange(1, 3), rng.choice([1, 2])
    labels = {10 + i: rng.randrange(nl) for i in range(n)}
    arcs = {}
    for a, b in itertools.permutations(labels, 2):
        if rng.random() < rng.choice([0.15, 0.3]):
            arcs[(a, b)] = rng.randrange(ne)
    g = _graph(labels, arcs)
    for k in (2, 3, 4):
        qlabels, qarcs = _query(rng, k, nl, ne)
        q = parse_query_text(_query_text(qlabels, qarcs), "q", directed=True)
        want = sum(1 for _ in directed_embeddings(arcs, labels, qarcs, qlabels))
        aut = _automorphisms(qlabels, qarcs)
        m = static_matcher(backend)
        assert m.match(g, q).count == want, (seed, k, backend)
        assert m.match(g, q, distinct=True).count * aut == want, (seed, k, backend, "distinct")


class DirectedModel:
    """A directed graph and its random update records, applied by definition."""

    def __init__(self, rng: random.Random, n: int, labels: int, elabels: int, p: float, edges_only: bool = False):
        self.rng, self.labels, self.elabels, self.edges_only = rng, labels, elabels, edges_only
        self.vlabel = {100 + 3 * i: rng.randrange(labels) for i in range(n)}
        self.arcs = {(a, b): rng.randrange(elabels) for a, b in itertools.permutations(self.vlabel, 2)
                     if rng.random() < p}
        self.next_id = 100 + 3 * n

    def text(self) -> str:
        return "".join(f"v {v} {lab}\n" for v, lab in self.vlabel.items()) + \
            "".join(f"e {a} {b} {lab}\n" for (a, b), lab in self.arcs.items())

    def random_record(self) -> str:
        rng, ids = self.rng, list(self.vlabel)
        if len(ids) < 3:
            return f"v {self.next_id} {rng.randrange(self.labels)}"
        r = rng.random()
        if r < 0.45 or len(self.arcs) < 3:
            a, b = rng.sample(ids, 2)
            if self.arcs and rng.random() < 0.35:  # the reverse of an arc: a reciprocal pair
                b, a = rng.choice(list(self.arcs))
            if self.arcs and rng.random() < 0.06:  # an arc that exists: ignored
                a, b = rng.choice(list(self.arcs))
            return f"e {a} {b} {rng.randrange(self.elabels)}"
        if r < 0.82 or self.edges_only:
            a, b = rng.choice(list(self.arcs))
            if rng.random() < 0.15:  # its reverse, present or not
                a, b = b, a
            return f"-e {a} {b}"
        # a vertex record: a new vertex, a relabel, a deletion, or an arc from an unseen vertex
        kind = rng.choices(("new", "relabel", "delete", "arc"), (5, 2, 3 if len(ids) > 4 else 0, 1))[0]
        return {"new": f"v {self.next_id} {rng.randrange(self.labels)}",
                "relabel": f"v {rng.choice(ids)} {rng.randrange(self.labels)}",
                "delete": f"-v {rng.choice(ids)}", "arc": f"e {self.next_id + 1} {rng.choice(ids)} 0"}[kind]

    def apply(self, line: str) -> None:
        """The record's effect by definition (an edge to an unseen vertex creates it, label 0; a
        vertex record relabels; a vertex deletion takes its arcs both ways)."""
        op, *f = line.split()
        x = [int(t) for t in f]
        if op in ("e", "v"):
            for v in x[: 2 if op == "e" else 1]:
                if v not in self.vlabel or op == "v":
                    self.vlabel[v] = 0 if op == "e" else x[1]
                    self.next_id = max(self.next_id, v + 3)
            if op == "e":
                self.arcs.setdefault((x[0], x[1]), x[2])
        elif op == "-e":
            self.arcs.pop((x[0], x[1]), None)
        else:
            self.vlabel.pop(x[0], None)
            self.arcs = {arc: lab for arc, lab in self.arcs.items() if x[0] not in arc}

    def matches(self, qlabels, qarcs) -> set:
        return set(directed_embeddings(self.arcs, self.vlabel, qarcs, qlabels))


def _case(tmp_path, seed: int, steps: int = 60, edges_only: bool = False):
    """A random directed graph, two queries and a stream (edges_only: arcs between the graph's
    vertices only, so that whole batches take the sequencer's vectorized path), with the truth."""
    rng = random.Random(seed)
    model = DirectedModel(rng, rng.randrange(5, 11), rng.randrange(1, 3), rng.choice([1, 1, 2]), rng.uniform(0.1, 0.3),
                          edges_only)
    (tmp_path / "g0.graph").write_text(model.text())
    queries = {}
    for i, k in enumerate((2, rng.randrange(3, 5))):
        qlabels, qarcs = _query(rng, k, model.labels, model.elabels)
        path = tmp_path / f"q{i}.graph"
        path.write_text(_query_text(qlabels, qarcs))
        queries[path] = (qlabels, qarcs)
    truth = {p.stem: Counter() for p in queries}
    lines = []
    for lineno in range(1, steps + 1):
        line = model.random_record()
        before = {p.stem: model.matches(*q) for p, q in queries.items()}
        model.apply(line)
        for p, q in queries.items():
            after = model.matches(*q)
            truth[p.stem].update({(lineno, +1, m): 1 for m in after - before[p.stem]})
            truth[p.stem].update({(lineno, -1, m): 1 for m in before[p.stem] - after})
        lines.append(line)
    (tmp_path / "stream.txt").write_text("\n".join(lines) + "\n")
    return list(queries), truth


def _replay(tmp_path, qpaths, batch_size, backend, name="out.arrow"):
    g0 = read_graph(tmp_path / "g0.graph", directed=True)
    out = tmp_path / name
    results, _ = replay(g0, tmp_path / "stream.txt", [(p.stem, read_query(p, directed=True)) for p in qpaths],
                        batch_size=batch_size, count_only=False, output=out, show_progress=False, backend=backend)
    return ipc.open_file(out).read_all(), results


@pytest.mark.parametrize("seed", range(40))
def test_every_delta_equals_brute_force(tmp_path, seed, backend):
    qpaths, truth = _case(tmp_path, seed, edges_only=seed % 2 == 1)
    table, results = _replay(tmp_path, qpaths, random.Random(seed).choice([1, 3, 64]), backend)
    assert_deltas_equal(table, results, truth, seed)


@pytest.mark.parametrize("seed", range(100, 106))
def test_deltas_do_not_depend_on_batching(tmp_path, seed, backend):
    qpaths, _ = _case(tmp_path, seed, steps=80)
    reference, _ = _replay(tmp_path, qpaths, 1, "numpy", "ref.arrow")
    for b in (1, 7, 64):
        assert _replay(tmp_path, qpaths, b, backend, f"b{b}.arrow")[0].equals(reference), b


@pytest.mark.parametrize("seed", range(30))
def test_the_vectorized_sequencer_gives_the_record_by_record_batch(seed):
    """Edge records between known vertices take _check's numpy path: the same ops, stored ops and
    ignored counts as _general's step per record, whatever the pairs' histories in the batch."""
    from csmd.cpu.numpy_engine import CpuEngine
    from csmd.model.formats import parse_update
    from csmd.pipeline.sequencer import Sequencer, Vertices

    rng = random.Random(seed)
    model = DirectedModel(rng, rng.randrange(3, 7), 1, rng.choice([1, 2]), rng.uniform(0.2, 0.6), edges_only=True)
    g0 = read_graph_text(model.text())
    lines = []
    for _ in range(rng.randrange(20, 80)):
        line = model.random_record()
        if rng.random() < 0.05:
            a, b = rng.sample(list(model.vlabel), 2)
            line = rng.choice([f"e {a} {a} 0", f"e {a} {b} 20000", f"-e {a} {a}"])  # ignored: self-loop, label
        model.apply(line)
        lines.append(line)
    records = [parse_update(line, "s", i + 1) for i, line in enumerate(lines)]
    fast, slow = (Sequencer(Vertices(g0), CpuEngine(g0), directed=True) for _ in range(2))
    got, want = fast.sequence(records), slow._general(records, np.zeros(len(records)))
    for field in ("edge_seq", "edge_a", "edge_b", "edge_label", "edge_sign"):
        assert getattr(got, field).tolist() == getattr(want, field).tolist(), field
    assert [x.tolist() for x in got.stored] == [x.tolist() for x in want.stored]
    assert fast.ignored == slow.ignored


def test_an_arc_and_its_reverse_are_two_edges():
    g = read_graph_text("v 1 0\nv 2 0\nv 3 0\ne 1 2 0\ne 2 1 0\ne 2 3 0\n")
    assert g.num_edges == 3 and sorted(zip(*(x.tolist() for x in g.arcs()))) == [(0, 1, 0), (1, 0, 0), (1, 2, 0)]
    one_way = parse_query_text("v 0 0\nv 1 0\ne 0 1 0\n", "q", directed=True)
    both = parse_query_text("v 0 0\nv 1 0\ne 0 1 0\ne 1 0 0\n", "q", directed=True)
    m = static_matcher("cpu")
    assert m.match(g, one_way).count == 3  # 1->2, 2->1, 2->3
    assert m.match(g, both).count == 2  # (1, 2) and (2, 1)


def read_graph_text(text: str) -> Graph:
    from csmd.model.formats import _read_text_graph

    return _read_text_graph("g", enumerate(text.splitlines(), 1), directed=True)


def test_a_reciprocal_query_on_an_undirected_graph_is_refused():
    with pytest.raises(InputError, match="needs a directed graph"):
        parse_query_text("v 0 0\nv 1 0\ne 0 1 0\ne 1 0 0\n", "q")


def test_a_directed_label_past_the_codes_is_refused():
    with pytest.raises(InputError, match="directed graph's edge labels are 0 .. 16383"):
        read_graph_text("v 1 0\nv 2 0\ne 1 2 16384\n")


def test_the_gpu_sampler_is_not_asked_for_a_directed_estimate(tmp_path):
    """`csmd estimate --directed` runs the CPU sampler (auto); asked for the GPU's, it says why not."""
    import subprocess
    import sys

    (tmp_path / "g").write_text("v 1 0\nv 2 0\nv 3 0\ne 1 2 0\ne 2 3 0\ne 3 1 0\n")
    (tmp_path / "q").write_text("v 0 0\nv 1 0\ne 0 1 0\n")
    run = [sys.executable, "-m", "csmd", "estimate", "--directed", "--data", str(tmp_path / "g"), "--query",
           str(tmp_path / "q"), "--json", "--samples", "64"]
    gpu = subprocess.run(run + ["--backend", "gpu"], capture_output=True, text=True)
    assert gpu.returncode != 0 and "GPU sampler does not estimate directed graphs" in gpu.stderr
    auto = subprocess.run(run + ["--backend", "auto"], capture_output=True, text=True, check=True)
    assert '"estimate": 3' in auto.stdout.replace(".0", "")


def _sample_reader(root):
    """parse(text) -> (labels, arcs) of the money-flow sample's files, by its label names."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    names = tomllib.loads((root / "labels.toml").read_text())
    vn, en = names["labels"], names["edge_labels"]

    def parse(text):
        labels, arcs = {}, {}
        for line in text.splitlines():
            f = line.split()
            if f and f[0] == "v":
                labels[int(f[1])] = vn[f[2]]
            elif f and f[0] == "e":
                arcs[(int(f[1]), int(f[2]))] = en[f[3]]
        return labels, arcs

    return parse, en


def _sample_truth(root) -> dict[str, tuple[int, int]]:
    """(positive, negative) distinct deltas per query of the money-flow sample, by definition:
    brute-force matches before and after each stream line, divided by the automorphisms."""
    parse, en = _sample_reader(root)
    labels, arcs = parse((root / "graph.graph").read_text())
    out = {}
    for path in sorted((root / "queries").glob("*.graph")):
        ql, qa = parse(path.read_text())
        qlabels = [ql[i] for i in range(len(ql))]
        g_labels, g_arcs = dict(labels), dict(arcs)
        pos = neg = 0
        for line in (root / "stream.txt").read_text().splitlines():
            f = line.split()
            if not f or f[0].startswith("#"):
                continue
            before = set(directed_embeddings(g_arcs, g_labels, qa, qlabels))
            if f[0] == "e":
                g_arcs.setdefault((int(f[1]), int(f[2])), en[f[3]])
            elif f[0] == "-e":
                g_arcs.pop((int(f[1]), int(f[2])), None)
            elif f[0] == "-v":
                v = int(f[1])
                g_labels.pop(v)
                g_arcs = {a: lab for a, lab in g_arcs.items() if v not in a}
            after = set(directed_embeddings(g_arcs, g_labels, qa, qlabels))
            pos, neg = pos + len(after - before), neg + len(before - after)
        aut = _automorphisms(qlabels, qa)
        out[path.stem] = (pos // aut, neg // aut)
    return out


def test_the_readme_money_flow_example_prints_the_brute_force_counts():
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    readme = (repo / "README.md").read_text()
    block = readme.split("<!-- example: money-flow")[1].split("\n", 1)[1].split("\n\n")[:2]
    command = block[0].replace("\\\n", " ").split()
    shown = {f[0]: (int(f[1]), int(f[2])) for f in (line.split() for line in block[1].splitlines()[1:])}
    assert command[:2] == ["csmd", "replay"]
    run = subprocess.run([sys.executable, "-m", "csmd", *command[1:], "--json"], cwd=repo, capture_output=True,
                         text=True, check=True)
    import json

    got = {r["query"]: (r["positive"], r["negative"]) for r in map(json.loads, run.stdout.splitlines())}
    assert got == shown == _sample_truth(repo / "samples" / "money-flow")


def test_a_checkpoint_keeps_the_arcs_and_a_restart_of_the_other_direction_stops(tmp_path):
    from csmd.connectors.records import Record, decode_updates
    from csmd.cpu.numpy_engine import CpuEngine
    from csmd.pipeline.stages import Pipeline
    from csmd.service.checkpoint_files import read_checkpoint, write_checkpoint
    from csmd.service.config import load_config
    from csmd.service.restore import read_local

    g0 = read_graph_text("v 1 0\nv 2 0\nv 3 0\ne 1 2 3\ne 2 3 0\n")
    pipe = Pipeline(g0, engine=CpuEngine(g0), threaded=False)
    pipe.run(iter(decode_updates(Record("in", 0, 0, b"e 2 1 5\n-e 2 3\ne 3 2 1"), "text")), lambda result: None)
    state = pipe.graph_state()
    folder = write_checkpoint(tmp_path, state, {"seq": state.seq, "offsets": {}})
    g = read_checkpoint(folder.parent).graph
    arcs = sorted((int(g.ext_ids[s]), int(g.ext_ids[d]), int(lab)) for s, d, lab in zip(*g.arcs()))
    assert g.directed and arcs == [(1, 2, 3), (2, 1, 5), (3, 2, 1)]
    cfg = load_config(env={"CSMD_CHECKPOINT__DIR": str(tmp_path)})
    with pytest.raises(CsmdError, match=r"\[graph\] directed is false, but the checkpoint holds a directed graph"):
        read_local(cfg, None)


def test_cluster_instances_of_another_direction_differ():
    from csmd.service.config import load_config
    from csmd.service.deployment import describe, differences

    ours = describe(load_config(env={"CSMD_GRAPH__DIRECTED": "true"}), [], "a")
    theirs = describe(load_config(env={}), [], "b")
    assert differences(ours, theirs) == ["[graph] directed: directed here, undirected in the deployment"]


def test_an_undirected_read_of_pairs_listed_both_ways_warns(tmp_path):
    from structlog.testing import capture_logs

    path = tmp_path / "g.graph"
    path.write_text("v 1 0\nv 2 0\nv 3 0\ne 1 2 0\ne 2 1 0\ne 2 3 0\ne 2 3 0\n")
    with capture_logs() as logs:
        g = read_graph(path)
    assert g.num_edges == 2
    assert [(x["log_level"], x["pairs"]) for x in logs] == [("warning", 1)]
    with capture_logs() as logs:
        assert read_graph(path, directed=True).num_edges == 3
    assert logs == []


def test_match_directed_counts_the_sample_as_brute_force_does(tmp_path):
    """`csmd match --directed` on the sample graph with the stream's insertions added (every
    pattern present), against brute force."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "samples" / "money-flow"
    inserts = [line for line in (root / "stream.txt").read_text().splitlines() if line.startswith("e ")]
    (tmp_path / "g.graph").write_text((root / "graph.graph").read_text() + "\n".join(inserts) + "\n")
    parse, _ = _sample_reader(root)
    labels, arcs = parse((tmp_path / "g.graph").read_text())
    want = {}
    for path in sorted((root / "queries").glob("*.graph")):
        ql, qa = parse(path.read_text())
        want[path.stem] = sum(1 for _ in directed_embeddings(arcs, labels, qa, [ql[i] for i in range(len(ql))]))
    run = subprocess.run([sys.executable, "-m", "csmd", "match", "--directed", "--backend", "cpu", "--labels",
                          str(root / "labels.toml"), "--data", str(tmp_path / "g.graph"), "--query",
                          str(root / "queries"), "--json"], capture_output=True, text=True, check=True)
    got = {r["query"]: r["matches"] for r in map(json.loads, run.stdout.splitlines())}
    assert got == want and min(want.values()) > 0, want
