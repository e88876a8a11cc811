"""Matching plans flattened for the compiled search (dfs.py), and the search's own state.

Besides the per-depth checks, each plan row carries where its independent segment
ends and the one earlier depth that segment depends on: a count-only search counts
independent segments separately and multiplies, and remembers a segment's count by
that depth's image.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from csmd.model.direction import label_test
from csmd.model.graph import Graph
from csmd.model.plan import Plan
from csmd.model.time_constraints import MAX_ARCS

MAX_DEPTH = 32  # query vertices (docs/design.md section 1)
# the checks of one depth, in this order: backward edges, same-label (injectivity), less, greater,
# the time order pairs it is the first to know both edges of (model/time_constraints.py)
BACKWARD, SAME_LABEL, LESS, GREATER, ORDER = range(5)


class PlanSet(NamedTuple):
    """Several plans flattened: plan p's depths are the rows off[p] .. off[p] + depth[p] - 1."""

    off: np.ndarray  # int64 per plan
    depth: np.ndarray  # int64 per plan
    query: np.ndarray  # int64 per plan: which query it belongs to (a query has one plan per anchor)
    tail: np.ndarray  # int64 per plan: the first depth of its independent tail (see _tail)
    order: np.ndarray  # int64 per row: the query vertex matched at that depth
    qlab: np.ndarray  # int32 per row: its label
    chk: np.ndarray  # int64 (rows, 6): check kind k of a row is chk_j[chk[r, k]:chk[r, k + 1]]
    chk_j: np.ndarray  # int64: the earlier depth a check refers to (ORDER: the edge that comes first)
    chk_test: np.ndarray  # int64: the edge-label test of a backward check (model/direction.py label_test);
                          # ORDER: the edge that comes later
    chk_out: np.ndarray  # int64: the query edge number of a backward check's arc earlier -> later (-1: none)
    chk_back: np.ndarray  # int64: and of its arc back (Plan.arcs)
    seg: np.ndarray  # int64 per row: where the independent segment that starts at it ends (_segments)
    memo: np.ndarray  # int64 per row: the one earlier depth its segment refers to (its count is memoised
                      # by that depth's image), -1 when it refers to several
    span: np.ndarray  # int64 per plan: its query's span, -1: none
    timed: np.ndarray  # bool per plan: it has time constraints (a search keeps its edges' ts, and counts
                       # each match: no product of segment counts holds then)


def _refers(plan: Plan) -> list[set[int]]:
    """The earlier depths each depth's checks refer to (edges, injectivity, symmetry)."""
    return [{j for j, _ in plan.backward[d]} | set(plan.same_label[d]) | set(plan.less[d]) | set(plan.greater[d])
            for d in range(plan.depth)]


def _segments(plan: Plan) -> list[int]:
    """Per depth d: the smallest e > d such that no depth from e on refers to one in [d, e). Given
    the images above d, the completions of [d, e) and of [e, k) are then independent, and the
    matches below d number their product (a tree query's subtrees, say)."""
    refers, k = _refers(plan), plan.depth
    seg = []
    for d in range(k):
        e = d + 1
        while any(refers[x] & set(range(d, e)) for x in range(e, k)):
            e += 1
        seg.append(e)
    return seg


def _boundaries(plan: Plan, seg: list[int]) -> list[int]:
    """Per depth d: the one depth above d that the segment [d, seg[d]) refers to, else -1."""
    refers = _refers(plan)
    out = []
    for d, e in enumerate(seg):
        outside = set().union(*refers[d:e]) - set(range(d, e))
        out.append(outside.pop() if len(outside) == 1 else -1)
    return out


def _tail(plan: Plan) -> int:
    """The first depth T (>= 1) from which no depth refers to another depth >= T: each depth of
    the tail is a segment of its own, so its completions are a product of candidate counts."""
    refers = _refers(plan)
    t = max(plan.depth - 1, 1)
    while t > 1 and all(j < t - 1 for x in range(t - 1, plan.depth) for j in refers[x]):
        t -= 1
    return t


def branch_order(q: Graph, order: list[int], fixed: int) -> list[int]:
    """`order` with its first `fixed` vertices kept and the rest regrouped: where the vertices
    left fall into parts that no query edge joins, each part is matched whole before the next
    (parts in the order their first vertices had, each part's vertices in their own order),
    and so on within each part. A counting search then finds each part as an independent
    segment and multiplies the counts; interleaved (a tree query's branches, say), the parts
    make one segment, searched as a product. Every vertex still follows a neighbour."""
    out = list(order[:fixed])

    def place(rest: list[int]) -> None:
        while rest:
            part, todo, left = {rest[0]}, [rest[0]], set(rest)
            while todo:
                for w in q.neighbors(todo.pop()).tolist():
                    if w in left and w not in part:
                        part.add(w)
                        todo.append(w)
            mine = [u for u in rest if u in part]
            out.append(mine[0])
            place(mine[1:])
            rest = [u for u in rest if u not in part]

    place([int(u) for u in order[fixed:]])
    return out


def plan_set(plans: list[Plan], query_of: list[int]) -> PlanSet:
    """Flatten plans (plans[i] belongs to query query_of[i])."""
    depth = np.array([p.depth for p in plans], np.int64)
    off = np.concatenate([[0], np.cumsum(depth)[:-1]]).astype(np.int64)
    order, qlab, chk, chk_j, chk_test, chk_out, chk_back, seg, memo = [], [], [], [], [], [], [], [], []
    for p in plans:
        if p.depth > MAX_DEPTH:
            raise ValueError(f"a query has {p.depth} vertices; at most {MAX_DEPTH} are supported")
        segments = _segments(p)
        seg.extend(segments)
        memo.extend(_boundaries(p, segments))
        for i, u in enumerate(p.order):
            order.append(u)
            qlab.append(int(p.query.labels[u]))
            row = [len(chk_j)]
            for (j, el), (out, back) in zip(p.backward[i], p.arcs[i]):
                chk_j.append(j)
                chk_test.append(int(label_test(el, p.query.directed)))
                chk_out.append(out)
                chk_back.append(back)
            for kind in (p.same_label[i], p.less[i], p.greater[i]):
                row.append(len(chk_j))
                chk_j.extend(kind)
                chk_test.extend([0] * len(kind))
            row.append(len(chk_j))
            for a, b in p.before[i]:
                chk_j.append(a)
                chk_test.append(b)
            row.append(len(chk_j))
            chk.append(row)
            chk_out.extend([-1] * (len(chk_j) - len(chk_out)))
            chk_back.extend([-1] * (len(chk_j) - len(chk_back)))
    timed = np.array([p.constrained for p in plans], np.bool_)
    tail = np.array([p.depth if p.constrained else _tail(p) for p in plans], np.int64)
    span = np.array([-1 if p.span is None else p.span for p in plans], np.int64)
    return PlanSet(off, depth, np.array(query_of, np.int64), tail, np.array(order, np.int64), np.array(qlab, np.int32),
                   np.array(chk, np.int64).reshape(-1, 6), np.array(chk_j, np.int64), np.array(chk_test, np.int64),
                   np.array(chk_out, np.int64), np.array(chk_back, np.int64), np.array(seg, np.int64),
                   np.array(memo, np.int64), span, timed)


def joined(sets: list[PlanSet]) -> PlanSet:
    """Plan sets of one query each as one set, the plans of sets[i] belonging to query i (only
    the row and check offsets move: the rest refers to depths)."""
    if len(sets) == 1:
        return sets[0]
    rows = np.cumsum([0] + [len(s.order) for s in sets[:-1]])
    checks = np.cumsum([0] + [len(s.chk_j) for s in sets[:-1]])

    def cat(field, shift=None):
        return np.concatenate([getattr(s, field) if shift is None else getattr(s, field) + shift[i]
                               for i, s in enumerate(sets)])

    query = np.concatenate([np.full(len(s.off), i, np.int64) for i, s in enumerate(sets)])
    return PlanSet(cat("off", rows), cat("depth"), query, cat("tail"), cat("order"), cat("qlab"), cat("chk", checks),
                   cat("chk_j"), cat("chk_test"), cat("chk_out"), cat("chk_back"), cat("seg"), cat("memo"), cat("span"),
                   cat("timed"))


class State(NamedTuple):
    """A search's stack: images, the candidate range being walked and the backward ranges, per depth."""

    m: np.ndarray  # int32 (MAX_DEPTH,): the image of each depth
    pos: np.ndarray  # int64 (MAX_DEPTH,): next candidate entry
    end: np.ndarray
    piv: np.ndarray  # int64 (MAX_DEPTH,): which backward range the candidates come from
    rs: np.ndarray  # int64 (MAX_DEPTH, MAX_DEPTH): start of each backward range
    re: np.ndarray
    at: np.ndarray  # int64 (4,): the current depth, the next root (static search), candidates counted,
                    # partial matches made by enumeration (what time constraints cut: bench/temporal.py)
    acc: np.ndarray  # int64 (MAX_DEPTH,): counting, per depth: the segment's completions so far
    prod: np.ndarray  # int64 (MAX_DEPTH,): counting: the product along the current candidate's chain
    stack: np.ndarray  # int64 (MAX_DEPTH,): counting: the depths of the open segments
    hit: np.ndarray  # int64 (MAX_DEPTH, MAX_DEPTH): the entry each backward check found for the candidate
    tlo: np.ndarray  # int64 (MAX_DEPTH,): with time: the smallest ts of the edges matched down to a depth
    thi: np.ndarray  # and the largest (NO_TS and its opposite while none of them has a ts)
    ets: np.ndarray  # int64 (MAX_ARCS,): with time: the ts of each query edge matched (NO_TS: none)


@njit(cache=True, nogil=True)
def new_state():
    d = MAX_DEPTH
    return State(np.zeros(d, np.int32), np.zeros(d, np.int64), np.zeros(d, np.int64), np.zeros(d, np.int64),
                 np.zeros((d, d), np.int64), np.zeros((d, d), np.int64), np.zeros(4, np.int64),
                 np.zeros(d, np.int64), np.zeros(d, np.int64), np.zeros(d, np.int64), np.zeros((d, d), np.int64),
                 np.zeros(d, np.int64), np.zeros(d, np.int64), np.zeros(MAX_ARCS, np.int64))


class Memo(NamedTuple):
    """Segment counts by (depth, image of the segment's one boundary depth), valid while stamp == the
    search's id: a segment's count depends on nothing else at one timestamp of one plan."""

    stamp: np.ndarray  # int64 (depths, vertices)
    count: np.ndarray  # int64 (depths, vertices); no rows: no memo
