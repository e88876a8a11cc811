"""Random static cases (a graph, a query, their truth) and the files and command lines of the
static tests (test_random_static, test_gpu_static, test_threads, test_plan_order, the estimate tests).
Every case is seeded: a failure names the seed, and make_case(seed) rebuilds it."""

from __future__ import annotations

import json
import random

from brute import TooMany, adjacency, brute_force
from csmd import cli
from csmd.model.graph import Graph

MAX_TRUTH = 20_000  # cases whose embedding count exceeds this are redrawn (brute force stays fast)


def random_graph(rng: random.Random, kind: str):
    n = rng.randint(8, 40)
    nlabels = rng.randint(1, 4)
    nelabels = 2 if kind == "elabel" or rng.random() < 0.2 else 1
    labels = [rng.randrange(nlabels) for _ in range(n)]
    p = {"sparse": rng.uniform(0.05, 0.15), "dense": rng.uniform(0.3, 0.6)}.get(kind, rng.uniform(0.08, 0.3))
    edges = {}
    for a in range(n):
        for b in range(a + 1, n):
            if rng.random() < p:
                edges[(a, b)] = rng.randrange(nelabels)
    if kind == "hub":
        for h in rng.sample(range(n), rng.randint(1, 3)):
            for v in range(n):
                if v != h and rng.random() < 0.9:
                    edges.setdefault((min(h, v), max(h, v)), rng.randrange(nelabels))
    return labels, [(a, b, el) for (a, b), el in edges.items()], nlabels, nelabels


def random_connected_query(rng: random.Random, k: int, nlabels: int, nelabels: int):
    labels = [rng.randrange(nlabels + (1 if rng.random() < 0.1 else 0)) for _ in range(k)]
    edges = {}
    for v in range(1, k):  # random tree, then extra edges
        edges[(rng.randrange(v), v)] = rng.randrange(nelabels)
    for a in range(k):
        for b in range(a + 1, k):
            if (a, b) not in edges and rng.random() < 0.25:
                edges[(a, b)] = rng.randrange(nelabels)
    return labels, [(a, b, el) for (a, b), el in edges.items()]


def extracted_query(rng: random.Random, k: int, glabels, gadj):
    """A connected subgraph of the data graph (so the count is at least 1), relabelled 0..k-1."""
    start = rng.randrange(len(glabels))
    if not gadj[start]:
        return None
    chosen, tree = [start], []
    while len(chosen) < k:
        frontier = [(a, b) for a in chosen for b in gadj[a] if b not in chosen]
        if not frontier:
            break
        a, b = rng.choice(frontier)
        chosen.append(b)
        tree.append((a, b))
    if len(chosen) < 2:
        return None
    pos = {v: i for i, v in enumerate(chosen)}
    keep = {frozenset(e) for e in tree}
    for a in chosen:  # some of the other edges inside the chosen set
        for b in gadj[a]:
            if b in pos and pos[a] < pos[b] and rng.random() < 0.5:
                keep.add(frozenset((a, b)))
    # shuffle the query's vertex numbering so query vertex 0 is not always the seed
    perm = list(range(len(chosen)))
    rng.shuffle(perm)
    labels = [0] * len(chosen)
    for v, i in pos.items():
        labels[perm[i]] = glabels[v]
    edges = []
    for e in keep:
        a, b = tuple(e)
        edges.append((perm[pos[a]], perm[pos[b]], gadj[a][b]))
    return labels, edges


KINDS = ["sparse", "medium", "dense", "hub", "elabel"]


def make_case(seed: int):
    """(graph labels, graph edges, query labels, query edges, truth set), deterministic in seed."""
    rng = random.Random(seed)
    kind = KINDS[seed % len(KINDS)]
    while True:
        glabels, gedges, nlabels, nelabels = random_graph(rng, kind)
        gadj = adjacency(len(glabels), gedges)
        k = rng.randint(2, 7)
        q = extracted_query(rng, k, glabels, gadj) if rng.random() < 0.65 else None
        if q is None:
            q = random_connected_query(rng, k, nlabels, nelabels)
        qlabels, qedges = q
        qadj = adjacency(len(qlabels), qedges)
        try:
            truth = brute_force(gadj, glabels, qadj, qlabels, MAX_TRUTH)
        except TooMany:
            continue
        return kind, glabels, gedges, qlabels, qedges, truth


def to_graph(labels, edges, rng=None, ext_ids=None) -> Graph:
    src = [a for a, _, _ in edges]
    dst = [b for _, b, _ in edges]
    els = [el for _, _, el in edges]
    if rng is not None:
        # orientation must not matter; add self-loops (ignored) and repeats after
        # the first occurrence (first wins) to exercise from_edges' cleanup
        for i in range(len(src)):
            if rng.random() < 0.5:
                src[i], dst[i] = dst[i], src[i]
        for _ in range(rng.randint(0, 3)):
            v = rng.randrange(len(labels))
            src.append(v), dst.append(v), els.append(1)
        for i in rng.sample(range(len(edges)), min(3, len(edges))):
            src.append(dst[i]), dst.append(src[i]), els.append(els[i] + 5)
    return Graph.from_edges(labels, src, dst, els if edges else None, ext_ids)


def random_case(seed: int):
    """A small labelled random graph, a connected query cut out of it (so it has matches, and
    cycles where the graph has them), and the adjacency the brute-force matcher reads."""
    rnd = random.Random(seed)
    n = rnd.randint(18, 30)
    labels = [rnd.randrange(2) for _ in range(n)]
    elabeled = seed % 2 == 1
    edges = {}
    for a in range(n):
        for b in range(a + 1, n):
            if rnd.random() < 0.22:
                edges[(a, b)] = rnd.randrange(2) if elabeled else 0
    g = Graph.from_edges(labels, [a for a, _ in edges], [b for _, b in edges], list(edges.values()))
    adj = [dict() for _ in range(n)]
    for (a, b), el in edges.items():
        adj[a][b] = adj[b][a] = el
    # grow a connected vertex set from a random vertex, keep each edge inside it with probability 3/4
    # (a spanning tree's edges always), so queries have both tree and non-tree edges
    k = rnd.randint(4, 6)
    picked = [rnd.choice([v for v in range(n) if adj[v]])]
    tree = []
    while len(picked) < k:
        frontier = [(v, w) for v in picked for w in adj[v] if w not in picked]
        if not frontier:
            break
        v, w = rnd.choice(frontier)
        tree.append((v, w))
        picked.append(w)
    pos = {v: i for i, v in enumerate(picked)}
    qe = {(pos[v], pos[w]): adj[v][w] for v, w in tree}
    for v in picked:
        for w in adj[v]:
            if w in pos and pos[v] < pos[w] and (pos[v], pos[w]) not in qe and (pos[w], pos[v]) not in qe \
                    and rnd.random() < 0.75:
                qe[(pos[v], pos[w])] = adj[v][w]
    q = Graph.from_edges([labels[v] for v in picked], [a for a, _ in qe], [b for _, b in qe], list(qe.values()))
    return g, q, adj, labels


def ext_of(i: int) -> int:
    return 100 + 3 * i


def write_graph_file(path, labels, edges, rng, ext=ext_of):
    """`t N M` format, vertices in shuffled order with external ids ext(i)."""
    order = list(range(len(labels)))
    rng.shuffle(order)
    deg = [0] * len(labels)
    for a, b, _ in edges:
        deg[a] += 1
        deg[b] += 1
    lines = [f"t {len(labels)} {len(edges)}"]
    lines += [f"v {ext(v)} {labels[v]} {deg[v]}" for v in order]
    lines += [f"e {ext(a)} {ext(b)} {el}" if el or rng.random() < 0.5 else f"e {ext(b)} {ext(a)}"
              for a, b, el in edges]
    path.write_text("\n".join(lines) + "\n")


def write_query_file(path, labels, edges):
    deg = [0] * len(labels)
    for a, b, _ in edges:
        deg[a] += 1
        deg[b] += 1
    lines = [f"t {len(labels)} {len(edges)}"]
    lines += [f"v {u} {labels[u]} {deg[u]}" for u in range(len(labels))]
    lines += [f"e {a} {b} {el}" for a, b, el in edges]
    path.write_text("\n".join(lines) + "\n")


def run_cli(capsys, argv):
    capsys.readouterr()
    rc = cli.main(argv)
    out = capsys.readouterr().out
    assert rc == 0, out
    return [json.loads(line) for line in out.splitlines() if line.strip()]
