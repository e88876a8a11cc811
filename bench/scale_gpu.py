"""The GPU continuous engine at scale: a labeled R-MAT graph of 100M+ edges on the device and a
mixed stream of 10M updates, matched for one query at a time; device memory along the way.

Per query (count-only): updates/s of the engine (apply, match at each update's own timestamp,
GC release: the stages of the pipeline, run in one thread on batches of --batch updates),
the matches found, and device memory (the engine's pool and CuPy's whole pool) sampled after
every batch: after the first tenth of the stream it must stay flat (peak and curve printed).

    python bench/scale_gpu.py [--scale 26] [--edges 150000000] [--labels 8] [--updates 10000000]
"""

from __future__ import annotations

import argparse
import time

import cupy as cp
import numpy as np

from csmd.engine import UpdateBatch
from csmd.gpu.engine import GpuEngine
from csmd.gpu.rmat import rmat_graph
from csmd.model.graph import Graph
from csmd.pipeline.gc import GarbageCollector
from csmd.pipeline.queries import continuous_query

from gu_gpu import make_stream

QUERIES = {  # labels, edges: the triangle, 4-cycle and a 5-vertex labeled query
    "triangle": ([0, 1, 2], [(0, 1), (1, 2), (2, 0)]),
    "4-cycle": ([0, 1, 2, 3], [(0, 1), (1, 2), (2, 3), (3, 0)]),
    "5-vertex": ([0, 1, 2, 3, 4], [(0, 1), (1, 2), (2, 0), (2, 3), (3, 4)]),
}


def query_graph(labels, edges) -> Graph:
    s, d = (np.array(x, np.int64) for x in zip(*edges))
    return Graph.from_edges(np.array(labels, np.int32), s, d)


def batches(stream, size: int):
    a, b, label, sign = stream
    z = np.zeros(0, np.int64)
    for at in range(0, len(a), size):
        s = slice(at, at + size)
        k = len(a[s])
        yield UpdateBatch(at, at + k, np.arange(at, at + k, dtype=np.int64), a[s], b[s], label[s].astype(np.int32),
                          sign[s].astype(np.int8), z, z, z, np.zeros(0, np.int32), 0)


def run(engine: GpuEngine, prepared, stream, size: int):
    """(seconds, matches, [(updates, engine bytes, pool bytes)] per batch) of one pass over the stream."""
    gc = GarbageCollector(0)
    pool = cp.get_default_memory_pool()
    matches, curve = 0, []
    t0 = time.perf_counter()
    for batch in batches(stream, size):
        gc.replaced(engine.apply(batch))
        for m in engine.submit(batch, prepared).result().values():
            matches += int(m.counts.sum())
        free = gc.finished(batch.first_seq, batch.end_seq)
        if free:
            engine.release(free)
        curve.append((batch.end_seq, engine.stats().memory_bytes, pool.used_bytes()))
    cp.cuda.Device().synchronize()
    return time.perf_counter() - t0, matches, curve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=int, default=26)
    ap.add_argument("--edges", type=int, default=150_000_000, help="R-MAT draws (repeats are dropped)")
    ap.add_argument("--labels", type=int, default=8)
    ap.add_argument("--updates", type=int, default=10_000_000)
    ap.add_argument("--batch", type=int, default=1 << 16)
    ap.add_argument("--queries", default=",".join(QUERIES))
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    cp.random.seed(args.seed)
    t = time.perf_counter()
    dg = rmat_graph(args.scale, args.edges, args.labels, args.seed)
    stream = make_stream(dg, args.scale, args.updates, args.seed + 7)
    n, m = dg.n, len(dg.adj) // 2
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    print(f"graph: R-MAT scale {args.scale}, {n:,} vertices, {m:,} undirected edges, {args.labels} labels; "
          f"stream: {args.updates:,} updates (half deletions, half insertions), batches of {args.batch:,}; "
          f"generated in {time.perf_counter() - t:.1f} s")
    print(f"{'query':<10} {'seconds':>8} {'updates/s':>12} {'matches':>14} {'engine GiB':>10} {'pool peak GiB':>13} "
          f"{'pool after 10% / 50% / end GiB':>31}")
    labels = dg.labels.get()
    for name in args.queries.split(","):
        engine = GpuEngine(dg)
        cq = continuous_query(name, query_graph(*QUERIES[name]), labels, count_only=True)
        sec, matches, curve = run(engine, [engine.prepare(cq)], stream, args.batch)
        pool = np.array([c[2] for c in curve]) / 2**30
        at = [pool[max(0, int(len(pool) * f) - 1)] for f in (0.1, 0.5, 1.0)]
        print(f"{name:<10} {sec:>8.2f} {args.updates / sec:>12,.0f} {matches:>14,} {curve[-1][1] / 2**30:>10.2f} "
              f"{pool.max():>13.2f} {' / '.join(f'{x:.2f}' for x in at):>31}", flush=True)
        del engine
        cp.get_default_memory_pool().free_all_blocks()


if __name__ == "__main__":
    main()
