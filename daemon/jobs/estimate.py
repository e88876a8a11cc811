"""Approximate counts: the work behind `csmd estimate` and `csmd admin estimate` (the sampler of
each backend is chosen in backends.py)."""

from __future__ import annotations

import time

from csmd.backends import make_sampler
from csmd.errors import CsmdError
from csmd.model.estimate import CONFIDENCE, Estimate, block_size, no_candidates, run_rounds
from csmd.model.graph import Graph
from csmd.model.plan import plan_query

METHODS = ("wj", "alley", "auto")
DEFAULT_REL_ERROR = 0.05
DEFAULT_TIME_LIMIT = 10.0
MAX_SEED = 2**128


def stop_rule(samples, rel_error, time_limit) -> tuple:
    """(samples, rel_error, time_limit) with the defaults: without --samples, stop at a relative
    error of 5% or after 10 s, whichever comes first."""
    if samples is None:
        return None, DEFAULT_REL_ERROR if rel_error is None else rel_error, \
            DEFAULT_TIME_LIMIT if time_limit is None else time_limit
    return samples, rel_error, time_limit


def run_estimate(g: Graph, q: Graph, name: str, *, method: str = "auto", samples=None, rel_error=None,
                 time_limit=None, seed: int = 0, trawl: int = 0, backend: str = "cpu") -> dict:
    """Plan q in g and estimate its number of embeddings; the JSON-ready result.

    trawl > 0 walks only to the last `trawl` query vertices of the order and counts the
    prefix's completions exactly (trawling): fewer, heavier samples with less variance each.
    A round of them is not cut short by time_limit (a cut-off count would bias the estimate).

    method auto takes Alley: on a tree query both walks draw from the same sets, and on
    a cyclic one Alley's intersected sets fail far less often. `seconds` covers the
    filtering and the sampling; time_limit only the sampling (filtering is not cut short).
    backend is "cpu" or "gpu" (engines.sampler_backend's answer).
    """
    if method not in METHODS:
        raise CsmdError(f"method must be one of {', '.join(METHODS)}, not {method!r}")
    if not 0 <= seed < MAX_SEED:
        raise CsmdError(f"seed must be in 0 .. 2**128 - 1 (the Philox key), not {seed}")
    t0 = time.monotonic()
    method = "alley" if method == "auto" else method
    samples, rel_error, time_limit = stop_rule(samples, rel_error, time_limit)
    plan = plan_query(g, q)
    if no_candidates(plan):
        est = Estimate(0.0, 0.0, 0.0, CONFIDENCE, 0, 0, 0, 0.0, exact=True)
    else:
        s = make_sampler(backend, g, plan, method, seed, trawl)
        est = run_rounds(s.draw, samples=samples, rel_error=rel_error, time_limit=time_limit,
                         block=block_size(samples, s.block_unit), max_round_blocks=s.max_round_blocks)
    return {"query": name, **est.as_dict(), "seconds": round(time.monotonic() - t0, 6), "method": method,
            "trawl": trawl, "backend": backend, "seed": seed}
