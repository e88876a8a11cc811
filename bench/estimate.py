"""Approximate counting: throughput and accuracy at a fixed time budget, CPU or GPU sampler.

    python bench/estimate.py [--backend cpu|gpu] [--datasets DIR] [--queries K] [--budget S] [--seed N]
        [--exact-time-limit S] [--skip-throughput] [--known-counts-only] [--rmat SCALE]

Prints plain-text tables on stdout (progress goes to stderr):

1. Samples per second, WanderJoin and Alley, for the first K queries (natural
   order) of yeast's dense and sparse 8- and 16-vertex classes, HPRD's 16-vertex
   queries and github's Q_0..Q_21 (the first K of them): the median over the class
   of samples / sampling seconds for 4 rounds of 65,536 samples (2^22 on the GPU;
   filtering and the candidate graph excluded, one untimed warm-up round), the median
   share of valid (non-zero) samples, and the median milliseconds to build the candidate
   graph on the host (`CG ms`) and, with --backend gpu, on the device (`dev ms`: the
   device build, the graph already on the device; `host+up`: the host build and its
   upload, what the GPU sampler does instead) with the median scan volume (neighbour
   entries the build looks at, which picks between them).
   With --backend gpu, then: Alley samples per second by warp-streaming threshold
   (refine sets of at least that many entries scanned by the whole warp; off: one lane
   each), and with --rmat SCALE the candidate-graph build times (and the graph's upload)
   on an R-MAT graph of 2^SCALE vertices (16 edges a vertex drawn, 4 labels) for queries
   cut out of it, with Alley's samples/s there by warp-streaming threshold (hubs: long
   refine sets).
2. q-error = max(estimate / exact, exact / estimate) with --budget seconds of
   sampling per query (a time limit, no rel-error stop): HPRD's first K queries
   against expected_counts.txt; yeast's first K dense and sparse 8- and 16-vertex
   queries and github's Q_0..Q_20 against the static matcher's counts (the GPU one
   with --backend gpu; queries it cannot count within --exact-time-limit seconds are
   left out, and so are those with no match); github Q_21 against the exact count
   that issue #11 quotes. A query with no valid sample (no information) counts as
   q-error infinity. `covered` is the share of queries whose 95% interval covers the
   exact count; `seconds` the median seconds per query, filtering included. alley+t2
   is Alley with trawling: the last 2 query vertices counted exactly for each sampled
   prefix. --known-counts-only: only HPRD and github Q_21 (no static matching).
3. github Q_21 with the rel-error stop (2%, at most 1 s of sampling): how far off the
   exact count and how long, filtering included.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
import time
from pathlib import Path

from csmd.cpu.matcher import search
from csmd.backends import make_sampler
from csmd.jobs.estimate import run_estimate
from csmd.model.estimate import CandidateGraph, run_rounds
from csmd.model.formats import read_graph, read_query
from csmd.model.plan import plan_query

REPO = Path(__file__).resolve().parent.parent
LANES = {"cpu": 65536, "gpu": 1 << 22}
ROUNDS = 4
GITHUB_Q21 = 2_211_319_567_505  # issue #11


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def natural_key(p: Path):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]


def first_queries(qdir: Path, prefix: str, k: int) -> list[Path]:
    pat = re.compile(re.escape(prefix) + r"_?\d+\.graph$")
    return sorted((p for p in qdir.iterdir() if pat.match(p.name)), key=natural_key)[:k]


def throughput(g, plan, method: str, seed: int, backend: str, stream=None, lanes=None) -> tuple[float, float]:
    """(samples per second, valid share) of ROUNDS rounds of `lanes` samples (default LANES; stream:
    the GPU sampler's warp-streaming threshold, None its default)."""
    if backend == "gpu":
        from csmd.gpu.sampler import GpuSampler, candidates

        sampler = GpuSampler(plan, candidates(g, plan), method, seed, stream=stream)
    else:
        sampler = make_sampler(backend, g, plan, method, seed)
    lanes = lanes or LANES[backend]
    sampler.draw(ROUNDS, lanes)  # warm-up: numpy's first calls, the kernel's compilation
    sync()
    t0 = time.perf_counter()
    valid = sum(int((sampler.draw(r, lanes) != 0).sum()) for r in range(ROUNDS))
    return ROUNDS * lanes / (time.perf_counter() - t0), valid / (ROUNDS * lanes)


def build_ms(g, plan, backend: str) -> tuple[float, ...]:
    """Milliseconds to build the candidate graph: (host,) on the CPU; with the GPU (host, device,
    host + upload, scan volume), the device build after an untimed one (the kernel's compilation,
    the graph's upload)."""
    t0 = time.perf_counter()
    CandidateGraph(g, plan)
    host = (time.perf_counter() - t0) * 1e3
    if backend != "gpu":
        return (host,)
    from csmd.gpu.sampler import build, candidates, scan_volume

    build(g, plan)
    times = []
    for on_device in (True, False):
        sync()
        t0 = time.perf_counter()
        candidates(g, plan, on_device)
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return (host, *times, scan_volume(g, plan))


def sync() -> None:
    if "cupy" in sys.modules:
        sys.modules["cupy"].cuda.Device().synchronize()


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
    ap.add_argument("--backend", choices=("cpu", "gpu"), default="cpu")
    ap.add_argument("--exact-time-limit", type=float, default=10.0,
                    help="seconds the static matcher may take for an exact count (default 10)")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--known-counts-only", action="store_true", help="q-error only where the count is known")
    ap.add_argument("--rmat", type=int, default=0, help="candidate-graph build on an R-MAT graph of 2^SCALE vertices")
    args = ap.parse_args()
    backend = args.backend
    ds, k = args.datasets, args.queries
    graphs = {name: read_graph(ds / name / "data.graph") for name in ("yeast", "hprd", "github")}
    classes = [("yeast", c) for c in ("query_dense_8", "query_sparse_8", "query_dense_16", "query_sparse_16")]
    classes += [("hprd", "query_dense_16"), ("github", "Q")]

    print(f"{backend} sampler")
    gpu_cols = f" {'dev ms':>7} {'host+up':>7} {'volume':>10}" if backend == "gpu" else ""
    print(f"{'dataset':<8} {'class':<16} {'|V(q)|':>6} {'queries':>7} {'WJ samples/s':>13} {'WJ valid':>9} "
          f"{'Alley samples/s':>16} {'Alley valid':>12} {'CG ms':>7}{gpu_cols}")
    plans = {}
    for dsname, cls in [] if args.skip_throughput else classes:
        files = first_queries(ds / dsname / "queries", cls, k)
        log(f"throughput: {dsname} {cls} ({len(files)} queries)")
        qs = [read_query(p) for p in files]
        g = graphs[dsname]
        plans[dsname, cls] = ps = [plan_query(g, q) for q in qs]
        cols = []
        for method in ("wj", "alley"):
            runs = [throughput(g, p, method, args.seed, backend) for p in ps]
            cols += [statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)]
        builds = [statistics.median(col) for col in zip(*(build_ms(g, p, backend) for p in ps))]
        sizes = sorted({q.n for q in qs})
        size = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}-{sizes[-1]}"
        extra = f" {builds[1]:>7.1f} {builds[2]:>7.1f} {builds[3]:>10,.0f}" if backend == "gpu" else ""
        print(f"{dsname:<8} {cls:<16} {size:>6} {len(qs):>7} {cols[0]:>13,.0f} {cols[1]:>9.3f} {cols[2]:>16,.0f} "
              f"{cols[3]:>12.3f} {builds[0]:>7.1f}{extra}", flush=True)
    if backend == "gpu" and plans:
        streaming_table(graphs, plans, args.seed)
    if backend == "gpu" and args.rmat:
        rmat_table(args.rmat, 3, args.seed)

    print()
    print(f"q-error with {args.budget:g} s of sampling per query")
    print(f"{'dataset':<8} {'class':<16} {'method':>8} {'queries':>7} {'median':>8} {'p90':>8} {'max':>10} "
          f"{'no info':>7} {'covered':>8} {'seconds':>8}")
    variants = (("wj", 0), ("alley", 0), ("alley", 2))
    for dsname, cls, exact in accuracy_sets(ds, graphs, k, backend, args.exact_time_limit, args.known_counts_only):
        for method, trawl in variants:
            errs, covered, secs = [], 0, []
            for q, count in exact:
                g = graphs[dsname]
                t0 = time.perf_counter()
                sampler = make_sampler(backend, g, plan_query(g, q), method, args.seed, trawl)
                res = run_rounds(sampler.draw, time_limit=args.budget, max_round_blocks=sampler.max_round_blocks)
                secs.append(time.perf_counter() - t0)
                errs.append(q_error(res.estimate, count))
                covered += res.estimate is not None and res.ci_low <= count <= res.ci_high
                if cls == "Q_21":
                    log(f"github Q_21 {method} ({secs[-1]:.3f} s with filtering): {res.as_dict()}")
            if not errs:
                continue
            label = method + (f"+t{trawl}" if trawl else "")
            print(f"{dsname:<8} {cls:<16} {label:>8} {len(errs):>7} {statistics.median(errs):>8.3f} "
                  f"{percentile(errs, 0.9):>8.3f} {max(errs):>10.3f} {sum(map(math.isinf, errs)):>7} "
                  f"{covered / len(errs):>8.0%} {statistics.median(secs):>8.3f}", flush=True)
    q21 = read_query(ds / "github" / "queries" / "Q_21.graph")
    print()
    for method in ("wj", "alley"):
        res = run_estimate(graphs["github"], q21, "Q_21", method=method, rel_error=0.02, time_limit=1.0,
                           seed=args.seed, backend=backend)
        err = "no info" if res["estimate"] is None else f"{res['estimate'] / GITHUB_Q21 - 1:+.2%}"
        print(f"github Q_21 {method:<5} --rel-error 0.02 --time-limit 1: {err} off the exact count, 95% interval "
              f"+-{(res['ci_high'] - res['estimate']) / res['estimate']:.2%}, {res['samples']:,} samples, "
              f"{res['seconds']:.3f} s with filtering", flush=True)
    return 0


def accuracy_sets(ds: Path, graphs: dict, k: int, backend: str, exact_limit: float, known_only: bool):
    """(dataset, class, [(query, exact count)]) for every class with exact counts (known_only: those
    whose counts are known without matching)."""
    expected = dict(line.replace(" ", "").split(":") for line in
                    (ds / "hprd" / "expected_counts.txt").read_text().split())
    files = first_queries(ds / "hprd" / "queries", "query_dense_16", k)
    yield "hprd", "query_dense_16", [(read_query(p), int(expected[p.stem])) for p in files]
    github = ds / "github" / "queries"
    yield "github", "Q_21", [(read_query(github / "Q_21.graph"), GITHUB_Q21)]
    if known_only:
        return
    for cls in ("query_dense_8", "query_sparse_8", "query_dense_16", "query_sparse_16"):
        yield "yeast", cls, counted(graphs["yeast"], first_queries(ds / "yeast" / "queries", cls, k), backend,
                                    exact_limit)
    yield "github", "Q_0..Q_20", counted(graphs["github"], [github / f"Q_{i}.graph" for i in range(21)], backend,
                                         exact_limit)


STREAM_THRESHOLDS = (0, 16, 32, 64, 128, 256)


def streaming_table(graphs: dict, plans: dict, seed: int, lanes=None) -> None:
    """Alley samples/s (median over each class's queries) by warp-streaming threshold (0: off)."""
    print()
    print("Alley samples/s by warp-streaming threshold (refine-set entries; off: one lane scans each set)")
    print(f"{'dataset':<8} {'class':<16} " + " ".join(f"{t or 'off':>13}" for t in STREAM_THRESHOLDS))
    for (dsname, cls), ps in plans.items():
        log(f"streaming: {dsname} {cls}")
        rates = [statistics.median(throughput(graphs[dsname], p, "alley", seed, "gpu", t, lanes)[0] for p in ps)
                 for t in STREAM_THRESHOLDS]
        print(f"{dsname:<8} {cls:<16} " + " ".join(f"{r:>13,.0f}" for r in rates), flush=True)


def rmat_table(scale: int, k: int, seed: int) -> None:
    """Candidate-graph build times on an R-MAT graph (built on the device, copied to the host) for
    k queries of 4 and of 8 vertices grown from random vertices (every edge among them kept), and
    Alley's samples/s on them by warp-streaming threshold."""
    import numpy as np

    from csmd.gpu.device_graph import device_graph
    from csmd.gpu.rmat import rmat_graph
    from csmd.model.graph import Graph

    dg = rmat_graph(scale, 16 << scale, num_labels=4, seed=seed + 1)
    g = Graph(dg.labels.get(), dg.indptr.get(), dg.adj.get(), np.zeros(int(dg.indptr[-1].get()), np.int32))
    del dg
    rnd = np.random.default_rng(seed)
    queries = {size: [] for size in (4, 8)}
    for size, qs in queries.items():
        while len(qs) < k:
            picked = [int(rnd.choice(np.flatnonzero(g.degrees >= 2)))]
            while len(picked) < size:
                nb = np.setdiff1d(np.concatenate([g.neighbors(v) for v in picked]), picked)
                picked.append(int(rnd.choice(nb)))
            pos = {v: i for i, v in enumerate(picked)}
            src, dst = zip(*[(pos[v], pos[w]) for v in picked for w in g.neighbors(v).tolist() if w in pos and v < w])
            qs.append(Graph.from_edges(g.labels[picked], src, dst))
    copy = Graph(g.labels, g.indptr, g.indices, g.elabels)
    copy.grouped  # the host computes the label-grouped order for planning anyway: not the upload's cost
    t0 = time.perf_counter()
    device_graph(copy)
    sync()
    upload_ms = (time.perf_counter() - t0) * 1e3
    print()
    print(f"candidate graph on R-MAT 2^{scale} ({g.n:,} vertices, {g.num_edges:,} edges, 4 labels; the graph's "
          f"upload {upload_ms:.1f} ms): median ms")
    print(f"{'|V(q)|':>6} {'queries':>7} {'host ms':>8} {'dev ms':>8} {'host+up':>8} {'volume':>12} {'plan ms':>8}")
    plans = {}
    for size, qs in queries.items():
        rows = []  # (host, device, host + upload, volume, plan) per query
        for q in qs:
            t0 = time.perf_counter()
            plan = plan_query(g, q)
            plan_ms = (time.perf_counter() - t0) * 1e3
            plans.setdefault(("rmat", f"{size} vertices"), []).append(plan)
            rows.append((*build_ms(g, plan, "gpu"), plan_ms))
        med = [statistics.median(col) for col in zip(*rows)]
        print(f"{size:>6} {k:>7} {med[0]:>8.1f} {med[1]:>8.1f} {med[2]:>8.1f} {med[3]:>12,.0f} {med[4]:>8.1f}",
              flush=True)
    streaming_table({"rmat": g}, plans, seed, lanes=1 << 18)  # hub refine sets: far slower walks


def counted(g, files: list[Path], backend: str, limit: float) -> list:
    """[(query, exact count)] of the queries the static matcher counts within `limit` seconds
    (those with no match left out too)."""
    exact = []
    for p in files:
        q = read_query(p)
        if backend == "gpu":
            from csmd.gpu.engine import match

            res = match(g, q, time_limit=limit)
        else:
            res = search(g, plan_query(g, q), time_limit=limit)
        log(f"exact: {p.stem}: {res.count} ({'complete' if res.complete else 'cut off'})")
        if res.complete and res.count:
            exact.append((q, res.count))
    return exact


if __name__ == "__main__":
    sys.exit(main())
