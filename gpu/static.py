"""The GPU engine's one-shot static query: filter on the device, plan on the host, enumerate."""

from __future__ import annotations

import time

from csmd.cpu_matcher import SearchResult
from csmd.graph import Graph
from csmd.plan import Plan, make_plan, order_from_sizes, symmetry_constraints

from .device_graph import DeviceGraph, device_graph
from .filtering import by_depth, filter_candidates
from .matcher import Tuning, enumerate_matches


def plan_on_device(dg: DeviceGraph, q: Graph, distinct: bool = False):
    """(plan, cbits by depth, roots), or None when some query vertex has no candidate
    (or a query edge label the graph does not have): then there is no match."""
    if q.elabels.any() and not dg.has_edge_labels:
        return None
    cbits, sizes = filter_candidates(dg, q)
    if not sizes.all():
        return None
    order = order_from_sizes(q, sizes)
    sym = symmetry_constraints(q)[0] if distinct else []
    plan: Plan = make_plan(q, None, order, sym)
    return plan, cbits, by_depth(dg, cbits, order)


def match(g: Graph | DeviceGraph, q: Graph, *, distinct: bool = False, limit=None, time_limit=None, sink=None,
          tuning: Tuning | None = None, balance: dict | None = None) -> SearchResult:
    """Plan and enumerate q in g on the GPU; `time_limit` covers both. seconds = both."""
    t0 = time.monotonic()
    dg = g if isinstance(g, DeviceGraph) else device_graph(g)
    planned = plan_on_device(dg, q, distinct)
    if planned is None:
        return SearchResult(0, limit is None or limit > 0, time.monotonic() - t0)
    plan, cbits, roots = planned
    left = None if time_limit is None else max(0.0, time_limit - (time.monotonic() - t0))
    res = enumerate_matches(dg, plan, cbits, roots, limit=limit, time_limit=left, sink=sink, tuning=tuning,
                            balance=balance)
    return SearchResult(res.count, res.complete, time.monotonic() - t0)
