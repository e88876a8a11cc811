"""One-shot static queries: the work behind `csmd match` (and later `csmd admin match`)."""

from __future__ import annotations

import time

from .cpu_matcher import DEFAULT_BUDGET_BYTES, search
from .graph import Graph
from .plan import plan_query


def run_query(g: Graph, q: Graph, name: str, *, backend: str = "cpu", distinct: bool = False,
              limit=None, time_limit=None, writer=None, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> dict:
    """Plan and search one query on `backend` ("cpu" or "gpu"); returns the JSON-ready result.

    With `writer` (a MatchFile) every match found is written to it as it is found.
    `time_limit` covers planning and search together.
    """
    t0 = time.monotonic()
    sink = None
    if writer is not None:
        written = [0]

        def sink(rows):
            writer.write(name, written[0], rows)
            written[0] += len(rows)

    if backend == "gpu":
        from csmd.gpu.static import match  # CuPy is optional: imported only when asked for

        res = match(g, q, distinct=distinct, limit=limit, time_limit=time_limit, sink=sink)
    else:
        plan = plan_query(g, q, distinct=distinct)
        remaining = None if time_limit is None else max(0.0, time_limit - (time.monotonic() - t0))
        res = search(g, plan, limit=limit, time_limit=remaining, sink=sink, budget_bytes=budget_bytes)
    return {
        "query": name,
        "matches": res.count,
        "complete": res.complete,
        "seconds": round(time.monotonic() - t0, 6),
        "search_seconds": round(res.seconds, 6),
        "distinct": distinct,
        "backend": backend,
    }
