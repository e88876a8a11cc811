"""Directed against undirected matching on the same edges: static counts and a continuous stream.

    python bench/directed.py [--scale 20] [--edges 10000000] [--stream 1000000] [--backend cpu]
                             [--runs 3] [--batch-size 4096] [--parts static,continuous]
                             [--check-engines cpu,gpu]

Builds, from a seed, an R-MAT power-law graph (Graph500 quadrant probabilities) whose draws
are arcs (u, v) with random labels (8 vertex labels, 2 edge labels), holds the last
`--stream` arcs out as a mixed stream (90% insertions of the held-out arcs, 10% deletions
of arcs inserted before them), and reads the rest once as a directed graph and once as an
undirected one (the same pairs, one edge each). Then, for the fraud patterns of
samples/money-flow (a 3-cycle and a 4-cycle of transfers, a fan-in of five accounts into
one; query vertex i has label i and every query edge label 0, so that the counts of a
power-law graph stay countable: five same-labelled leaves of a hub number its in-degree
to the fifth) and the same shapes undirected:

- static: `csmd match` time (median of --runs) and count for each pattern, directed and
  undirected;
- continuous: the stream count-only with the three patterns registered together, updates
  per second (median of --runs), directed and undirected, and the ratio.

Prints one table per part, the sizes and the machine's core count first. --check-engines
instead replays the stream on each engine named, each pattern alone and the three together,
directed and undirected, and says whether every engine's totals agree. A static count
past --static-time-limit shows what it had counted, with a +.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from csmd.jobs.replay import replay
from csmd.backends import resolve_backend, static_matcher
from csmd.model.formats import parse_query_text
from csmd.model.graph import Graph

PATTERNS = {  # arcs, edge label 0; query vertex i has label i (the graph has VERTEX_LABELS)
    "cycle3": [(0, 1), (1, 2), (2, 0)],
    "cycle4": [(0, 1), (1, 2), (2, 3), (3, 0)],
    "fan_in5": [(1, 0), (2, 0), (3, 0), (4, 0), (5, 0)],
}
VERTEX_LABELS, EDGE_LABELS = 8, 2
GRAPH500 = (0.57, 0.19, 0.19)


def rmat_arcs(scale: int, m: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """m R-MAT draws as arcs (src, dst) on 2^scale vertices (self-loops and repeats left in)."""
    a, b, c = GRAPH500
    src = np.zeros(m, np.int64)
    dst = np.zeros(m, np.int64)
    for _ in range(scale):
        r = rng.random(m)
        src = 2 * src + (r >= a + b)
        dst = 2 * dst + (((r >= a) & (r < a + b)) | (r >= a + b + c))
    return src, dst


def workload(scale: int, edges: int, stream: int, seed: int):
    rng = np.random.default_rng(seed)
    src, dst = rmat_arcs(scale, edges, rng)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    _, first = np.unique(src << 32 | dst, return_index=True)  # one arc per ordered pair, in draw order
    first.sort()
    src, dst = src[first], dst[first]
    n = 1 << scale
    vlabels = rng.integers(0, VERTEX_LABELS, n).astype(np.int32)
    elabels = rng.integers(0, EDGE_LABELS, len(src)).astype(np.int32)
    base = len(src) - stream
    # the stream: the held-out arcs inserted, every tenth update deleting a random arc inserted
    # before it (drawn from a pool of the live ones, swap-removed: O(1) a deletion)
    hs, hd = src[base:].tolist(), dst[base:].tolist()
    labels = rng.integers(0, EDGE_LABELS, stream).tolist()
    draws = rng.random(stream).tolist()
    pool = [0] * stream
    live = 0
    lines = []
    for i in range(stream):
        if i % 10 == 9 and live:
            j = int(draws[i] * live)
            x = pool[j]
            live -= 1
            pool[j] = pool[live]
            lines.append(f"-e {hs[x]} {hd[x]}")
        else:
            pool[live] = i
            live += 1
            lines.append(f"e {hs[i]} {hd[i]} {labels[i]}")
    return n, vlabels, src[:base], dst[:base], elabels[:base], lines


def query(arcs, directed: bool):
    k = 1 + max(max(a, b) for a, b in arcs)
    text = "".join(f"v {i} {i}\n" for i in range(k)) + "".join(f"e {a} {b} 0\n" for a, b in arcs)
    return parse_query_text(text, "q", directed=directed)


def median_time(fn, runs: int):
    times, out = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=int, default=20)
    ap.add_argument("--edges", type=int, default=10_000_000, help="R-MAT draws (arcs before repeats are dropped)")
    ap.add_argument("--stream", type=int, default=1_000_000)
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--static-time-limit", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--parts", default="static,continuous", help="which tables to print (comma-separated)")
    ap.add_argument("--check-engines", help="engines to compare (comma-separated) instead of timing")
    args = ap.parse_args()
    t0 = time.perf_counter()
    n, vlabels, src, dst, el, lines = workload(args.scale, args.edges, args.stream, args.seed)
    gd = Graph.from_edges(vlabels, src, dst, el, directed=True)
    gu = Graph.from_edges(vlabels, src, dst, el)
    stream = Path(os.environ.get("TMPDIR", "/tmp")) / f"directed-stream-{os.getpid()}.txt"
    stream.write_text("\n".join(lines) + "\n")
    if args.check_engines:
        return check_engines(gd, gu, stream, args.check_engines.split(","), args.batch_size)
    backend = resolve_backend(args.backend)
    print(f"R-MAT 2^{args.scale}: {n:,} vertices, {gd.num_edges:,} arcs ({gu.num_edges:,} undirected pairs) before the "
          f"stream; stream {len(lines):,} updates (90% insertions); backend {backend}; {os.cpu_count()} cores; "
          f"built in {time.perf_counter() - t0:.1f} s", flush=True)

    parts = args.parts.split(",")
    if "static" in parts:
        static_table(gd, gu, backend, args)
    if "continuous" in parts:
        continuous_table(gd, gu, stream, len(lines), backend, args)
    stream.unlink()
    return 0


def static_table(gd, gu, backend, args) -> None:
    print(f"\nstatic (median of {args.runs}; time limit {args.static_time_limit:g} s)")
    print(f"{'pattern':<10} {'directed s':>11} {'directed count':>16} {'undirected s':>13} {'undirected count':>18} "
          f"{'ratio':>6}")
    for name, arcs in PATTERNS.items():
        row = []
        for g, directed in ((gd, True), (gu, False)):
            m = static_matcher(backend)
            q = query(arcs, directed)
            sec, res = median_time(lambda: m.match(g, q, time_limit=args.static_time_limit), args.runs)
            row.append((sec, f"{res.count:,}" + ("" if res.complete else "+")))
        print(f"{name:<10} {row[0][0]:>11.3f} {row[0][1]:>16} {row[1][0]:>13.3f} {row[1][1]:>18} "
              f"{row[0][0] / row[1][0]:>6.2f}", flush=True)


def continuous_table(gd, gu, stream, updates: int, backend, args) -> None:
    print(f"\ncontinuous, count-only, the three patterns together, batch {args.batch_size} (median of {args.runs})")
    print(f"{'graph':<11} {'updates/s':>12} {'seconds':>9} {'positive':>14} {'negative':>14}")
    rates = {}
    for g, directed in ((gd, True), (gu, False)):
        label = "directed" if directed else "undirected"
        qs = [(name, query(arcs, directed)) for name, arcs in PATTERNS.items()]
        runs = []
        for _ in range(args.runs):
            results, _ = replay(g, stream, qs, batch_size=args.batch_size, count_only=True, show_progress=False,
                                backend=backend)
            runs.append(results)
        sec = statistics.median(r[0]["seconds"] for r in runs)
        rates[directed] = updates / sec
        pos = sum(r["positive"] for r in runs[0])
        neg = sum(r["negative"] for r in runs[0])
        print(f"{label:<11} {rates[directed]:>12,.0f} {sec:>9.3f} {pos:>14,} {neg:>14,}", flush=True)
    if len(rates) == 2:
        print(f"undirected / directed updates/s: {rates[False] / rates[True]:.2f}x")


def check_engines(gd, gu, stream, engines: list[str], batch_size: int) -> int:
    """Each pattern alone, then the three together, on every engine: 1 where their totals differ."""
    differ = False
    for g in (gd, gu):
        sets = [[name] for name in PATTERNS] + [list(PATTERNS)]
        for names in sets:
            qs = [(name, query(PATTERNS[name], g.directed)) for name in names]
            totals = [tuple((r["positive"], r["negative"]) for r in replay(
                g, stream, qs, batch_size=batch_size, count_only=True, show_progress=False, backend=e)[0])
                      for e in engines]
            same = len(set(totals)) == 1
            differ |= not same
            print(f"{'directed' if g.directed else 'undirected':<11} {'+'.join(names):<22} "
                  f"{'agree' if same else 'DIFFER'} {dict(zip(engines, totals))}", flush=True)
    stream.unlink()
    return int(differ)


if __name__ == "__main__":
    sys.exit(main())
