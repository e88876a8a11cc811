"""The README's fraud patterns with time constraints (samples/money-flow/timed-queries: a loop of
four transfers within a day, a card at three merchants within ten minutes, a chain of transfers
in order), run as written, against a brute force that applies the span and the order by
definition; the sample queries without event time are refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from csmd.errors import InputError
from csmd.model.formats import read_query
from csmd.model.labels import LabelNames

from brute import directed_embeddings

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "samples" / "money-flow"


def _names() -> dict:
    """The sample's label names (vertex and edge names differ): name -> number."""
    names = LabelNames.load(SAMPLE / "labels.toml")
    return {**names.vertex, **names.edge}


def _query(path: Path, names: dict):
    """(vertex labels, the e lines as (a, b, label) in file order, span, order pairs) of a query file."""
    labels, lines, span, order = [], [], None, []
    for f in (line.split() for line in path.read_text().splitlines()):
        if not f or f[0].startswith("#"):
            continue
        if f[0] == "v":
            labels.append(names[f[2]])
        elif f[0] == "e":
            lines.append((int(f[1]), int(f[2]), names[f[3]]))
        elif f[0] == "w":
            span = int(f[1])
        elif f[0] == "o":
            order.append((int(f[1]), int(f[2])))
    return labels, lines, span, order


def _matches(arcs: dict, vlabel: dict, query, distinct: bool = False) -> set:
    """The query's embeddings (distinct: its instances, one per set of arcs) that keep its span
    and order; arcs: (u, v) -> (label, ts)."""
    labels, lines, span, order = query
    out = set()
    for m in directed_embeddings({a: x[0] for a, x in arcs.items()}, vlabel, {(a, b): lab for a, b, lab in lines},
                                 labels):
        used = [(m[a], m[b]) for a, b, _ in lines]
        ts = [arcs[e][1] for e in used]
        if span is not None and max(ts) - min(ts) > span:
            continue
        if any(not ts[i] < ts[j] for i, j in order):
            continue
        out.add(frozenset(used) if distinct else m)
    return out


def _graph(path: Path, at=None, window=None) -> tuple[dict, dict]:
    """(vertex labels, arcs (u, v) -> (label, ts)) of a timed sample graph, with `--at` and
    `--window` applied by definition."""
    names = _names()
    vlabel, arcs = {}, {}
    for f in (line.split() for line in path.read_text().splitlines()):
        if f and f[0] == "v":
            vlabel[int(f[1])] = names[f[2]]
        elif f and f[0] == "e":
            ts = int(f[4])
            if at is None or (ts <= at and (window is None or ts >= at - window)):
                arcs[(int(f[1]), int(f[2]))] = (names[f[3]], ts)
    return vlabel, arcs


def _truth(graph: Path, stream: Path, queries: dict, distinct: bool) -> dict:
    """(positive, negative) matches (distinct: instances) per query over the stream, with no
    window (nothing expires): each line's change of the matches that keep the constraints."""
    names = _names()
    vlabel, arcs = _graph(graph)
    truth = {q: [0, 0] for q in queries}
    for f in (line.split() for line in stream.read_text().splitlines()):
        if not f or f[0].startswith("#"):
            continue
        before = {q: _matches(arcs, vlabel, query, distinct) for q, query in queries.items()}
        if f[0] == "v":
            vlabel[int(f[1])] = names[f[2]]
        elif f[0] == "e":
            for x in map(int, f[1:3]):
                vlabel.setdefault(x, 0)
            arcs.setdefault((int(f[1]), int(f[2])), (names[f[3]], int(f[4])))
        elif f[0] == "-e":
            arcs.pop((int(f[1]), int(f[2])), None)
        for q, query in queries.items():
            after = _matches(arcs, vlabel, query, distinct)
            truth[q][0] += len(after - before[q])
            truth[q][1] += len(before[q] - after)
    return {q: tuple(t) for q, t in truth.items()}


def test_the_readme_fraud_patterns_print_what_the_brute_force_counts():
    block = (REPO / "README.md").read_text().split("<!-- example: fraud-patterns")[1].split("\n", 1)[1]
    command, table = block.split("\n\n")[:2]
    command = command.replace("\\\n", " ").split()
    assert command[:2] == ["csmd", "replay"]
    shown = {f[0]: (int(f[1]), int(f[2])) for f in (line.split() for line in table.splitlines()[1:])}
    run = subprocess.run([sys.executable, "-m", "csmd", *command[1:], "--json", "--backend", "cpu"], cwd=REPO,
                         capture_output=True, text=True, check=True)
    got = {r["query"]: (r["positive"], r["negative"]) for r in map(json.loads, run.stdout.splitlines())}
    names = _names()
    queries = {p.stem: _query(p, names) for p in sorted((SAMPLE / "timed-queries").glob("*.graph"))}
    data, stream = REPO / command[command.index("--data") + 1], REPO / command[command.index("--stream") + 1]
    distinct = "--distinct" in command
    truth = _truth(data, stream, queries, distinct)
    assert got == shown == truth
    unconstrained = {q: (labels, lines, None, []) for q, (labels, lines, _s, _o) in queries.items()}
    assert truth != _truth(data, stream, unconstrained, distinct)


def test_the_sample_queries_read_with_event_time_and_are_refused_without():
    labels = LabelNames.load(SAMPLE / "labels.toml")
    for path in sorted((SAMPLE / "timed-queries").glob("*.graph")):
        q = read_query(path, LabelNames(labels.vertex, labels.edge, directed=True, timed=True))
        assert q.time is not None and q.time.constrained
        try:
            read_query(path, LabelNames(labels.vertex, labels.edge, directed=True))
        except InputError as exc:
            assert str(exc).startswith(f"{path}:") and "needs event time" in str(exc)
        else:
            raise AssertionError(f"{path} read without event time")


def test_the_match_at_example_of_the_commands_page_prints_what_the_brute_force_counts():
    block = (REPO / "docs" / "commands.md").read_text().split("<!-- example: match-at")[1].split("\n", 1)[1]
    command, table = block.split("\n\n")[:2]
    command = command.replace("\\\n", " ").split()
    assert command[:2] == ["csmd", "match"]
    shown = {f[0]: int(f[1]) for f in (line.split() for line in table.splitlines()[1:-1])}
    run = subprocess.run([sys.executable, "-m", "csmd", *command[1:], "--json", "--backend", "cpu"], cwd=REPO,
                         capture_output=True, text=True, check=True)
    got = {r["query"]: r["matches"] for r in map(json.loads, run.stdout.splitlines())}
    names = _names()
    queries = {p.stem: _query(p, names) for p in sorted((SAMPLE / "timed-queries").glob("*.graph"))}
    at, window = int(command[command.index("--at") + 1]), int(command[command.index("--window") + 1])
    vlabel, arcs = _graph(REPO / command[command.index("--data") + 1], at, window)
    assert got == shown == {q: len(_matches(arcs, vlabel, query, "--distinct" in command))
                            for q, query in queries.items()}
    assert table.splitlines()[-1].split() == ["total", str(sum(shown.values()))]
