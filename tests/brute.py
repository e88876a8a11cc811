"""Independent truth for the tests: brute-force embedding enumeration, sharing no code with csmd
(embeddings: of a query Graph; brute_force: of a query given as adjacency lists, as the random
static cases are)."""


def embeddings(adj, labels, q):
    """Every embedding of query q (a csmd Graph, used only for its labels and edges)
    in the graph given by adj (list of dict neighbor -> edge label) and labels.

    Non-induced, injective, vertex and edge labels checked; automorphic embeddings are
    separate matches. Yields tuples: position u = data vertex of query vertex u.
    """
    qlab = [int(x) for x in q.labels]
    qadj = [dict() for _ in qlab]
    s, d, e = q.edge_list()
    for a, b, lab in zip(s.tolist(), d.tolist(), e.tolist()):
        qadj[a][b] = lab
        qadj[b][a] = lab
    order = [0]
    for u in order:
        order.extend(w for w in sorted(qadj[u]) if w not in order)
    back = [[(w, qadj[u][w]) for w in qadj[u] if w in order[:i]] for i, u in enumerate(order)]
    f = [-1] * len(qlab)
    used = set()

    def rec(i):
        if i == len(order):
            yield tuple(f)
            return
        u = order[i]
        pool = adj[f[back[i][0][0]]] if back[i] else range(len(labels))
        for v in pool:
            if v not in used and labels[v] == qlab[u] and all(adj[v].get(f[w]) == lab for w, lab in back[i]):
                f[u] = v
                used.add(v)
                yield from rec(i + 1)
                used.discard(v)
        f[u] = -1

    yield from rec(0)


def directed_embeddings(arcs, labels, qarcs, qlabels):
    """Every embedding of a directed query in a directed graph, by definition: arcs and qarcs map
    (src, dst) -> edge label, labels and qlabels vertex -> label (the data's vertices are the
    keys of labels, the query's 0 .. len(qlabels) - 1). Injective, non-induced: each query arc
    (a, b) with label l needs the data arc (f(a), f(b)) with label l. Yields tuples f."""
    k = len(qlabels)
    order = [0]
    for u in order:  # a connected order: each vertex after one of its neighbours
        order.extend(w for w in range(k) if w not in order and ((u, w) in qarcs or (w, u) in qarcs))
    out_of = {}
    for (a, b), lab in arcs.items():
        out_of.setdefault(a, []).append(b)
        out_of.setdefault(b, []).append(a)
    f = {}

    def rec(i):
        if i == len(order):
            yield tuple(f[u] for u in range(k))
            return
        u = order[i]
        placed = [w for w in order[:i] if (u, w) in qarcs or (w, u) in qarcs]
        pool = set(out_of.get(f[placed[0]], ())) if placed else list(labels)
        for v in pool:
            if v in f.values() or labels[v] != qlabels[u]:
                continue
            f[u] = v
            if all(arcs.get((f[a], f[b])) == lab for (a, b), lab in qarcs.items() if a in f and b in f):
                yield from rec(i + 1)
            del f[u]

    yield from rec(0)


def assert_deltas_equal(table, results, truth, seed):
    """A delta table (and replay's per-query results) against the truth: Counter per query of
    (stream line, sign, match) -> how many times."""
    from collections import Counter

    got = {name: Counter() for name in truth}
    for row in table.to_pylist():
        line = int(row["source"].rsplit(":", 1)[1])
        got[row["query"]][(line, row["sign"], tuple(row["vertices"]))] += 1
    for name in truth:
        assert got[name] == truth[name], (seed, name)
    for res in results:
        assert res["positive"] == sum(c for (_, s, _), c in truth[res["query"]].items() if s > 0)
        assert res["negative"] == sum(c for (_, s, _), c in truth[res["query"]].items() if s < 0)


class TooMany(Exception):
    pass


def brute_force(gadj, glab, qadj, qlab, max_count=None):
    """All embeddings of q in g as tuples (column u = data vertex of query vertex u).

    gadj / qadj: list of dict neighbor -> edge label; glab / qlab: vertex labels.
    Query vertices are placed in BFS order; the candidates of a vertex are the data
    neighbors of one placed query neighbor's image, the one with the fewest (all data
    vertices for the root), and every candidate is checked for label, injectivity and
    every query edge back to the vertices already placed (with its edge label).
    """
    nq = len(qlab)
    order, seen = [0], {0}
    for u in order:
        for w in sorted(qadj[u]):
            if w not in seen:
                seen.add(w)
                order.append(w)
    assert len(order) == nq, "query must be connected"
    back = [[(w, el) for w, el in qadj[u].items() if w in order[:i]] for i, u in enumerate(order)]
    f = [-1] * nq
    used = set()
    out = set()

    def rec(i):
        if i == nq:
            out.add(tuple(f))
            if max_count is not None and len(out) > max_count:
                raise TooMany
            return
        u = order[i]
        pool = min((gadj[f[w]] for w, _ in back[i]), key=len) if i else range(len(glab))
        for v in pool:
            if v in used or glab[v] != qlab[u]:
                continue
            if all(gadj[v].get(f[w]) == el for w, el in back[i]):
                f[u] = v
                used.add(v)
                rec(i + 1)
                used.discard(v)
        f[u] = -1

    rec(0)
    return out


def adjacency(n, edges):
    adj = [dict() for _ in range(n)]
    for a, b, el in edges:
        adj[a][b] = el
        adj[b][a] = el
    return adj
