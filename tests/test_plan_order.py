"""Matching orders (plan.greedy_orders) on random queries: what the rules promise.

Every order is a connected permutation that keeps its prefix; the 2-core comes before
the trees hanging off it; a vertex whose neighbours were all placed when it was chosen
is chosen only when no eligible vertex of its class still had neighbours to place;
a batch gives the same orders as one query at a time.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from csmd.model.plan import anchor_order, greedy_orders, order_from_sizes, query_adjacency, two_core

from static_cases import random_connected_query, to_graph


def random_query(seed: int):
    rng = random.Random(seed)
    q = to_graph(*random_connected_query(rng, rng.randint(2, 20), 3, 1))
    return q, np.array([rng.randint(1, 500) for _ in range(q.n)])


def core_by_peeling(q) -> set[int]:
    """The 2-core, the slow and obvious way."""
    alive = set(range(q.n))
    while True:
        drop = {u for u in alive if len(set(q.neighbors(u).tolist()) & alive) <= 1}
        if not drop:
            return alive
        alive -= drop


@pytest.mark.parametrize("seed", range(200))
def test_order_rules(seed):
    q, sizes = random_query(seed)
    order = order_from_sizes(q, sizes)
    assert sorted(order) == list(range(q.n))
    core = core_by_peeling(q)
    nbrs = [set(q.neighbors(u).tolist()) for u in range(q.n)]
    if core:
        assert order[0] in core
        assert all(u in core for u in order[:len(core)]), "the 2-core first"
    for i in range(1, q.n):
        placed, u = set(order[:i]), order[i]
        assert nbrs[u] & placed, "connected"
        frontier = [w for w in range(q.n) if w not in placed and nbrs[w] & placed]
        same_class = [w for w in frontier if (w in core) == (u in core)]
        if nbrs[u] <= placed | {u}:  # u constrains nothing after it
            assert all(nbrs[w] <= placed | {w} for w in same_class), f"deferred vertex chosen early: {order}"
    assert set(np.flatnonzero(two_core(query_adjacency(q)[None], np.ones((1, q.n), bool))[0]).tolist()) == core


def test_anchor_order_keeps_the_edge():
    for seed in range(50):
        q, sizes = random_query(seed)
        a = int(q.indices[0])
        b = 0
        order = anchor_order(q, sizes, b, a)
        assert order[:2] == [b, a] and sorted(order) == list(range(q.n))


def test_batch_equals_one_at_a_time():
    cases = [random_query(seed) for seed in range(60)]
    width = max(q.n for q, _ in cases)
    adj = np.zeros((len(cases), width, width), bool)
    sizes = np.zeros((len(cases), width), np.int64)
    for i, (q, s) in enumerate(cases):
        adj[i, :q.n, :q.n] = query_adjacency(q)
        sizes[i, :q.n] = s
    got = greedy_orders(adj, sizes, np.array([q.n for q, _ in cases]))
    for i, (q, s) in enumerate(cases):
        assert got[i, :q.n].tolist() == order_from_sizes(q, s) and (got[i, q.n:] == -1).all()


@pytest.mark.parametrize("seed", range(40))
def test_branch_order_makes_independent_parts_contiguous(seed):
    """The compiled engine's counting order: a connected permutation that keeps the prefix, and
    at every depth the vertices that its connected part (of the query without the vertices
    before) holds come as one run, led by the one of them the order had first."""
    from csmd.cpu.plans import branch_order

    q, sizes = random_query(seed)
    fixed = 1 + seed % 2
    base = anchor_order(q, sizes, 0, int(q.indices[0])) if fixed == 2 else order_from_sizes(q, sizes)
    order = branch_order(q, base, fixed)
    assert sorted(order) == list(range(q.n)) and order[:fixed] == base[:fixed]
    for i in range(1, q.n):
        assert set(q.neighbors(order[i]).tolist()) & set(order[:i])
    for i in range(fixed, q.n):  # the part of order[i] among the vertices from i on
        left, part, todo = set(order[i:]), {order[i]}, [order[i]]
        while todo:
            for w in q.neighbors(todo.pop()).tolist():
                if w in left and w not in part:
                    part.add(w)
                    todo.append(w)
        assert set(order[i:i + len(part)]) == part
        assert order[i] == next(u for u in base if u in part)


def test_joined_plan_sets_equal_one_flattening():
    """The compiled engine flattens each query's plans at registration and joins the registered
    ones: the same arrays as flattening every plan at once."""
    from csmd.cpu.plans import joined, plan_set
    from csmd.model.plan import make_plan

    per_query = []
    for seed in range(12):
        q, sizes = random_query(seed)
        per_query.append([make_plan(q, None, anchor_order(q, sizes, 0, int(w))) for w in q.neighbors(0).tolist()])
    one = plan_set([p for plans in per_query for p in plans], [i for i, plans in enumerate(per_query) for _ in plans])
    both = joined([plan_set(plans, [0] * len(plans)) for plans in per_query])
    for field in one._fields:
        assert getattr(one, field).dtype == getattr(both, field).dtype
        assert getattr(one, field).tolist() == getattr(both, field).tolist(), field
