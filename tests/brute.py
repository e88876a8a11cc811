"""Independent truth for the tests: brute-force embedding enumeration, sharing no code with csmd."""


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
