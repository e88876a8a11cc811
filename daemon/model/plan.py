"""Query planning: candidate filters, matching orders, symmetry breaking.

The plan is engine-independent: the CPU and GPU matchers consume the same
`Plan` (order, backward neighbors with their edge labels, candidate masks,
symmetry constraints), so they agree by construction on what they search.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from csmd.model.direction import flip, label_test, passes
from csmd.model.graph import Graph, gather_ranges
from csmd.model.time_constraints import arcs_of_check, check_distinct, checked_at, query_edges

REFINE_ROUNDS = 3  # arc-consistency rounds; later rounds rarely remove anything


@dataclass
class Plan:
    """How to search for `query` in one data graph.

    order[i] is the query vertex matched at depth i; backward[i] lists
    (depth j < i, edge label) for the query edges from order[i] back to order[j], the label as
    order[j] sees it (a directed pair's code: the searches look order[i] up in the adjacency
    of order[j]'s image, model/direction.py);
    same_label[i] lists earlier depths with the same vertex label that are not
    adjacent (the only ones an injectivity check can fail on); less[i] lists
    earlier depths j whose image must be smaller (symmetry breaking, --distinct);
    greater[i] the earlier depths whose image must be larger. Time constraints
    (model/time_constraints.py): arcs[i] gives, per backward[i] entry, the query edge numbers
    of its arcs (earlier -> order[i], order[i] -> earlier; -1: none); before[i] the order pairs
    (edge a before edge b) depth i is the first to know both of; span the query's span.
    """

    query: Graph
    order: list[int]
    cand: list[np.ndarray]  # per query vertex: bool mask over data vertices
    backward: list[list[tuple[int, int]]] = field(default_factory=list)
    same_label: list[list[int]] = field(default_factory=list)
    less: list[list[int]] = field(default_factory=list)
    greater: list[list[int]] = field(default_factory=list)
    arcs: list[list[tuple[int, int]]] = field(default_factory=list)
    before: list[list[tuple[int, int]]] = field(default_factory=list)
    span: int | None = None

    @property
    def constrained(self) -> bool:
        """Whether its matches must keep a span or an order (no counting shortcut holds then)."""
        return self.span is not None or any(self.before)

    @property
    def depth(self) -> int:
        return len(self.order)


# ---- candidate filtering -------------------------------------------------------------
def _neighbor_label_counts(q: Graph, u: int) -> dict[int, int]:
    labels, counts = np.unique(q.labels[q.neighbors(u)], return_counts=True)
    return dict(zip(labels.tolist(), counts.tolist()))


def filter_candidates(g: Graph, q: Graph) -> list[np.ndarray]:
    """LDF + NLF, then arc-consistency refinement over query edges (with edge labels)."""
    deg = g.degrees
    cand = []
    for u in range(q.n):
        c = (g.labels == q.labels[u]) & (deg >= q.degrees[u])
        vs = np.flatnonzero(c)
        for lab, k in _neighbor_label_counts(q, u).items():
            start, end = g.ranges(vs, lab)
            bad = vs[(end - start) < k]
            c[bad] = False
            vs = vs[(end - start) >= k]
        cand.append(c)
    qs, qd, qe = q.edge_list()
    back = flip(qe) if q.directed else qe
    arcs = list(zip(qs.tolist(), qd.tolist(), qe.tolist())) + list(zip(qd.tolist(), qs.tolist(), back.tolist()))
    check_el = bool(g.nels.any()) or bool(qe.any())
    for _ in range(REFINE_ROUNDS):
        changed = False
        for u, w, el in arcs:
            # v stays in C(u) only if some neighbor of v is in C(w) over an edge labelled el;
            # only v's neighbors with w's label are looked at (one label-grouped range each)
            vs = np.flatnonzero(cand[u])
            start, end = g.ranges(vs, int(q.labels[w]))
            idx = gather_ranges(start, end - start)
            ok = cand[w][g.nbrs[idx]]
            if check_el:
                ok &= passes(g.nels[idx], label_test(el, q.directed))
            owner = np.repeat(np.arange(len(vs)), end - start)
            has = np.bincount(owner[ok], minlength=len(vs)) > 0
            if not has.all():
                cand[u][vs[~has]] = False
                changed = True
        if not changed:
            break
    return cand


# ---- ordering ------------------------------------------------------------------------
def query_adjacency(q: Graph) -> np.ndarray:
    """q's adjacency matrix (n x n, bool)."""
    a = np.zeros((q.n, q.n), bool)
    a[np.repeat(np.arange(q.n), np.diff(q.indptr)), q.indices] = True
    return a


def two_core(adj: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """The vertices of each query's 2-core: peel vertices of degree <= 1 until none is left.
    adj (Q, n, n) bool, valid (Q, n) bool; a tree has an empty core."""
    alive = valid.copy()
    while True:
        drop = alive & ((adj & alive[:, None, :]).sum(2) <= 1)
        if not drop.any():
            return alive
        alive &= ~drop


def greedy_orders(adj: np.ndarray, sizes: np.ndarray, nq: np.ndarray, prefix: np.ndarray | None = None
                  ) -> np.ndarray:
    """Connected matching orders of a batch of queries at once (GPU planning does hundreds).

    adj (Q, n, n) bool with query i using vertices < nq[i]; sizes (Q, n) what each
    vertex's candidates cost the engine (the CPU engine, which intersects candidate sets:
    their number; the GPU engine, which scans their neighbour ranges: their total degree);
    prefix (Q, k) fixes the first k vertices, else each order starts at the 2-core vertex
    with the cheapest candidates per edge. Then, among the vertices adjacent to the placed
    ones: 2-core vertices before the trees hanging off it, and vertices with neighbours
    still to place before those whose neighbours are all placed (such a vertex constrains
    nothing after it: its candidates only multiply the partial matches, so it goes last);
    then the most edges back to the placed vertices (each is a filter), the cheapest
    candidates, the highest degree, the lowest id. Returns (Q, n), padded with -1.
    """
    nb, n, _ = adj.shape
    adj = adj.astype(bool)
    deg = adj.sum(2)
    valid = np.arange(n) < nq[:, None]
    core = two_core(adj, valid)
    sizes = np.asarray(sizes, np.int64)
    placed = np.zeros((nb, n), bool)
    back = np.zeros((nb, n), np.int64)
    order = np.full((nb, n), -1, np.int64)
    rows = np.arange(nb)

    def place(k: int, u: np.ndarray) -> None:
        live = k < nq
        r, u = rows[live], u[live]
        order[r, k] = u
        placed[r, u] = True
        back[r] += adj[r, u]

    if prefix is None:
        first = np.where(core.any(1)[:, None], core, valid)
        place(0, np.where(first, sizes / np.maximum(deg, 1), np.inf).argmin(1))
    else:
        for k in range(prefix.shape[1]):
            place(k, prefix[:, k])
    span = int(sizes.max(initial=0)) + 1
    for k in range(1 if prefix is None else prefix.shape[1], n):
        key = ((~core * 2 + (back == deg)) * (n + 1) + n - back) * span + sizes
        key = key * (n + 1) + n - deg
        place(k, np.where(valid & ~placed & (back > 0), key, np.iinfo(np.int64).max).argmin(1))
    return order


def _greedy_order(q: Graph, sizes: np.ndarray, prefix: list[int] | None) -> list[int]:
    pre = None if prefix is None else np.array([prefix])
    return greedy_orders(query_adjacency(q)[None], np.asarray(sizes)[None], np.array([q.n]), pre)[0].tolist()


def order_from_sizes(q: Graph, sizes: np.ndarray) -> list[int]:
    """The static order from candidate counts alone."""
    return _greedy_order(q, sizes, None)


def anchor_order(q: Graph, sizes: np.ndarray, a: int, b: int) -> list[int]:
    """Order for incremental matching seeded with query edge (a, b)."""
    return _greedy_order(q, sizes, [a, b])


def matching_order(q: Graph, cand: list[np.ndarray]) -> list[int]:
    return order_from_sizes(q, np.array([int(c.sum()) for c in cand]))


def make_plan(q: Graph, cand: list[np.ndarray], order: list[int], sym: list[tuple[int, int]] = ()) -> Plan:
    """Derive the per-depth checks from an order; `sym` holds (x, y) with f(x) < f(y)."""
    pos = {u: i for i, u in enumerate(order)}
    t, ends = q.time, query_edges(q)
    plan = Plan(q, order, cand, before=checked_at(t, order), span=None if t is None else t.span)
    for i, u in enumerate(order):
        nbrs = q.neighbors(u)
        els = q.elabels[q.indptr[u]:q.indptr[u + 1]]
        if q.directed:
            els = flip(els)  # as the earlier depth sees the pair
        back = sorted((pos[int(w)], int(e)) for w, e in zip(nbrs, els) if pos[int(w)] < i)
        adjacent = {j for j, _ in back}
        plan.backward.append(back)
        plan.arcs.append([arcs_of_check(ends, q.directed, order[j], u) for j, _ in back])
        plan.same_label.append([j for j in range(i) if j not in adjacent and q.labels[order[j]] == q.labels[u]])
        plan.less.append(sorted(pos[x] for x, y in sym if y == u and pos[x] < i))
        plan.greater.append(sorted(pos[y] for x, y in sym if x == u and pos[y] < i))
    return plan


def plan_query(g: Graph, q: Graph, distinct: bool = False) -> Plan:
    """The static plan: filtered candidates, an order, and symmetry constraints if asked."""
    if distinct:
        check_distinct(q, "query")
    cand = filter_candidates(g, q)
    sym = symmetry_constraints(q)[0] if distinct else []
    return make_plan(q, cand, matching_order(q, cand), sym)


# ---- automorphisms and symmetry breaking ------------------------------------------------
def _colors(q: Graph, fixed: list[int]) -> list[int]:
    """Colour refinement (1-WL) with the vertices in `fixed` individualized."""
    color = [(int(q.labels[u]), int(q.degrees[u]), fixed.index(u) if u in fixed else -1) for u in range(q.n)]
    for _ in range(q.n):
        sig = [
            (color[u], tuple(sorted((color[int(w)], int(e)) for w, e in zip(q.neighbors(u), q.elabels[q.indptr[u]:q.indptr[u + 1]]))))
            for u in range(q.n)
        ]
        ids = {s: i for i, s in enumerate(sorted(set(sig)))}
        new = [ids[s] for s in sig]
        if len(set(new)) == len(set(color)):
            return new
        color = new
    return [ids[s] for s in sig]


def _find_automorphism(q: Graph, colors: list[int], fixed: list[int], v: int, w: int) -> bool:
    """Is there an automorphism fixing `fixed` pointwise that maps v to w?"""
    adj = [dict(zip(q.neighbors(u).tolist(), q.elabels[q.indptr[u]:q.indptr[u + 1]].tolist())) for u in range(q.n)]
    f = {s: s for s in fixed}
    f[v] = w
    if any(adj[a].get(b) != adj[f[a]].get(f[b]) for a in f for b in adj[a] if b in f):
        return False
    # visit in BFS order from the assigned vertices so every step is constrained
    order, seen = [], set(f)
    frontier = list(f)
    while frontier:
        nxt = []
        for a in frontier:
            for b in adj[a]:
                if b not in seen:
                    seen.add(b)
                    order.append(b)
                    nxt.append(b)
        frontier = nxt
    used = set(f.values())

    def extend(i: int) -> bool:
        if i == len(order):
            return True
        x = order[i]
        for y in range(q.n):
            if y in used or colors[y] != colors[x]:
                continue
            if all(adj[y].get(f[z]) == el for z, el in adj[x].items() if z in f):
                f[x] = y
                used.add(y)
                if extend(i + 1):
                    return True
                del f[x]
                used.discard(y)
        return False

    return extend(0)


def symmetry_constraints(q: Graph) -> tuple[list[tuple[int, int]], int]:
    """Grochow-Kellis symmetry breaking: constraints (v, w) meaning f(v) < f(w), and |Aut(q)|.

    Walks the stabilizer chain: at each step the orbits of the pointwise
    stabilizer of the chosen vertices are found by searching for single
    automorphisms; |Aut| is the product of the chosen orbits' sizes.
    """
    fixed: list[int] = []
    constraints: list[tuple[int, int]] = []
    aut = 1
    while True:
        colors = _colors(q, fixed)
        orbit_of: dict[int, list[int]] = {}
        for v in range(q.n):
            if v in fixed or v in orbit_of:
                continue
            orbit = [v]
            for w in range(v + 1, q.n):
                if w not in fixed and w not in orbit_of and colors[w] == colors[v] and _find_automorphism(q, colors, fixed, v, w):
                    orbit.append(w)
            for x in orbit:
                orbit_of[x] = orbit
        biggest = max(orbit_of.values(), key=len, default=[])
        if len(biggest) <= 1:
            return constraints, aut
        v = biggest[0]
        constraints.extend((v, w) for w in biggest[1:])
        aut *= len(biggest)
        fixed.append(v)
