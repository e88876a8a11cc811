"""Continuous matching on the CPU: a mixed insert/delete stream made from yeast, compiled engine beside numpy.

The stream (seeded): 8% of yeast's edges are held back and inserted, 4% of the rest are
deleted, in one shuffled order; the graph before it is yeast without the held-back edges.
Prints, per query registered alone and for all queries at once (count-only, median of
--runs runs), replay's seconds over the stream decoded beforehand (what replay.py's
docstring details) on the compiled engine (at 1 thread and at the default thread count)
and on the numpy engine. No RapidFlow figure exists for this stream on this machine.

    python bench/replay_yeast.py [--datasets DIR] [--runs 3] [--batch-size 64] [--seed 1]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from replay import measure

from csmd.cpu.workers import thread_count
from csmd.model.formats import read_graph, read_query
from csmd.testing.streams import make_stream

# 17 queries: the first of yeast's small classes (4, 8 and 16 vertices, dense and sparse)
QUERIES = ([f"query_dense_4_{i}" for i in range(1, 6)] + [f"query_{c}_8_{i}" for c in ("dense", "sparse")
                                                          for i in range(1, 5)]
           + [f"query_{c}_16_{i}" for c in ("dense", "sparse") for i in range(1, 3)])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "datasets")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    root = args.datasets / "yeast"
    cores = thread_count()
    with tempfile.TemporaryDirectory() as tmp:
        g0_path, stream, ins, dels = make_stream(root / "data.graph", Path(tmp), args.seed)
        g0 = read_graph(g0_path)
        queries = [(n, read_query(root / "queries" / f"{n}.graph")) for n in QUERIES]
        engines = [("cpu", 1), ("cpu", cores), ("numpy", 1)] if cores > 1 else [("cpu", 1), ("numpy", 1)]

        def timed(qs, backend, threads):
            os.environ["CSMD_THREADS"] = str(threads)
            return measure(g0, stream, qs, args.batch_size, args.runs, backend)

        timed(queries[:1], "cpu", 1)  # numba's cache load is not a query's time
        print(f"yeast: {g0.n} vertices, {g0.num_edges} edges before the stream; stream: {ins} insertions, {dels} "
              f"deletions (seed {args.seed}); batch size {args.batch_size}; median of {args.runs} runs; count-only; "
              f"no RapidFlow figure for this stream")
        heads = [f"{b}x{t} s" if b == "cpu" else f"{b} s" for b, t in engines]
        print(f"{'query':<20} {'|V(q)|':>6} {'positive':>10} {'negative':>10} " + " ".join(f"{h:>9}" for h in heads)
              + f" {'speed-up':>8}")
        totals = [0.0] * len(engines)
        for name, q in queries:
            secs = []
            for backend, threads in engines:
                sec, res = timed([(name, q)], backend, threads)
                secs.append(sec)
            totals = [a + b for a, b in zip(totals, secs)]
            print(f"{name:<20} {q.n:>6} {res[0]['positive']:>10} {res[0]['negative']:>10} "
                  + " ".join(f"{s:>9.3f}" for s in secs) + f" {secs[-1] / min(secs[:-1]):>8.1f}", flush=True)
        together = [timed(queries, b, t)[0] for b, t in engines]
        for label, row in (("sum one at a time", totals), (f"all {len(queries)} at once", together)):
            print(f"{label:<39} " + " ".join(f"{s:>9.3f}" for s in row) + f" {row[-1] / min(row[:-1]):>8.1f}")


if __name__ == "__main__":
    main()
