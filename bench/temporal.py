"""Temporal fraud patterns on a sliding window: updates/s, memory over time, and what the time constraints cut.

    python bench/temporal.py [--scale 18] [--live 500000] [--stream 200000] [--backend cpu]
                             [--batch-size 4096] [--span 20000] [--samples 8]

A directed R-MAT power-law graph (bench/directed.py's draws: 8 vertex labels, edge label 0)
as a timed stream: arc k has ts k. The first --live arcs are the initial graph (ts 0 ..
live - 1) and the next --stream arcs are inserted one by one under a window of --live ts
units, so every insertion expires the oldest live arc and the graph keeps its size (the
updates are the insertions plus as many expiries). Two money-flow patterns are registered
together, count-only:

- cycle3: a 3-cycle of transfers within --span (`w SPAN`);
- cycle4: a 4-cycle of transfers, each after the one before (`o 0 1`, `o 1 2`, `o 2 3`).

Modes: `constrained` (the patterns as above), `unconstrained` (the same shapes without `w`
and `o`: every match), and `no cut` (the same shapes with a span no match exceeds: searched
as the constrained ones are, match by match, but cutting nothing). Per mode: updates/s of
the whole stream, the deltas (positive, negative), the partial matches the search made by
enumeration (compiled CPU engine), and per sample (every stream/--samples insertions) the
live graph's versions, the process's RSS and, on the GPU, the device memory the engine
holds: flat when the window holds the graph's size. The share of partial matches the
constraints cut is 1 - constrained / no cut.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from directed import VERTEX_LABELS, rmat_arcs  # noqa: E402

from csmd.backends import continuous_engine, resolve_backend, warm_once  # noqa: E402
from csmd.model.formats import Update, parse_query_text  # noqa: E402
from csmd.model.graph import Graph  # noqa: E402
from csmd.model.labels import LabelNames  # noqa: E402
from csmd.pipeline.event_time import EventTime  # noqa: E402
from csmd.pipeline.stages import Pipeline  # noqa: E402

SHAPES = {"cycle3": [(0, 1), (1, 2), (2, 0)], "cycle4": [(0, 1), (1, 2), (2, 3), (3, 0)]}
NO_CUT = 1 << 62  # a span no match of the stream exceeds


def query_text(arcs, constraint: str) -> str:
    n = max(max(a) for a in arcs) + 1
    return "".join(f"v {i} {i}\n" for i in range(n)) + "".join(f"e {u} {v} 0\n" for u, v in arcs) + constraint


def queries(mode: str, span: int) -> list[tuple[str, Graph]]:
    names = LabelNames(directed=True, timed=True)
    cons = {"constrained": {"cycle3": f"w {span}\n", "cycle4": "o 0 1\no 1 2\no 2 3\n"},
            "unconstrained": {"cycle3": "", "cycle4": ""},
            "no cut": {"cycle3": f"w {NO_CUT}\n", "cycle4": f"w {NO_CUT}\n"}}[mode]
    return [(name, parse_query_text(query_text(arcs, cons[name]), name, names)) for name, arcs in SHAPES.items()]


def workload(scale: int, live: int, stream: int, seed: int):
    """The initial graph (directed, its arcs' ts 0 .. live - 1) and the stream's arcs, in order."""
    rng = np.random.default_rng(seed)
    src, dst = rmat_arcs(scale, 2 * (live + stream), rng)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    _, first = np.unique(src * (1 << scale) + dst, return_index=True)  # each arc once: a repeat is no update
    first = np.sort(first)[: live + stream]
    src, dst = src[first], dst[first]
    labels = rng.integers(0, VERTEX_LABELS, 1 << scale).astype(np.int32)
    g0 = Graph.from_edges(labels, src[:live], dst[:live], directed=True)
    g0.edge_ts = (src[:live], dst[:live], np.arange(live, dtype=np.int64))
    return g0, src[live:], dst[live:]


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run(mode: str, g0: Graph, src, dst, args) -> dict:
    live = len(g0.edge_ts[2])
    engine = continuous_engine(args.backend, g0, timed=True)
    pipe = Pipeline(g0, engine=engine, batch_size=args.batch_size,
                    event_time=EventTime(live))
    for name, q in queries(mode, args.span):
        pipe.add_query(name, q, count_only=True)
    pipe.warm()
    every = max(len(src) // args.samples, 1)
    samples, totals = [], {name: [0, 0] for name in SHAPES}
    t0 = time.perf_counter()

    def updates():
        for k, (u, v) in enumerate(zip(src.tolist(), dst.tolist())):
            if k % every == 0 and k:
                st = engine.stats()
                samples.append((k, time.perf_counter() - t0, st.live_versions, rss_mb(), st.memory_bytes / 2**20))
            yield Update("e", u, v, 0, source=f"stream:{k}", ts=live + k)

    def on_result(result):
        for d in getattr(result, "deltas", ()):  # a batch's (a marker has none)
            totals[d.name][0] += d.positive
            totals[d.name][1] += d.negative

    pipe.run(updates(), on_result)
    seconds = time.perf_counter() - t0
    return {"mode": mode, "seconds": seconds, "totals": totals, "samples": samples,
            "partial": getattr(engine, "partial_matches", None), "expired": pipe.sequencer.clock.expired}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scale", type=int, default=18)
    ap.add_argument("--live", type=int, default=500_000, help="arcs in the window (the graph's steady size)")
    ap.add_argument("--stream", type=int, default=200_000, help="insertions (each also expires one arc)")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--span", type=int, default=20_000)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--modes", default="constrained,unconstrained,no cut")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    backend = resolve_backend(args.backend)
    warm_once(backend)
    g0, src, dst = workload(args.scale, args.live, args.stream, args.seed)
    print(f"directed R-MAT 2^{args.scale}: {len(g0.edge_ts[2])} live arcs (window {len(g0.edge_ts[2])} ts units), "
          f"{len(src)} insertions (each expires one: {2 * len(src)} updates); cycle3 within span {args.span}, cycle4 "
          f"in order; count-only, batch {args.batch_size}; {backend} engine, {os.cpu_count()} cores")
    results = [run(mode, g0, src, dst, args) for mode in args.modes.split(",")]
    print(f"\n{'mode':<14} {'seconds':>8} {'updates/s':>10} {'cycle3 +/-':>22} {'cycle4 +/-':>22} {'partial matches':>16}")
    for r in results:
        ups = (len(src) + r["expired"]) / r["seconds"]
        c3, c4 = (f"{p:,}/{n:,}" for p, n in r["totals"].values())
        print(f"{r['mode']:<14} {r['seconds']:>8.2f} {ups:>10,.0f} {c3:>22} {c4:>22} "
              f"{'-' if r['partial'] is None else format(r['partial'], ','):>16}")
    by = {r["mode"]: r for r in results}
    if "constrained" in by and "no cut" in by and by["no cut"]["partial"]:
        print(f"\nthe constraints cut {1 - by['constrained']['partial'] / by['no cut']['partial']:.1%} of the partial "
              f"matches, and the search took {by['constrained']['seconds'] / by['no cut']['seconds']:.2f}x the time")
    print(f"\nmemory over time ({results[0]['mode']}):\n{'insertions':>10} {'seconds':>8} {'versions':>9} "
          f"{'RSS MB':>8} {'device MB':>9}")
    for k, sec, versions, rss, dev in results[0]["samples"]:
        print(f"{k:>10,} {sec:>8.2f} {versions:>9,} {rss:>8.0f} {dev:>9.0f}")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
