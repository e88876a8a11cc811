"""Continuous matching on the CPU: the human insertion stream through the full pipeline.

Prints, per query (one registered at a time) and for all queries registered at
once: updates/s and per-update latency p50/p99 (record read by the updater to
its deltas collected), median over --runs runs, count-only.

    python bench/replay.py [--datasets DIR] [--runs 3] [--batch-size 64] [--queries 40]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path


from csmd.model.formats import read_graph, read_query
from csmd.cli.replay import replay


def measure(g0, stream, queries, batch_size, runs):
    out = []
    for _ in range(runs):
        results, pipe = replay(g0, stream, queries, batch_size=batch_size, count_only=True, show_progress=False)
        lat = pipe.stats.latency
        out.append((results[0]["seconds"], lat.quantile(0.5), lat.quantile(0.99), results))
    out.sort(key=lambda r: r[0])
    return out[len(out) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "datasets")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--queries", type=int, default=40)
    args = ap.parse_args()
    root = args.datasets / "human"
    g0 = read_graph(root / "data.graph")
    stream = root / "insertion.graph"
    updates = sum(1 for line in open(stream) if line.strip())
    names = [f"Q_{i}" for i in range(1, args.queries + 1)]
    queries = [(n, read_query(root / "queries" / f"{n}.graph")) for n in names]
    print(f"human: {g0.n} vertices, {g0.num_edges} edges; stream: {updates} insertions; "
          f"batch size {args.batch_size}; median of {args.runs} runs; CPU engine, count-only")
    print(f"{'query':<8} {'|V(q)|':>6} {'positive':>12} {'seconds':>8} {'updates/s':>10} {'p50 ms':>8} {'p99 ms':>8}")
    total = 0.0
    for name, q in queries:
        sec, p50, p99, res = measure(g0, stream, [(name, q)], args.batch_size, args.runs)
        total += sec
        print(f"{name:<8} {q.n:>6} {res[0]['positive']:>12} {sec:>8.3f} {updates / sec:>10.0f} {p50 * 1e3:>8.2f} {p99 * 1e3:>8.2f}",
              flush=True)
        print(f"  {name} done", file=sys.stderr)
    sec, p50, p99, res = measure(g0, stream, queries, args.batch_size, args.runs)
    print(f"{'sum of one-at-a-time runs':<36} {total:>8.3f} s")
    print(f"{'all ' + str(len(queries)) + ' registered at once':<36} {sec:>8.3f} s  {updates / sec:>8.0f} updates/s  "
          f"p50 {p50 * 1e3:.2f} ms  p99 {p99 * 1e3:.2f} ms")
    print(f"reference C++ CPU system: ~2 s of query time for all 100 queries over this stream")


if __name__ == "__main__":
    main()
