"""One-shot static queries: the work behind `csmd match` and `csmd admin match`, on any engine."""

from __future__ import annotations

import time

from csmd.backends import static_matcher
from csmd.model.graph import Graph


def run_query(g: Graph, q: Graph, name: str, *, backend: str = "cpu", distinct: bool = False,
              limit=None, time_limit=None, writer=None, gpus: int | str = 1) -> dict:
    """Plan and search one query on `backend` ("cpu" or "gpu"; gpus: the GPU engine's devices, as
    `--gpus` takes them); returns the JSON-ready result.

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

    res = static_matcher(backend, gpus).match(g, q, distinct=distinct, limit=limit, time_limit=time_limit, sink=sink)
    return _result(name, res, time.monotonic() - t0, distinct, backend)


def run_queries(g: Graph, queries: list[tuple[str, Graph]], *, backend: str = "cpu", distinct: bool = False,
                limit=None, time_limit=None, writer=None, gpus: int | str = 1):
    """run_query over (name, query) pairs, yielding each result as it is ready. Counting
    several queries (no limit, no writer) is one match_many call: on the GPU one search,
    where every query has time_limit seconds from its start and seconds is the batch's time."""
    if len(queries) > 1 and limit is None and writer is None and backend == "gpu":
        for (name, _), res in zip(queries, static_matcher(backend, gpus).match_many(
                g, [q for _, q in queries], distinct=distinct, time_limit=time_limit)):
            yield _result(name, res, res.seconds, distinct, backend)
        return
    for name, q in queries:
        yield run_query(g, q, name, backend=backend, distinct=distinct, limit=limit, time_limit=time_limit,
                        writer=writer, gpus=gpus)


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
