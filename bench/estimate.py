"""Approximate counting on the CPU sampler: throughput and accuracy at a fixed time budget.

    python bench/estimate.py [--datasets DIR] [--queries K] [--budget S] [--seed N]

Prints two plain-text tables on stdout (progress goes to stderr):

1. Samples per second, WanderJoin and Alley, for the first K queries (natural
   order) of yeast's dense and sparse 8- and 16-vertex classes, HPRD's 16-vertex
   queries and github's Q_0..Q_21 (the first K of them): the median over the class
   of samples / sampling seconds for 4 rounds of 65,536 samples (filtering and the
   candidate graph excluded, one untimed warm-up round), and the median share of
   valid (non-zero) samples.
2. q-error = max(estimate / exact, exact / estimate) with --budget seconds of
   sampling per query (a time limit, no rel-error stop; filtering not counted): HPRD's
   first K queries against expected_counts.txt; yeast's first K dense and sparse
   8-vertex queries against the CPU static matcher's counts (queries it cannot
   count within 10 s are left out, and so are those with no match); github Q_21
   against the exact count that issue #11 quotes. A query with no valid sample
   (no information) counts as q-error infinity. The last column is the share of
   queries whose 95% interval covers the exact count. alley+t2 is Alley with
   trawling: the last 2 query vertices counted exactly for each sampled prefix.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from csmd.cpu.matcher import search
from csmd.cpu.sampler import CpuSampler
from csmd.model.estimate import CandidateGraph, run_rounds
from csmd.model.formats import read_graph, read_query
from csmd.model.plan import plan_query

REPO = Path(__file__).resolve().parent.parent
LANES, ROUNDS = 65536, 4
GITHUB_Q21 = 2_211_319_567_505  # issue #11
EXACT_TIME_LIMIT = 10.0


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def natural_key(p: Path):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]


def first_queries(qdir: Path, prefix: str, k: int) -> list[Path]:
    pat = re.compile(re.escape(prefix) + r"_?\d+\.graph$")
    return sorted((p for p in qdir.iterdir() if pat.match(p.name)), key=natural_key)[:k]


def throughput(g, q, method: str, seed: int) -> tuple[float, float]:
    """(samples per second, valid share) of ROUNDS rounds of LANES samples."""
    sampler = CpuSampler(g, CandidateGraph(g, plan_query(g, q)), method, seed)
    sampler.draw(ROUNDS, LANES)  # warm-up: numpy's first calls
    t0 = time.perf_counter()
    w = np.concatenate([sampler.draw(r, LANES) for r in range(ROUNDS)])
    return len(w) / (time.perf_counter() - t0), np.count_nonzero(w) / len(w)


def q_error(est, exact: int) -> float:
    if not est:
        return math.inf
    return max(est / exact, exact / est)


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(math.ceil(p * len(xs))) - 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--datasets", type=Path, default=REPO.parent / "shared" / "datasets")
    ap.add_argument("--queries", type=int, default=10, help="queries per class (default 10)")
    ap.add_argument("--budget", type=float, default=0.5, help="sampling seconds per query for q-error (default 0.5)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    ds, k = args.datasets, args.queries
    graphs = {name: read_graph(ds / name / "data.graph") for name in ("yeast", "hprd", "github")}
    classes = [("yeast", c) for c in ("query_dense_8", "query_sparse_8", "query_dense_16", "query_sparse_16")]
    classes += [("hprd", "query_dense_16"), ("github", "Q")]

    print(f"{'dataset':<8} {'class':<16} {'|V(q)|':>6} {'queries':>7} {'WJ samples/s':>13} {'WJ valid':>9} "
          f"{'Alley samples/s':>16} {'Alley valid':>12}")
    for dsname, cls in classes:
        files = first_queries(ds / dsname / "queries", cls, k)
        log(f"throughput: {dsname} {cls} ({len(files)} queries)")
        qs = [read_query(p) for p in files]
        cols = []
        for method in ("wj", "alley"):
            runs = [throughput(graphs[dsname], q, method, args.seed) for q in qs]
            cols += [statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)]
        sizes = sorted({q.n for q in qs})
        size = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
        print(f"{dsname:<8} {cls:<16} {size:>6} {len(qs):>7} {cols[0]:>13,.0f} {cols[1]:>9.3f} {cols[2]:>16,.0f} "
              f"{cols[3]:>12.3f}", flush=True)

    print()
    print(f"q-error with {args.budget:g} s of sampling per query")
    print(f"{'dataset':<8} {'class':<16} {'method':>8} {'queries':>7} {'median':>8} {'p90':>8} {'max':>10} "
          f"{'no info':>7} {'covered':>8}")
    for dsname, cls, exact in accuracy_sets(ds, graphs, k):
        for method, trawl in (("wj", 0), ("alley", 0), ("alley", 2)):
            errs, covered = [], 0
            for q, count in exact:
                g = graphs[dsname]
                sampler = CpuSampler(g, CandidateGraph(g, plan_query(g, q)), method, args.seed, trawl)
                res = run_rounds(sampler.draw, time_limit=args.budget)
                errs.append(q_error(res.estimate, count))
                covered += res.estimate is not None and res.ci_low <= count <= res.ci_high
            label = method + (f"+t{trawl}" if trawl else "")
            print(f"{dsname:<8} {cls:<16} {label:>8} {len(errs):>7} {statistics.median(errs):>8.3f} "
                  f"{percentile(errs, 0.9):>8.3f} {max(errs):>10.3f} {sum(map(math.isinf, errs)):>7} "
                  f"{covered / len(errs):>8.0%}", flush=True)
    return 0


def accuracy_sets(ds: Path, graphs: dict, k: int):
    """(dataset, class, [(query, exact count)]) for every class with exact counts."""
    expected = dict(line.replace(" ", "").split(":") for line in
                    (ds / "hprd" / "expected_counts.txt").read_text().split())
    files = first_queries(ds / "hprd" / "queries", "query_dense_16", k)
    yield "hprd", "query_dense_16", [(read_query(p), int(expected[p.stem])) for p in files]
    for cls in ("query_dense_8", "query_sparse_8"):
        exact = []
        for p in first_queries(ds / "yeast" / "queries", cls, k):
            q = read_query(p)
            res = search(graphs["yeast"], plan_query(graphs["yeast"], q), time_limit=EXACT_TIME_LIMIT)
            log(f"exact: yeast {p.stem}: {res.count} ({'complete' if res.complete else 'cut off'})")
            if res.complete and res.count:
                exact.append((q, res.count))
        yield "yeast", cls, exact
    yield "github", "Q_21", [(read_query(ds / "github" / "queries" / "Q_21.graph"), GITHUB_Q21)]


if __name__ == "__main__":
    sys.exit(main())
