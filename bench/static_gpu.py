"""Static matching on the GPU engine: github per query, HPRD / yeast against the CPU engine, R-MAT scale.

    python bench/static_gpu.py [--datasets DIR] [--runs N] [--sections github,hprd,yeast,rmat]
                               [--yeast-sample K] [--rmat-scale S] [--rmat-edges M] [--time-limit S]

Prints one table per section on stdout (progress on stderr):

1. github Q_0..Q_21: embeddings and the median of --runs runs of plan + search (the
   graph is on the device beforehand), beside gMatch's published H200 times.
2. HPRD (all 200 queries) and yeast (first K queries of each class): total plan + search
   time of the CPU engine (one query at a time) and of the GPU engine, over the same
   queries, as one batch (match_many, what `csmd match` does with several queries) and
   one at a time, and the speed-ups. Counts must agree (HPRD: with expected_counts.txt too). CPU queries past --cpu-limit seconds are
   left out of both totals and counted in the table. --cpu-results caches the yeast CPU
   results in a JSON file, so a GPU machine need not spend its time on the CPU engine
   (then the CPU times are those of the machine that wrote the file).
3. R-MAT graph generated on the device (2^S vertices, M draws; unlabeled and 16 labels):
   build time, edges, and per query the time, matches, completeness and the device memory
   the query needed beyond the graph (the most bytes it held at once from CuPy's pool,
   which serves every allocation of the engine).

Times exclude reading files and interpreter start-up; the GPU is warmed up (kernels
compiled) by one untimed query per dataset.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import cupy as cp
from cupy.cuda.memory_hook import MemoryHook

from static_cpu import class_files, natural_key, table

from csmd.cpu.matcher import search
from csmd.model.formats import read_graph, read_query
from csmd.gpu.device_graph import device_graph
from csmd.gpu.rmat import rmat_graph
from csmd.gpu.engine import match, match_many
from csmd.model.graph import Graph
from csmd.model.plan import plan_query

REPO = Path(__file__).resolve().parent.parent
GMATCH_H200 = {13: 0.43, 15: 2.1, 16: 3.9, 21: 12.3}  # published; every other query < 0.7 s
YEAST_CLASSES = ["query_dense_4", "query_dense_8", "query_sparse_8", "query_dense_16", "query_sparse_16",
                 "query_dense_24", "query_sparse_24", "query_dense_32", "query_sparse_32"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def timed_gpu(dg, q, runs: int, time_limit=None, repeat_under: float = float("inf")):
    """(count, complete, median seconds, runs) of plan + search on the GPU; a query whose
    first run takes repeat_under seconds or more is not repeated."""
    times, res = [], None
    for _ in range(runs):
        if times and times[0] >= repeat_under:
            break
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        res = match(dg, q, time_limit=time_limit)
        times.append(time.perf_counter() - t0)
    return res.count, res.complete, statistics.median(times), len(times)


def bench_github(root: Path, runs: int, time_limit: float | None, repeat_under: float) -> str:
    g = read_graph(root / "data.graph")
    dg = device_graph(g)
    qs = [(i, read_query(root / "queries" / f"Q_{i}.graph")) for i in range(22)]
    match(dg, qs[0][1])
    rows, total, all_complete = [], 0.0, True
    for i, q in qs:
        count, complete, sec, done = timed_gpu(dg, q, runs, time_limit, repeat_under)
        ref = GMATCH_H200.get(i)
        total += sec
        all_complete &= complete
        log(f"  Q_{i}: {count} matches, complete {complete}, {sec:.3f} s")
        rows.append([f"Q_{i}", str(q.n), f"{count:,}", str(complete).lower(), f"{sec:.3f}", str(done),
                     f"{ref:.2f}" if ref else "< 0.7", f"{sec / ref:.2f}x" if ref else ""])
    rows.append(["total", "", "", str(all_complete).lower(), f"{total:.2f}", "", "21.1", f"{total / 21.1:.2f}x"])
    return table([f"github ({g.n} V, {g.num_edges} E)", "|V(q)|", "embeddings", "complete", "GPU s (median)",
                  "runs", "gMatch H200 s", "GPU / gMatch"], rows)


def cpu_result(g: Graph, f: Path, cpu_limit: float, cache: dict) -> tuple[int, bool, float]:
    """(count, complete, seconds) of plan + search on the CPU engine; cached by query name."""
    if f.stem not in cache:
        t0 = time.perf_counter()
        res = search(g, plan_query(g, read_query(f)), time_limit=cpu_limit)
        cache[f.stem] = (res.count, res.complete, time.perf_counter() - t0)
    return tuple(cache[f.stem])


def compare_engines(name: str, g: Graph, files: list[Path], runs: int, cpu_limit: float, cache: dict,
                    expected=None, gpu_limit: float | None = None, single: bool = True) -> list[str]:
    """One row: the queries the CPU engine finishes, on the CPU one at a time and on the GPU
    as one batch (match_many; median of runs) and, with `single`, one at a time."""
    dg = device_graph(g)
    queries = [read_query(f) for f in files]
    match_many(dg, queries[:2], time_limit=1.0)
    match(dg, queries[0], time_limit=1.0)
    search(g, plan_query(g, queries[0]), time_limit=1.0)
    cpu = [cpu_result(g, f, cpu_limit, cache) for f in files]
    keep = [i for i, c in enumerate(cpu) if c[1]]
    batch = [queries[i] for i in keep]
    times = []
    for _ in range(runs):
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        res = match_many(dg, batch, time_limit=gpu_limit)
        times.append(time.perf_counter() - t0)
    t_batch = statistics.median(times)
    t_single = sum(timed_gpu(dg, q, 1, gpu_limit)[2] for q in batch) if single else float("nan")
    done = [k for k, r in enumerate(res) if r.complete]  # a query the GPU left unfinished leaves the CPU total
    wrong = 0
    for k in done:
        i = keep[k]
        if res[k].count != cpu[i][0] or (expected is not None and expected.get(files[i].stem) != res[k].count):
            wrong += 1
            log(f"  MISMATCH {files[i].stem}: gpu {res[k].count}, cpu {cpu[i][0]}")
    t_cpu = sum(cpu[keep[k]][2] for k in done)
    row = [name, str(len(done)), f"{len(files) - len(keep)} / {len(batch) - len(done)}", f"{t_cpu:.3f}",
           f"{t_batch:.4f}", f"{t_cpu / t_batch:.0f}x", f"{t_single:.3f}" if single else "-",
           f"{t_cpu / t_single:.1f}x" if single else "-", str(wrong)]
    log("  " + " | ".join(row))
    return row


def bench_small(datasets: Path, sections: list[str], runs: int, sample: int, cpu_limit: float,
                cpu_cache: dict, gpu_limit: float) -> str:
    rows = []
    hprd = datasets / "hprd"
    if "hprd" in sections and (hprd / "data.graph").is_file():
        expected = {}
        for line in (hprd / "expected_counts.txt").read_text().split():
            k, v = line.rsplit(":", 1)
            expected[k] = int(v)
        files = sorted((hprd / "queries").glob("*.graph"), key=natural_key)
        log("hprd")
        rows.append(compare_engines("HPRD (all)", read_graph(hprd / "data.graph"), files, runs, cpu_limit, {},
                                    expected))
    yeast = datasets / "yeast"
    if "yeast" in sections and (yeast / "data.graph").is_file():
        g = read_graph(yeast / "data.graph")
        every = []
        for cls in YEAST_CLASSES:
            log(f"yeast {cls}")
            files = class_files(yeast / "queries", cls)[:sample]
            every += files
            if files:
                rows.append(compare_engines(f"yeast {cls}", g, files, runs, cpu_limit, cpu_cache,
                                            gpu_limit=gpu_limit))
        if every:
            log("yeast, every class in one batch")
            rows.append(compare_engines("yeast (all above)", g, every, runs, cpu_limit, cpu_cache,
                                        gpu_limit=gpu_limit, single=False))
    return table(["queries", "n", f"left out: CPU > {cpu_limit:g} s / GPU > {gpu_limit:g} s", "CPU total s",
                  f"GPU batch s (median of {runs})", "speed-up", "GPU one at a time s", "speed-up", "mismatches"],
                 rows)


RMAT_QUERIES = {  # name: (labels, edges); on the unlabeled graph every label is 0
    "triangle": ([0, 1, 2], [(0, 1), (1, 2), (0, 2)]),
    "4-cycle": ([0, 1, 2, 3], [(0, 1), (1, 2), (2, 3), (3, 0)]),
    "diamond": ([0, 1, 2, 3], [(0, 1), (1, 2), (2, 3), (3, 0), (0, 2)]),
    "6-vertex labeled": ([0, 1, 2, 3, 4, 5], [(0, 1), (1, 2), (2, 0), (2, 3), (3, 4), (4, 5), (5, 3)]),
}


class PeakMemory(MemoryHook):
    """High-water mark of the bytes CuPy's pool hands out while the hook is active."""

    name = "PeakMemory"

    def __init__(self):
        self.now = self.peak = 0

    def malloc_postprocess(self, **kw):
        self.now += kw["mem_size"]
        self.peak = max(self.peak, self.now)

    def free_postprocess(self, **kw):
        self.now -= kw["mem_size"]


def with_peak_memory(fn):
    """(fn(), the most device memory fn held at once through CuPy's pool)."""
    hook = PeakMemory()
    with hook:
        res = fn()
        cp.cuda.Device().synchronize()
    return res, hook.peak


def bench_rmat(scale: int, edges: int, time_limit: float) -> str:
    pool = cp.get_default_memory_pool()
    rows = []
    for num_labels in (1, 16):
        pool.free_all_blocks()
        cp.cuda.Device().synchronize()
        t0 = time.perf_counter()
        dg = rmat_graph(scale, edges, num_labels)
        cp.cuda.Device().synchronize()
        build = time.perf_counter() - t0
        m = int(dg.indptr[-1].get()) // 2
        log(f"rmat scale {scale}, {num_labels} labels: {m:,} edges, max degree "
            f"{int(cp.diff(dg.indptr).max().get()):,}, built in {build:.1f} s")
        pool.free_all_blocks()
        for name, (labels, qedges) in RMAT_QUERIES.items():
            if num_labels == 1 and name == "6-vertex labeled":
                continue
            qlab = [0] * len(labels) if num_labels == 1 else [x % num_labels for x in labels]
            q = Graph.from_edges(qlab, [a for a, _ in qedges], [b for _, b in qedges])
            pool.free_all_blocks()
            t0 = time.perf_counter()
            res, extra = with_peak_memory(lambda dg=dg, q=q: match(dg, q, time_limit=time_limit))
            sec = time.perf_counter() - t0
            log(f"  {name}: {res.count:,} complete {res.complete} {sec:.2f} s, +{extra / 2**20:.0f} MiB")
            rows.append([f"{num_labels} label(s)", f"{m:,}", f"{build:.1f}", name, f"{res.count:,}",
                         str(res.complete).lower(), f"{sec:.2f}", f"{extra / 2**30:.2f}",
                         f"{dg.nbytes / 2**30:.1f}"])
        del dg
    return table(["R-MAT graph", "undirected edges", "build s", "query", "embeddings", "complete",
                  f"seconds (limit {time_limit:g})", "GiB beyond graph", "graph GiB"], rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", type=Path, default=REPO.parent / "shared" / "datasets")
    ap.add_argument("--runs", type=int, default=3, help="timed GPU runs per query (median)")
    ap.add_argument("--sections", default="github,hprd,yeast,rmat")
    ap.add_argument("--time-limit", type=float, default=None, help="per github query (default none)")
    ap.add_argument("--repeat-under", type=float, default=float("inf"),
                    help="github queries whose first run takes this long are run once")
    ap.add_argument("--yeast-sample", type=int, default=20, help="first K queries of each yeast class")
    ap.add_argument("--cpu-limit", type=float, default=20.0, help="CPU seconds before a query is left out")
    ap.add_argument("--gpu-limit", type=float, default=5.0, help="GPU seconds before a yeast query is left out")
    ap.add_argument("--cpu-results", type=Path, help="JSON cache of yeast CPU results (read, extended, written)")
    ap.add_argument("--rmat-scale", type=int, default=26)
    ap.add_argument("--rmat-edges", type=int, default=700_000_000, help="R-MAT draws (before dedup)")
    ap.add_argument("--rmat-time-limit", type=float, default=30.0)
    a = ap.parse_args(argv)
    sections = a.sections.split(",")
    log(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    out = []
    if "github" in sections:
        out.append(bench_github(a.datasets / "github", a.runs, a.time_limit, a.repeat_under))
    if "hprd" in sections or "yeast" in sections:
        cache = json.loads(a.cpu_results.read_text()) if a.cpu_results and a.cpu_results.is_file() else {}
        out.append(bench_small(a.datasets, sections, a.runs, a.yeast_sample, a.cpu_limit, cache, a.gpu_limit))
        if a.cpu_results:
            a.cpu_results.write_text(json.dumps(cache))
    if "rmat" in sections:
        out.append(bench_rmat(a.rmat_scale, a.rmat_edges, a.rmat_time_limit))
    print("\n\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
