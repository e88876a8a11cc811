"""Materialised deltas on an engine (CPU by default, --backend gpu): delta rows per second and peak memory, count-only beside materialised.

The stream is bench/replay_yeast.py's (seeded mixed insert/delete stream on yeast) with its 17
queries registered at once; about 4.3M delta rows at seed 1. Three modes: count-only (the
search counts, no rows), materialised (every match as a row, in the canonical order, not
encoded) and materialised with --output (encoded as Arrow and written to a file, what
`csmd replay --output` does). rows/s is the delta rows over replay's `seconds` (the pipeline
over the stream decoded beforehand; the file's writing included); peak RSS is the process's
ru_maxrss, so every (mode, threads) runs in a process of its own, a warm-up first (numba's
cache load is no run's time), then --runs runs, the median printed.

    python bench/deltas_rate.py [--datasets DIR] [--runs 3] [--batch-size 64] [--queries 17] [--threads 1,2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from replay_yeast import QUERIES

from csmd.testing.streams import make_stream

MODES = ("count-only", "materialised", "materialised + --output")


def one(args) -> None:
    """A child: the runs of one mode, a JSON line with their seconds, rows, file size and peak RSS."""
    from csmd.jobs.replay import read_stream, replay
    from csmd.model.formats import read_graph, read_query

    root = args.datasets / "yeast"
    g0, stream = read_graph(args.dir / "g0.graph"), read_stream(args.dir / "stream.txt")
    queries = [(n, read_query(root / "queries" / f"{n}.graph")) for n in QUERIES[: args.queries]]
    count_only, output = args.mode == 0, args.dir / "deltas.arrow" if args.mode == 2 else None
    replay(g0, stream[:1], queries[:1], batch_size=args.batch_size, count_only=count_only, show_progress=False,
           output=output, backend=args.backend)
    secs, size = [], 0
    for _ in range(args.runs):
        res, _ = replay(g0, stream, queries, batch_size=args.batch_size, count_only=count_only, show_progress=False,
                        output=output, backend=args.backend)
        secs.append(res[0]["seconds"])
        if output is not None:
            size = output.stat().st_size
            output.unlink()
    print(json.dumps({"seconds": statistics.median(secs), "rows": sum(r["positive"] + r["negative"] for r in res),
                      "bytes": size, "rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "datasets")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--queries", type=int, default=len(QUERIES), help="the first N of replay_yeast.py's queries")
    ap.add_argument("--threads", default="1,2", help="CSMD_THREADS values, comma-separated")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--backend", default="cpu", help="cpu or gpu (--threads then sets only the host's threads)")
    ap.add_argument("--mode", type=int, help=argparse.SUPPRESS)  # a child's
    ap.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode is not None:
        return one(args)
    with tempfile.TemporaryDirectory() as tmp:
        _, _, ins, dels = make_stream(args.datasets / "yeast" / "data.graph", Path(tmp), args.seed)
        print(f"yeast stream: {ins} insertions, {dels} deletions (seed {args.seed}), {args.queries} queries at once, "
              f"batch size {args.batch_size}; {args.backend} engine; median of {args.runs} runs, each mode in its own process")
        print(f"{'mode':<25} {'threads':>7} {'rows':>10} {'seconds':>8} {'M rows/s':>9} {'peak RSS MB':>11} "
              f"{'file MB':>8}")
        for threads in args.threads.split(","):
            for mode, name in enumerate(MODES):
                out = subprocess.run(
                    [sys.executable, __file__, "--mode", str(mode), "--dir", tmp, "--datasets", str(args.datasets),
                     "--runs", str(args.runs), "--batch-size", str(args.batch_size), "--queries", str(args.queries),
                     "--backend", args.backend],
                    env={**os.environ, "CSMD_THREADS": threads}, capture_output=True, text=True, check=True)
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"{name:<25} {threads:>7} {r['rows']:>10} {r['seconds']:>8.3f} "
                      f"{r['rows'] / r['seconds'] / 1e6:>9.2f} {r['rss'] / 2**20:>11.0f} "
                      f"{r['bytes'] / 2**20 if r['bytes'] else float('nan'):>8.0f}", flush=True)


if __name__ == "__main__":
    main()
