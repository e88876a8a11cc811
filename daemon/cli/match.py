"""One-shot static queries: the work behind `csmd match` (and later `csmd admin match`)."""

from __future__ import annotations

import time

from csmd.cpu.matcher import DEFAULT_BUDGET_BYTES, search
from csmd.model.graph import Graph
from csmd.model.plan import plan_query


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
    return _result(name, res, time.monotonic() - t0, distinct, backend)


def run_queries(g: Graph, queries: list[tuple[str, Graph]], *, backend: str = "cpu", distinct: bool = False,
                limit=None, time_limit=None, writer=None, budget_bytes: int = DEFAULT_BUDGET_BYTES):
    """run_query over (name, query) pairs, yielding each result as it is ready. On the GPU,
    counting several queries (no limit, no writer) is one batch: every query then has
    time_limit seconds from the batch's start, and seconds is the batch's time."""
    if backend == "gpu" and len(queries) > 1 and limit is None and writer is None:
        from csmd.gpu.static import match_many

        for (name, _), res in zip(queries, match_many(g, [q for _, q in queries], distinct=distinct,
                                                      time_limit=time_limit)):
            yield _result(name, res, res.seconds, distinct, backend)
        return
    for name, q in queries:
        yield run_query(g, q, name, backend=backend, distinct=distinct, limit=limit, time_limit=time_limit,
                        writer=writer, budget_bytes=budget_bytes)


def _result(name: str, res, seconds: float, distinct: bool, backend: str) -> dict:
    return {
        "query": name,
        "matches": res.count,
        "complete": res.complete,
        "seconds": round(seconds, 6),
        "search_seconds": round(res.seconds, 6),
        "distinct": distinct,
        "backend": backend,
    }
