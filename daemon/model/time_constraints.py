"""A query's time constraints (`w SPAN`, `o i j` lines) and how a search checks them.

Under event time every data edge has a ts (NO_TS: an edge of an untimed initial graph). A
query may ask that a match's edges all fall within SPAN of one another (max ts - min ts <=
SPAN) and that some of its edges come strictly before others (`o i j`: the query's edge i,
counting its `e` lines from 0 in file order, has a smaller ts than edge j; a strict partial
order). A match that breaks them is no match: the searches test them as they extend a
partial match, never after. An edge without a ts constrains nothing (it never expires
either); a match's ts_min and ts_max are over the edges that have one.

A search reads a data pair's entry at a backward check and gets two ts: the arc from the
earlier depth's image to the new image ("out", as the earlier image sees the entry) and the
arc back ("in"); undirected, both are the edge's. `arcs_of_check` says which query edge each
of them is, so that the search keeps each constrained edge's ts and tests an order pair at the
depth that matches the later of its two edges.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

NO_TS = np.iinfo(np.int64).min  # an edge without an event time
MAX_ARCS = 1024  # distinct query edges a constraint may name (32 vertices hold at most 992 arcs)


@dataclass(frozen=True)
class QueryTime:
    """span: None or >= 0; order: (i, j) pairs over `edge` numbers, edge i before edge j; edge[k]:
    the number of the k-th e line's edge, one number per distinct edge (an undirected pair
    listed twice is one edge); ends[n]: edge n's ends (query vertex ids, internal), as written."""

    span: int | None
    order: tuple[tuple[int, int], ...]
    ends: tuple[tuple[int, int], ...]

    @property
    def constrained(self) -> bool:
        return self.span is not None or bool(self.order)


def query_time(lines: list[tuple[int, int]], span: int | None, order: list[tuple[int, int, int]],
               directed: bool, path) -> QueryTime | None:
    """The constraints of a query file: lines, the (u, v) (internal ids) of its e lines in file
    order; order, its `o i j` lines as (i, j, line number). Raises InputError for an edge number
    out of range or an order with a cycle (no match could keep it)."""
    from csmd.errors import InputError

    if span is None and not order:
        return None
    number: dict[tuple[int, int], int] = {}
    edge = []
    for u, v in lines:
        key = (u, v) if directed else (min(u, v), max(u, v))
        edge.append(number.setdefault(key, len(number)))
    pairs = []
    for i, j, lineno in order:
        for x in (i, j):
            if not 0 <= x < len(lines):
                raise InputError(path, lineno, f"o {i} {j}: the query has edges 0 .. {len(lines) - 1} (its e lines "
                                               f"in file order, from 0)")
        if edge[i] == edge[j]:
            raise InputError(path, lineno, f"o {i} {j}: an edge cannot come before itself")
        pairs.append((edge[i], edge[j], lineno))
    after: dict[int, set[int]] = {}
    for a, b, _ in pairs:
        after.setdefault(a, set()).add(b)
    for a, b, lineno in pairs:  # a cycle through a -> b: b reaches a
        seen, todo = set(), [b]
        while todo:
            x = todo.pop()
            if x == a:
                raise InputError(path, lineno, f"the o lines order edges in a cycle (through o {a} {b} in edge "
                                               f"numbers): no match can keep them")
            if x not in seen:
                seen.add(x)
                todo.extend(after.get(x, ()))
    ends = [None] * len(number)
    for (u, v), n in number.items():
        ends[n] = (u, v)
    return QueryTime(span, tuple(sorted({(a, b) for a, b, _ in pairs})), tuple(ends))


def require_ts(g) -> None:
    """A static search of a query with time constraints needs the graph's edge ts (InputError)."""
    from csmd.errors import InputError

    if g.edge_ts is None:
        raise InputError("data graph", None, "the query has time constraints ('w' or 'o' lines) but the graph's "
                                             "edges have no ts (a fifth field on e lines, or a ts column)")


def check_distinct(q, name) -> None:
    """--distinct keeps one embedding of each subgraph instance, by vertex ids (symmetry
    breaking): with `o` lines the embeddings of one instance differ in which edge comes first,
    so which one is kept would decide whether the instance matches. Refused (InputError)."""
    from csmd.errors import InputError

    if q.time is not None and q.time.order:
        raise InputError(name, None, "--distinct cannot be combined with 'o' lines (an order on the query's edges): "
                                     "an instance would match or not by which of its embeddings is kept")


def query_edges(q) -> tuple[tuple[int, int], ...]:
    """The ends of q's edges by number: QueryTime.ends, or without time constraints q's own edges
    (arcs) in its order: a timed search keeps every match's ts_min and ts_max all the same."""
    if q.time is not None:
        return q.time.ends
    s, d, _ = q.arcs()
    return tuple(zip(s.tolist(), d.tolist()))


def arcs_of_check(ends, directed: bool, earlier: int, later: int) -> tuple[int, int]:
    """The edge numbers (query_edges) of the arcs a backward check reads: (earlier -> later,
    later -> earlier), -1 where the query has no such edge (undirected: the pair's number, then -1)."""
    out = back = -1
    for n, (u, v) in enumerate(ends):
        if (u, v) == (earlier, later) or (not directed and (v, u) == (earlier, later)):
            out = n
        elif directed and (u, v) == (later, earlier):
            back = n
    return out, back


def checked_at(t: QueryTime | None, order: list[int]) -> list[list[tuple[int, int]]]:
    """Per depth of a matching order: the order pairs (i, j) whose later edge that depth matches."""
    out: list[list[tuple[int, int]]] = [[] for _ in order]
    if t is None:
        return out
    pos = {u: d for d, u in enumerate(order)}
    depth = [max(pos[u], pos[v]) for u, v in t.ends]
    for i, j in t.order:
        out[max(depth[i], depth[j])].append((i, j))
    return out
