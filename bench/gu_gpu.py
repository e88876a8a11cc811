"""The graph updater alone on the device: edge updates/s on a labeled power-law graph.

Builds an R-MAT graph on the device (gpu/rmat.py), loads it into DeviceMVG, and applies a
mixed stream: deletions of random existing edges and insertions of new R-MAT edges, in
random order, every pair at most once (so every op is valid wherever it stands). Each
batch's replaced versions are released one batch later, as a GC trailing by one batch
would. A batch's time is apply + release until the device is idle again (host shaping
and the upload included); the table gives the median over the timed batches.

A batch of at most GU_SMALL_ROWS / 2 ops is planned by one block, then written by the same
block (where it copies at most GU_FUSED_COPY entries) or by five grid launches; larger ones take
the multi-kernel path. --paths times each path on the same batches: the R-MAT stream at a few sizes, and with
--human DIR the first B insertions of that stream applied to a fresh DeviceMVG of its graph
(what `csmd replay --count-only` does first), the pool grown beforehand (a "fresh" row: not).

    python bench/gu_gpu.py [--scale 25] [--edges 150000000] [--labels 8] [--paths] [--human DIR]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import cupy as cp
import numpy as np

from csmd.gpu.device_mvg import SOLO_COPY, DeviceMVG
from csmd.gpu.launch import THREADS, flat_grid, i32, i64, u64
from csmd.gpu.module import kernel
from csmd.gpu.rmat import GRAPH500, rmat_graph

SIZES = (1, 64, 1024, 4096, 8192, 65536, 1 << 20)
PATH_SIZES = (64, 256, 512, 1024, 2048, 4096, 8192)  # ops, for --paths
PATHS = ("auto", "block", "mid", "grid")  # see set_path
WARMUP = 3  # untimed batches before each size's timed ones


def runs(size: int) -> int:
    """Batches timed at this size: about 2M updates, 8 to 1000 batches."""
    return max(8, min(1000, 2_000_000 // size))


def edge_keys(dg) -> cp.ndarray:
    """lo * n + hi of every edge of the device graph, ascending."""
    rows = cp.repeat(cp.arange(dg.n, dtype=cp.int64), cp.diff(dg.indptr).astype(cp.int64))
    keep = rows < dg.adj
    return rows[keep] * dg.n + dg.adj[keep]


def new_edges(n: int, scale: int, count: int, existing: cp.ndarray, seed: int) -> cp.ndarray:
    """count R-MAT pairs that are not edges yet, distinct, in random order."""
    draws = int(count * 1.6) + 1024
    src, dst = cp.empty(draws, cp.int32), cp.empty(draws, cp.int32)
    kernel("rmat", "rmat_edges")(flat_grid(draws), (THREADS,), (i64(draws), i32(scale), *GRAPH500, u64(seed), src, dst))
    lo, hi = cp.minimum(src, dst).astype(cp.int64), cp.maximum(src, dst).astype(cp.int64)
    key = cp.unique((lo * n + hi)[lo != hi])
    pos = cp.minimum(cp.searchsorted(existing, key), len(existing) - 1)
    key = key[existing[pos] != key]
    if len(key) < count:
        raise SystemExit(f"only {len(key)} new R-MAT pairs for {count} insertions: raise --scale")
    return key[cp.random.permutation(len(key))[:count]]


def make_stream(dg, scale: int, total: int, seed: int):
    """Host arrays (a, b, label, sign) of `total` ops, half deletions, half insertions."""
    existing = edge_keys(dg)
    half = total // 2
    if half > len(existing):
        raise SystemExit(f"{half} deletions asked of a graph of {len(existing)} edges: raise --edges")
    gone = existing[cp.random.permutation(len(existing))[:half]]
    new = new_edges(dg.n, scale, total - half, existing, seed)
    key = cp.concatenate([gone, new])
    sign = cp.concatenate([cp.full(half, -1, cp.int64), cp.ones(total - half, cp.int64)])
    label = cp.concatenate([cp.zeros(half, cp.int64), cp.random.randint(0, 4, total - half).astype(cp.int64)])
    order = cp.random.permutation(total)
    key, sign, label = key[order], sign[order], label[order]
    return (key // dg.n).get(), (key % dg.n).get(), label.get(), sign.get()


def set_path(dm: DeviceMVG, path: str, rows: int, fused: int) -> None:
    """auto: by batch size and copy; block: planned and written by one block; mid: planned by one
    block, written over the grid; grid: the multi-kernel path."""
    dm.small_rows = 0 if path == "grid" else rows
    dm.fused_copy = {"block": 1 << 62, "mid": -1}.get(path, fused)
    dm.solo_copy = {"block": 1 << 62, "mid": -1}.get(path, SOLO_COPY)


def time_batches(dm: DeviceMVG, stream, sizes, count=None, at: int = 0) -> list[tuple]:
    """(size, batches, median s, p90 s) per batch size, consuming the stream in order from `at`."""
    a, b, label, sign = stream
    rows, pending = [], None
    for size in sizes:
        times = []
        for i in range((count or runs(size)) + WARMUP):
            s = slice(at, at + size)
            seq = np.arange(at, at + size, dtype=np.int64)
            at += size
            t = time.perf_counter()
            token = dm.apply(seq, a[s], b[s], label[s], sign[s])
            if pending is not None:
                dm.release([pending])
            dm.stream.synchronize()
            if i >= WARMUP:
                times.append(time.perf_counter() - t)
            pending = token
        rows.append((size, count or runs(size), float(np.median(times)), float(np.percentile(times, 90))))
    if pending is not None:
        dm.release([pending])
    return rows


def rmat_paths(dm: DeviceMVG, stream, at: int) -> None:
    """Each path on the R-MAT stream (steady state: a GC trailing by one batch), per batch size."""
    rows, fused = dm.small_rows, dm.fused_copy
    print("paths on the R-MAT stream (median ms per batch, apply until the device is idle):")
    print(f"{'batch size':>10} " + " ".join(f"{p:>9}" for p in PATHS))
    for size in PATH_SIZES:
        out = []
        for path in PATHS:
            if path != "grid" and 2 * size > rows:
                out.append(f"{'-':>9}")
                continue
            set_path(dm, path, rows, fused)
            (_, count, med, _), = time_batches(dm, stream, (size,), count=20, at=at)
            at += size * (count + WARMUP)
            out.append(f"{med * 1e3:>9.3f}")
        print(f"{size:>10,} " + " ".join(out))
    set_path(dm, "auto", rows, fused)


def human_paths(root, runs_: int = 7) -> None:
    """Each path on the first B insertions of the human stream, applied to a fresh DeviceMVG of its
    graph: host ms (the apply call), ms until the device is idle, device ms (events around it), and
    of it the upload and the one-block plan where the grid writes."""
    from csmd.model.formats import read_graph

    g = read_graph(root / "data.graph")
    ins = [line.split() for line in (root / "insertion.graph").read_text().splitlines() if line.startswith("e ")]
    a = np.array([g.index_of(int(x[1])) for x in ins], np.int64)
    b = np.array([g.index_of(int(x[2])) for x in ins], np.int64)
    label = np.array([int(x[3]) if len(x) > 3 else 0 for x in ins], np.int64)
    rows = fused = None
    print(f"paths on the human stream's first B insertions ({g.n:,} vertices; median of {runs_}, ms):")
    print(f"{'B':>6} {'path':>6} {'host':>8} {'to idle':>8} {'device':>8} {'plan':>8}")
    for size in [s for s in PATH_SIZES if s < len(a)] + [len(a)]:
        for path in PATHS + ("fresh",):
            host, idle, dev, plan = [], [], [], []
            for i in range(runs_ + 1):
                dm = DeviceMVG.from_graph(g)
                if rows is None:
                    rows, fused = dm.small_rows, dm.fused_copy
                if path != "fresh" and path != "grid" and 2 * size > rows:
                    break
                set_path(dm, "auto" if path == "fresh" else path, rows, fused)
                if path != "fresh":  # growth (a device sync) out of the timing
                    dm._reserve(versions=dm.n_versions + 2 * size + 1024, entries=3 * dm.bump + 80 * size)
                    dm._copy_space(dm.bump + 1)
                cp.cuda.Device().synchronize()
                e0, e1, em = cp.cuda.Event(), cp.cuda.Event(), []
                write_mid = dm._write_mid

                def timed_mid(*args, dm=dm, write_mid=write_mid, em=em):
                    em.append(cp.cuda.Event())
                    em[0].record(dm.stream)
                    write_mid(*args)

                dm._write_mid = timed_mid
                seq = np.arange(size, dtype=np.int64)
                s = slice(0, size)
                t0 = time.perf_counter()
                e0.record(dm.stream)
                token = dm.apply(seq, a[s], b[s], label[s], np.ones(size, np.int64))
                e1.record(dm.stream)
                t1 = time.perf_counter()
                dm.stream.synchronize()
                t2 = time.perf_counter()
                _ = token.count  # settles a deferred batch
                if i:
                    host.append(t1 - t0)
                    idle.append(t2 - t0)
                    dev.append(cp.cuda.get_elapsed_time(e0, e1) / 1e3)
                    if em:
                        plan.append(cp.cuda.get_elapsed_time(e0, em[0]) / 1e3)
                del dm
            if host:
                print(f"{size:>6} {path:>6} " + " ".join(f"{np.median(x) * 1e3:>8.3f}" for x in (host, idle, dev)) +
                      (f" {np.median(plan) * 1e3:>8.3f}" if plan else f" {'-':>8}"))


def load(scale: int, edges: int, labels: int, seed: int, sizes, extra: int = 0):
    """The R-MAT graph in a DeviceMVG, the stream for `sizes` (and `extra` updates more), and what
    building them cost."""
    t = time.perf_counter()
    dg = rmat_graph(scale, edges, labels, seed)
    stream = make_stream(dg, scale, sum(s * (runs(s) + WARMUP) for s in sizes) + extra, seed + 7)
    t_gen = time.perf_counter() - t
    n, m = dg.n, len(dg.adj) // 2
    t = time.perf_counter()
    dm = DeviceMVG.from_device_graph(dg)
    t_build = time.perf_counter() - t
    del dg
    cp.get_default_memory_pool().free_all_blocks()
    return dm, stream, n, m, t_gen, t_build


def table(rows) -> None:
    print(f"{'batch size':>10} {'batches':>8} {'median ms':>10} {'p90 ms':>8} {'updates/s':>14} {'us/batch':>9}")
    for size, count, med, p90 in rows:
        print(f"{size:>10,} {count:>8} {med * 1e3:>10.3f} {p90 * 1e3:>8.3f} {size / med:>14,.0f} {med * 1e6:>9.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=int, default=25, help="2^scale vertices")
    ap.add_argument("--edges", type=int, default=150_000_000, help="R-MAT draws (repeats are dropped)")
    ap.add_argument("--labels", type=int, default=8, help="vertex labels")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--paths", action="store_true", help="also time each apply path on the same batches")
    ap.add_argument("--human", type=Path, help="the human dataset's folder: --paths on its insertion stream, "
                                               "then exit")
    args = ap.parse_args()
    cp.random.seed(args.seed)
    if args.human:
        human_paths(args.human)
        return
    path_updates = sum(len(PATHS) * s * (20 + WARMUP) for s in PATH_SIZES) if args.paths else 0
    dm, stream, n, m, t_gen, t_build = load(args.scale, args.edges, args.labels, args.seed, SIZES, path_updates)
    held0 = dm.memory_bytes
    rows = time_batches(dm, stream, SIZES)
    updates = sum(s * (runs(s) + WARMUP) for s in SIZES)
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    print(f"graph: R-MAT scale {args.scale}, {n:,} vertices, {m:,} undirected edges, {args.labels} vertex labels "
          f"(generated with the stream in {t_gen:.1f} s); DeviceMVG bulk build {t_build * 1e3:.0f} ms")
    print(f"pool: {held0 / 2**30:.2f} GiB after the build, {dm.memory_bytes / 2**30:.2f} GiB after "
          f"{updates:,} updates; {dm.live_versions:,} live versions")
    print("stream: half deletions of existing edges, half insertions of new R-MAT edges, random order; "
          "time per batch = apply + release of the previous batch's versions, until the device is idle")
    table(rows)
    if args.paths:
        rmat_paths(dm, stream, updates)
    # the fixed cost per batch, where copies cost next to nothing
    del dm, stream
    cp.get_default_memory_pool().free_all_blocks()
    dm, stream, n, m, _, _ = load(14, 200_000, args.labels, args.seed, (1, 64))
    print(f"fixed cost: R-MAT scale 14, {n:,} vertices, {m:,} edges")
    table(time_batches(dm, stream, (1, 64)))


if __name__ == "__main__":
    main()
