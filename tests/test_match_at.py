"""`csmd match --at TS [--window W]`: the graph as it stood at event time TS (edges with a ts after
TS left out, with a window those before TS - W too, edges without a ts kept), against hand counts
and a brute force over random timed graphs; queries with time constraints on a timed graph; the
errors of what cannot be answered."""

from __future__ import annotations

import itertools
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from csmd.cli import main
from csmd.errors import InputError
from csmd.model.at_time import graph_at
from csmd.model.formats import read_graph

from brute import directed_embeddings
from helpers import ENGINES


def match(capsys, *args, backend: str = "cpu") -> dict[str, int]:
    """`csmd match --json` on a CPU engine: matches per query."""
    assert main(["match", "--json", "--backend", backend, *map(str, args)]) == 0, capsys.readouterr().err
    return {r["query"]: r["matches"] for r in map(json.loads, capsys.readouterr().out.splitlines())}


def write_queries(tmp_path, texts: dict[str, str]) -> list:
    paths = []
    for name, text in texts.items():
        paths.append(tmp_path / f"{name}.graph")
        paths[-1].write_text(text)
    return paths


EDGE = "v 0 0\nv 1 0\ne 0 1\n"
TRIANGLE = "v 0 0\nv 1 0\nv 2 0\ne 0 1\ne 1 2\ne 2 0\n"


def test_at_and_window_keep_the_edges_a_hand_count_says(tmp_path, capsys):
    """A triangle 1-2-3 stamped 10, 20, 30, an edge 3-4 without a ts (always kept) and 4-5 at 40:
    an edge query has 2 embeddings per kept edge, the triangle 6 while its three edges are kept;
    the window's bound is inclusive (ts >= TS - W stays)."""
    data = tmp_path / "g.graph"
    data.write_text("v 1 0\nv 2 0\nv 3 0\nv 4 0\nv 5 0\n"
                    "e 1 2 0 10\ne 2 3 0 20\ne 1 3 0 30\ne 3 4 0\ne 4 5 0 40\n")
    queries = write_queries(tmp_path, {"edge": EDGE, "triangle": TRIANGLE})
    counts = {
        (): {"edge": 10, "triangle": 6},
        ("--at", 5): {"edge": 2, "triangle": 0},  # 3-4 alone
        ("--at", 30): {"edge": 8, "triangle": 6},
        ("--at", 29): {"edge": 6, "triangle": 0},  # 1-3 (30) is after
        ("--at", 30, "--window", 15): {"edge": 6, "triangle": 0},  # 1-2 (10) is before 15
        ("--at", 30, "--window", 20): {"edge": 8, "triangle": 6},  # 1-2 at 10 = 30 - 20 stays
        ("--at", 40, "--window", 10): {"edge": 6, "triangle": 0},  # 1-3 (30), 3-4, 4-5 (40)
        ("--at", 40, "--window", 0): {"edge": 4, "triangle": 0},  # 3-4 and 4-5
        ("--at", -(2**63) + 1, "--window", 2**63 - 1): {"edge": 2, "triangle": 0},  # no overflow at the ends
    }
    for options, want in counts.items():
        assert match(capsys, "--data", data, "--query", *queries, *options) == want, options


def test_json_says_the_time_and_window_and_the_table_the_counts(tmp_path, capsys):
    data = tmp_path / "g.graph"
    data.write_text("v 1 0\nv 2 0\ne 1 2 0 10\n")
    (q,) = write_queries(tmp_path, {"edge": EDGE})
    assert main(["match", "--json", "--backend", "cpu", "--data", str(data), "--query", str(q), "--at", "12",
                 "--window", "5"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert (res["matches"], res["at"], res["window"]) == (2, 12, 5)
    assert main(["match", "--json", "--backend", "cpu", "--data", str(data), "--query", str(q)]) == 0
    assert "at" not in json.loads(capsys.readouterr().out)  # without --at, the JSON of before


def test_a_directed_graph_drops_each_arc_by_its_own_ts(tmp_path, capsys):
    """u -> v and v -> u are two edges, each with its ts: --at keeps one of them."""
    data = tmp_path / "g.graph"
    data.write_text("v 1 0\nv 2 0\nv 3 0\ne 1 2 0 10\ne 2 1 0 20\ne 2 3 0 5\ne 3 1 0\n")
    arc = write_queries(tmp_path, {"arc": EDGE, "cycle3": TRIANGLE})
    assert match(capsys, "--directed", "--data", data, "--query", *arc) == {"arc": 4, "cycle3": 3}
    assert match(capsys, "--directed", "--data", data, "--query", *arc, "--at", 15) == {"arc": 3, "cycle3": 3}
    assert match(capsys, "--directed", "--data", data, "--query", *arc, "--at", 20, "--window", 10) == \
        {"arc": 3, "cycle3": 0}  # 2 -> 3 (5) is out: 1 -> 2 -> 3 -> 1 breaks


def test_graph_at_keeps_vertices_and_the_kept_edges_ts_first_ts_of_a_pair_given_twice(tmp_path):
    """The filtered graph: every vertex, the kept edges with their ts (an edge given twice keeps
    its first ts, as the pipeline's clock does; a timed self-loop is no edge), string ids too."""
    data = tmp_path / "g.graph"
    data.write_text("v 1 0\nv 2 0\nv 3 0\nv 7 1\ne 1 2 0 5\ne 2 1 0 50\ne 3 3 0 1\ne 2 3 0 7\ne 1 3 0\n")
    g = read_graph(data)
    h = graph_at(g, 6, None, data)
    assert h.n == 4 and h.ext_ids.tolist() == [1, 2, 3, 7] and h.labels.tolist() == [0, 0, 0, 1]
    assert sorted((int(h.ext_ids[a]), int(h.ext_ids[b])) for a, b in zip(*h.edge_list()[:2])) == [(1, 2), (1, 3)]
    assert [c.tolist() for c in h.edge_ts] == [[1], [2], [5]]
    assert [c.tolist() for c in graph_at(g, 0, None, data).edge_ts] == [[], [], []]  # a timed graph with none kept
    pq.write_table(pa.table({"src": ["a", "b", "c"], "dst": ["b", "c", "a"], "ts": [3, None, 9]}),
                   tmp_path / "s.parquet")
    s = read_graph(tmp_path / "s.parquet")
    h = graph_at(s, 8, 6, tmp_path / "s.parquet")
    assert sorted((h.ext_ids[a], h.ext_ids[b]) for a, b in zip(*h.edge_list()[:2])) == [("a", "b"), ("b", "c")]
    assert [c.tolist() for c in h.edge_ts] == [["a"], ["b"], [3]]
    untimed = _untimed(tmp_path)
    with pytest.raises(InputError, match=r"untimed\.graph: --at needs edges with event times"):
        graph_at(read_graph(untimed), 1, None, untimed)


def _untimed(tmp_path):
    path = tmp_path / "untimed.graph"
    path.write_text("v 1 0\nv 2 0\ne 1 2 0\n")
    return path


def test_what_cannot_be_answered_is_refused_with_its_reason(tmp_path, capsys):
    timed, untimed = tmp_path / "timed.graph", _untimed(tmp_path)
    timed.write_text("v 1 0\nv 2 0\ne 1 2 0 10\n")
    (edge, spanned) = write_queries(tmp_path, {"edge": EDGE, "spanned": "v 0 0\nv 1 0\nv 2 0\ne 0 1\ne 1 2\nw 5\n"})
    cases = [
        (["--data", timed, "--query", edge, "--window", 5], "--window needs --at"),
        (["--data", untimed, "--query", edge, "--at", 3], f"{untimed}: --at needs edges with event times"),
        (["--data", untimed, "--query", spanned], f"{spanned}:6: 'w' (a time constraint) needs event time"),
    ]
    for args, reason in cases:
        assert main(["match", "--backend", "cpu", *map(str, args)]) == 2
        err = capsys.readouterr().err
        assert reason in err and "Traceback" not in err, err
    for bad in ("-9223372036854775808", "9223372036854775808", "soon"):
        with pytest.raises(SystemExit):
            main(["match", "--data", str(timed), "--query", str(edge), "--at", bad])
        assert "argument --at" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["match", "--data", str(timed), "--query", str(edge), "--at", "1", "--window", "-1"])
    assert "argument --window: must be >= 0" in capsys.readouterr().err


class TimedGraph:
    """A random graph, each edge with a ts or none, by definition: what --at keeps, and the
    embeddings (with the span and order of a query's e lines, where it has them) of what is kept."""

    def __init__(self, rng: random.Random, directed: bool, labels: int = 2):
        self.directed = directed
        self.vlabel = {3 * i - 7: rng.randrange(labels) for i in range(9)}
        self.edges = {}  # (a, b) as written -> (label, ts or None)
        seen = set()
        for a, b in itertools.permutations(self.vlabel, 2):
            key = (a, b) if directed else frozenset((a, b))
            if key not in seen and rng.random() < 0.3:
                seen.add(key)
                self.edges[(a, b)] = (rng.randrange(labels), None if rng.random() < 0.25 else rng.randrange(-10, 30))

    def keeps_a_ts(self, at, window) -> bool:
        return any(ts is not None and (at is None or (ts <= at and (window is None or ts >= at - window)))
                   for _, ts in self.edges.values())

    def text(self) -> str:
        return "".join(f"v {v} {lab}\n" for v, lab in self.vlabel.items()) + "".join(
            f"e {a} {b} {lab}{'' if ts is None else f' {ts}'}\n" for (a, b), (lab, ts) in self.edges.items())

    def count(self, q: str, at=None, window=None) -> int:
        """Embeddings of query text q (v and e lines, w SPAN, o i j) among the edges kept at `at`."""
        kept = {e: x for e, x in self.edges.items()
                if at is None or x[1] is None or (x[1] <= at and (window is None or x[1] >= at - window))}
        arcs = {}
        for (a, b), x in kept.items():
            arcs[(a, b)] = x
            if not self.directed:
                arcs[(b, a)] = x
        qlabels, qlines, span, order = [], [], None, []
        for f in (line.split() for line in q.splitlines()):
            if f[0] == "v":
                qlabels.append(int(f[2]))
            elif f[0] == "e":
                qlines.append((int(f[1]), int(f[2]), int(f[3]) if len(f) > 3 else 0))
            elif f[0] == "w":
                span = int(f[1])
            elif f[0] == "o":
                order.append((int(f[1]), int(f[2])))
        qarcs = {}
        for a, b, lab in qlines:
            qarcs[(a, b)] = lab
            if not self.directed:
                qarcs[(b, a)] = lab
        n = 0
        for m in directed_embeddings({e: x[0] for e, x in arcs.items()}, self.vlabel, qarcs, qlabels):
            ts = [arcs[(m[a], m[b])][1] for a, b, _ in qlines]
            have = [t for t in ts if t is not None]  # an edge without a ts constrains nothing
            if span is not None and have and max(have) - min(have) > span:
                continue
            if any(ts[i] is not None and ts[j] is not None and not ts[i] < ts[j] for i, j in order):
                continue
            n += 1
        return n


UNCONSTRAINED = {
    "edge01": "v 0 0\nv 1 1\ne 0 1 0\n",
    "path": "v 0 0\nv 1 1\nv 2 0\ne 0 1\ne 1 2 1\n",
    "triangle": "v 0 0\nv 1 0\nv 2 1\ne 0 1\ne 1 2\ne 2 0\n",
    "star3": "v 0 1\nv 1 0\nv 2 0\nv 3 0\ne 0 1\ne 0 2\ne 0 3\n",
}


def _times(rng: random.Random, g: TimedGraph):
    """--at and --window options: none, at a ts or beside one, windows that end on a ts."""
    stamps = sorted({ts for _, ts in g.edges.values() if ts is not None}) or [0]
    yield []
    for _ in range(5):
        at = rng.choice(stamps) + rng.choice([0, 0, 1, -1])
        window = rng.choice([None, 0, abs(at - rng.choice(stamps)), rng.randrange(40)])
        yield ["--at", at] + ([] if window is None else ["--window", window])


def _expected_options(options: list) -> tuple:
    """(at, window) of _times' options."""
    return options[1] if options else None, options[3] if len(options) > 2 else None


def _expected(g: TimedGraph, queries: dict, options: list) -> dict:
    return {name: g.count(q, *_expected_options(options)) for name, q in queries.items()}


@pytest.mark.parametrize("directed", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_at_against_a_brute_force_of_the_edges_kept(tmp_path, capsys, seed, directed):
    rng = random.Random(seed)
    g = TimedGraph(rng, directed)
    data = tmp_path / "g.graph"
    data.write_text(g.text())
    queries = write_queries(tmp_path, UNCONSTRAINED)
    for options in _times(rng, g):
        got = match(capsys, "--data", data, "--query", *queries, *options, *(["--directed"] if directed else []))
        assert got == _expected(g, UNCONSTRAINED, options), (seed, options)


# The constrained queries (one label: many matches for the constraints to cut)
CONSTRAINED = {
    "path_span": "v 0 0\nv 1 0\nv 2 0\ne 0 1\ne 1 2\nw 6\n",
    "path_order": "v 0 0\nv 1 0\nv 2 0\nv 3 0\ne 0 1\ne 1 2\ne 2 3\no 0 1\no 1 2\n",
    "triangle_both": "v 0 0\nv 1 0\nv 2 0\ne 0 1\ne 1 2\ne 2 0\nw 15\no 0 2\n",
}


@pytest.mark.parametrize("backend", ENGINES)
@pytest.mark.parametrize("directed", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_at_with_span_and_order_constraints_against_a_brute_force(tmp_path, capsys, seed, directed, backend):
    rng = random.Random(100 + seed)
    g = TimedGraph(rng, directed, labels=1)
    data = tmp_path / "g.graph"
    data.write_text(g.text())
    queries = write_queries(tmp_path, CONSTRAINED)
    unconstrained = {k: "".join(line + "\n" for line in q.splitlines() if line[0] in "ve")
                     for k, q in CONSTRAINED.items()}
    cut = 0
    for options in _times(rng, g):
        if not g.keeps_a_ts(*_expected_options(options)):
            continue  # test_at_before_every_ts_the_constraints_constrain_nothing
        got = match(capsys, "--data", data, "--query", *queries, *options, *(["--directed"] if directed else []),
                    backend=backend)
        want = _expected(g, CONSTRAINED, options)
        assert got == want, (seed, options)
        cut += sum(_expected(g, unconstrained, options).values()) - sum(want.values())
    assert cut > 0  # the constraints left matches out: the test tells a search that ignores them


def test_at_before_every_ts_the_constraints_constrain_nothing(tmp_path, capsys):
    """Only the edges without a ts are kept, and they constrain nothing."""
    g = TimedGraph(random.Random(7), False, labels=1)
    data = tmp_path / "g.graph"
    data.write_text(g.text())
    early = min(ts for _, ts in g.edges.values() if ts is not None) - 1
    got = match(capsys, "--data", data, "--query", *write_queries(tmp_path, CONSTRAINED), "--at", early)
    assert got == {name: g.count(q, early) for name, q in CONSTRAINED.items()}
