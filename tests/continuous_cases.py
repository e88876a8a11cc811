"""Random continuous cases: a model graph and a stream with every update's deltas computed on the
model by brute force, and replays of them (test_continuous, test_cluster, test_delta_pieces,
test_distinct_stream, test_ids, test_threads)."""

from __future__ import annotations

import random
from collections import Counter

import pyarrow.ipc as ipc

from brute import assert_deltas_equal as assert_brute_force, embeddings  # noqa: F401 (the cases' check)
from csmd.jobs.replay import replay
from csmd.model.formats import read_graph, read_query


# ---- a random model graph and stream, with the truth computed on the model --------------------
class Model:
    def __init__(self, rng: random.Random, n: int, labels: int, elabels: int, p: float):
        self.rng = rng
        self.vlabel = {100 + 3 * i: rng.randrange(labels) for i in range(n)}
        self.edges: dict[frozenset, int] = {}
        ids = list(self.vlabel)
        for i, a in enumerate(ids):
            for b in ids[i + 1:]:
                if rng.random() < p:
                    self.edges[frozenset((a, b))] = rng.randrange(elabels)
        self.labels, self.elabels, self.next_id = labels, elabels, 100 + 3 * n

    def text(self) -> str:
        lines = [f"v {v} {lab}" for v, lab in self.vlabel.items()]
        lines += [f"e {min(e)} {max(e)} {lab}" for e, lab in self.edges.items()]
        return "\n".join(lines) + "\n"

    def matches(self, q) -> set:
        ids = list(self.vlabel)
        pos = {v: i for i, v in enumerate(ids)}
        adj = [dict() for _ in ids]
        for e, lab in self.edges.items():
            a, b = (pos[x] for x in e)
            adj[a][b] = lab
            adj[b][a] = lab
        return {tuple(ids[i] for i in m) for m in embeddings(adj, [self.vlabel[v] for v in ids], q)}

    def random_record(self) -> str:
        rng, ids = self.rng, list(self.vlabel)
        if len(ids) < 3:
            return f"v {self.next_id} {rng.randrange(self.labels)}"
        r = rng.random()
        if r < 0.45 or len(self.edges) < 3:
            a, b = rng.sample(ids, 2)
            if rng.random() < 0.08 and self.edges:  # insert an existing edge: ignored
                a, b = tuple(rng.choice(list(self.edges)))
            return f"e {a} {b} {rng.randrange(self.elabels)}"
        if r < 0.85:
            if rng.random() < 0.1:  # delete a missing edge: ignored
                a, b = rng.sample(ids, 2)
                return f"-e {a} {b}"
            a, b = tuple(rng.choice(list(self.edges)))
            return f"-e {b} {a}"
        if r < 0.92:
            vid = self.next_id if rng.random() < 0.8 else rng.choice(ids)
            return f"v {vid} {rng.randrange(self.labels)}"
        if r < 0.96 and len(ids) > 4:
            return f"-v {rng.choice(ids)}"
        return f"e {rng.choice(ids)} {self.next_id + 1} 0"  # an edge to an unseen vertex creates it

    def apply(self, line: str) -> None:
        op, *f = line.split()
        if op == "e":
            a, b, lab = int(f[0]), int(f[1]), int(f[2])
            for x in (a, b):
                if x not in self.vlabel:
                    self.vlabel[x] = 0
                    self.next_id = max(self.next_id, x + 3)
            self.edges.setdefault(frozenset((a, b)), lab)
        elif op == "-e":
            self.edges.pop(frozenset((int(f[0]), int(f[1]))), None)
        elif op == "v":  # a vertex that exists takes the new label (a relabel)
            vid = int(f[0])
            self.vlabel[vid] = int(f[1])
            self.next_id = max(self.next_id, vid + 3)
        else:
            vid = int(f[0])
            self.vlabel.pop(vid, None)
            self.edges = {e: lab for e, lab in self.edges.items() if vid not in e}


def random_query(rng: random.Random, model: Model, k: int) -> str:
    """A connected query, usually the labels of a random walk in the model (so it matches)."""
    labels = [rng.randrange(model.labels) for _ in range(k)]
    edges = {}
    for i in range(1, k):
        edges[(rng.randrange(i), i)] = rng.randrange(model.elabels)
    for _ in range(rng.randrange(2) if k >= 3 else 0):
        a, b = sorted(rng.sample(range(k), 2))
        edges.setdefault((a, b), rng.randrange(model.elabels))
    return "".join(f"v {i} {lab}\n" for i, lab in enumerate(labels)) + "".join(f"e {a} {b} {l}\n" for (a, b), l in edges.items())


def count_change(truth: dict, queries: dict, model, lineno: int, change) -> None:
    """Make the change to the model, counting in truth (per query) the matches it made (+1) and
    broke (-1) as deltas of stream line lineno."""
    before = {name: model.matches(q) for name, q in queries.items()}
    change()
    for name, q in queries.items():
        after = model.matches(q)
        for m in after - before[name]:
            truth[name][(lineno, +1, m)] += 1
        for m in before[name] - after:
            truth[name][(lineno, -1, m)] += 1


def make_case(tmp_path, seed: int, steps: int = 50, labels: int | None = None):
    rng = random.Random(seed)
    model = Model(rng, n=rng.randrange(6, 14), labels=labels or rng.randrange(1, 3), elabels=rng.choice([1, 1, 2]),
                  p=rng.uniform(0.2, 0.5))
    (tmp_path / "g0.graph").write_text(model.text())
    qpaths = []
    for i in range(2):
        p = tmp_path / f"q{i}.graph"
        p.write_text(random_query(rng, model, rng.randrange(1 if i else 2, 5)))
        qpaths.append(p)
    truth = {p.stem: Counter() for p in qpaths}
    queries = {p.stem: read_query(p) for p in qpaths}
    lines = []
    for lineno in range(1, steps + 1):
        line = model.random_record()
        count_change(truth, queries, model, lineno, lambda: model.apply(line))
        lines.append(line)
    (tmp_path / "stream.txt").write_text("\n".join(lines) + "\n")
    return qpaths, truth


def run_replay(tmp_path, qpaths, batch_size, threaded=True, name="out.arrow", backend="cpu", executor_lag=0,
               max_batch=None, stream=None):
    g0 = read_graph(tmp_path / "g0.graph")
    out = tmp_path / name
    results, pipe = replay(g0, stream or tmp_path / "stream.txt", [(p.stem, read_query(p)) for p in qpaths],
                           batch_size=batch_size, count_only=False, output=out, threaded=threaded, show_progress=False,
                           backend=backend, executor_lag=executor_lag, max_batch=max_batch)
    return ipc.open_file(out).read_all(), results, pipe


def delta_file(tmp_path, g0, queries, batch_size, count_only, backend, name=""):
    """The bytes of replay's delta file for the case in tmp_path, and the pipeline."""
    out = tmp_path / f"{backend}{count_only}{name}.arrow"
    _, pipe = replay(g0, tmp_path / "stream.txt", queries, batch_size=batch_size, count_only=count_only, output=out,
                     show_progress=False, backend=backend)
    return out.read_bytes(), pipe
