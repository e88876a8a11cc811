"""Several GPUs behind one engine (gpu/replicas.py): updates/s with 1, 2 and 4 devices, count-only,
and the share of the one-GPU time that its searches take (where a split can pay at all); and
static matching with each query's roots split over the devices (gpu/engine.py on_devices).

Workloads (--parts): `lj`, bench/workloads.py's LiveJournal-sized graph and insertion stream (built
into --workload if it is not there), each query set of --sets registered at once; `human`, the
human stream with Q_1..Q_100; `yeast`, bench/replay_yeast.py's mixed stream with its 17 queries.
Each run streams the same updates, decoded beforehand, through a fresh pipeline and engine (the
graph's upload to every device is set-up, not timed; every device's kernels are loaded first,
warm_once). On `lj` the one-GPU run streams for --seconds and the others take the same updates.
`search`: the seconds in the engine's submit (seeds, the devices' search, the counts), of the
run's seconds. `github` (static): plan + search
of each of github's Q_0..Q_21 alone and of all 22 in one search (what `csmd match --gpus N`
does), the median of --runs runs, the graph on every device beforehand.

`--alone N`: on `lj`, each of a set's first N queries registered alone (a row each), not the set.
`--materialised`: every match a delta row (a split search enumerates its last depth's share: the
depths above it are searched on every device). `--stream mixed`: lj's stream with deletions.

    python bench/gpus.py [--parts lj,human,yeast,github] [--workload DIR] [--sets dense_8,sparse_8,tree_8]
                         [--gpus 1,2,4] [--seconds 30 | --updates N] [--batch-size 4096] [--runs 1] [--alone N]
                         [--progress] [--materialised] [--stream insertion|mixed] [--deal-range N]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from csmd.backends import continuous_engine, warm_once
from csmd.jobs.replay import read_stream
from csmd.model.formats import UpdateBlock, query_files, read_graph, read_query
from csmd.pipeline.stages import Pipeline
from csmd.testing.streams import make_stream

from replay_yeast import QUERIES as YEAST_QUERIES

HERE = Path(__file__).resolve().parent


PIECE = 512  # updates: a limited run stops between two pieces (a batch takes several)


def pieces(items: list, size: int = PIECE) -> list:
    """The decoded stream in pieces of at most `size` updates."""
    out = []
    for x in items:
        if isinstance(x, UpdateBlock):
            out += [x.rows(lo, min(lo + size, len(x))) for lo in range(0, len(x), size)]
        else:
            out.append(x)
    return out


def run(g0, items: list, queries, gpus: int, batch_size: int, seconds: float | None = None, progress: bool = False,
        materialised: bool = False):
    """One pipeline over items (all of them, or those taken within `seconds`), count-only unless
    `materialised`: (seconds, updates, seconds in submit, {query: positive})."""
    engine = continuous_engine("gpu", g0, gpus=gpus)
    in_submit = [0.0]
    submit = engine.submit

    def timed_submit(*args):
        t = time.perf_counter()
        try:
            return submit(*args)
        finally:
            in_submit[0] += time.perf_counter() - t

    engine.submit = timed_submit
    pipe = Pipeline(g0, engine=engine, batch_size=batch_size)
    for name, q in queries:
        pipe.add_query(name, q, not materialised)
    pipe.warm()
    totals = dict.fromkeys((n for n, _ in queries), 0)
    taken = [0]
    t0 = time.perf_counter()

    def source():
        for x in items:
            if seconds is not None and time.perf_counter() - t0 > seconds:
                return
            taken[0] += len(x) if isinstance(x, UpdateBlock) else 1
            yield x

    def on_result(result):
        for d in result.deltas:
            totals[d.name] += d.positive
        if progress:
            print(f"  {gpus} gpus: batch of {result.batch.records} at {time.perf_counter() - t0:.2f} s", file=sys.stderr,
                  flush=True)

    pipe.run(source(), on_result)
    sec = time.perf_counter() - t0
    engine.close()
    split = getattr(engine, "split_seconds", None)
    if split is not None and split[0]:
        wall, slowest, mean = split
        print(f"  {gpus} gpus: split searches {wall:.3f} s, their slowest device {slowest:.3f} s, the devices' "
              f"mean {mean:.3f} s (uneven {slowest / mean:.2f}x)", file=sys.stderr, flush=True)
    return sec, taken[0], in_submit[0], totals


def table(label: str, g0, items: list, queries, args, limit: float | None = None) -> None:
    """One row per GPU count, the median of --runs runs; the counts must agree. limit: the updates
    one GPU streams in that many seconds (a run first, not reported), not all."""
    if args.updates and limit is not None:  # lj's tables only (they pass a limit)
        items = upto(items, args.updates)
    elif limit is not None:
        items = upto(items, run(g0, items, queries, args.gpus[0], args.batch_size, limit, args.progress,
                                args.materialised)[1])
    base = None
    for n in args.gpus:
        runs = sorted((run(g0, items, queries, n, args.batch_size, progress=args.progress,
                           materialised=args.materialised) for _ in range(args.runs)), key=lambda r: r[0])
        sec, taken, search, totals = runs[len(runs) // 2]
        if base is None:
            base = (sec, totals)
        same = "ok" if totals == base[1] else "DIFFER"
        print(f"{label:<22} {len(queries):>7} {n:>4} {taken:>9} {sec:>8.3f} {taken / sec:>11,.0f} "
              f"{search / sec:>7.0%} {base[0] / sec:>8.2f}x {same:>6}", flush=True)


def upto(items: list, updates: int) -> list:
    """The leading items that hold `updates` updates."""
    out, n = [], 0
    for x in items:
        if n >= updates:
            break
        out.append(x)
        n += len(x) if isinstance(x, UpdateBlock) else 1
    return out


def static(g, queries, args) -> None:
    """github's table: one row per query alone, then the 22 in one search; seconds per GPU count."""
    from csmd.gpu import engine
    from csmd.gpu.engine import match, match_many

    def devices(n):
        return list(range(n)) if n > 1 else None

    engine.SPECULATE_S, speculate = 0, engine.SPECULATE_S  # every device's upload and modules, before the clock
    for n in args.gpus:
        match(g, queries[0][1], devices=devices(n))
    engine.SPECULATE_S = speculate
    print(f"{'github query':<14} {'matches':>18} " + " ".join(f"{f'{n} gpu s':>9}" for n in args.gpus)
          + " " + " ".join(f"{f'{n} gpus':>8}" for n in args.gpus[1:]), flush=True)

    def row(label, search):
        per, counts = [], set()
        for n in args.gpus:
            runs = sorted(search(devices(n)) for _ in range(args.runs))
            sec, found = runs[len(runs) // 2]
            per.append(sec)
            counts.add(found)
        same = next(iter(counts)) if len(counts) == 1 else "DIFFER"
        print(f"{label:<14} {same:>18} " + " ".join(f"{s:>9.3f}" for s in per) + " "
              + " ".join(f"{per[0] / s:>7.2f}x" for s in per[1:]), flush=True)
        return per

    def alone(q):
        def search(devs):
            res = match(g, q, devices=devs)
            assert res.complete
            return res.seconds, res.count
        return search

    total = [0.0] * len(args.gpus)
    for name, q in queries:
        total = [a + b for a, b in zip(total, row(name, alone(q)))]
    print(f"{'sum alone':<14} {'':>18} " + " ".join(f"{s:>9.3f}" for s in total) + " "
          + " ".join(f"{total[0] / s:>7.2f}x" for s in total[1:]), flush=True)

    def batch(devs):
        res = match_many(g, [q for _, q in queries], devices=devs)
        assert all(r.complete for r in res)
        return res[0].seconds, sum(r.count for r in res)

    row("one search", batch)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", type=Path, default=HERE.parents[0].parent / "shared" / "datasets")
    ap.add_argument("--parts", default="lj,human,yeast")
    ap.add_argument("--workload", type=Path, default=Path(tempfile.gettempdir()) / "csmd-lj")
    ap.add_argument("--sets", default="dense_8,sparse_8,tree_8")
    ap.add_argument("--gpus", default="1,2,4")
    ap.add_argument("--seconds", type=float, default=30.0, help="the lj one-GPU run's limit")
    ap.add_argument("--updates", type=int, default=0,
                    help="lj: the first N updates (rounded up to a piece) in place of --seconds' run, to compare calls")
    ap.add_argument("--batch-size", type=int, default=4096)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--progress", action="store_true", help="each batch's time, on standard error")
    ap.add_argument("--alone", type=int, default=0, help="lj: each of a set's first N queries alone, not the set")
    ap.add_argument("--materialised", action="store_true", help="every match a delta row, not counts")
    ap.add_argument("--stream", default="insertion", choices=("insertion", "mixed"),
                    help="lj: the insertion stream, or the mixed one with deletions")
    ap.add_argument("--deal-range", type=int, default=None,
                    help="a split search also deals out ranges of this many entries (gpu/matcher.py DEAL_RANGE)")
    args = ap.parse_args()
    from csmd.gpu import matcher
    matcher.DEAL_RANGE = args.deal_range
    args.gpus = [int(x) for x in args.gpus.split(",")]
    for n in args.gpus:
        warm_once("gpu", n)
    parts = args.parts.split(",")
    if "github" in parts:
        root = args.datasets / "github"
        print(f"static, median of {args.runs} runs; speed-up against {args.gpus[0]} GPU")
        static(read_graph(root / "data.graph"),
               [(f"Q_{i}", read_query(root / "queries" / f"Q_{i}.graph")) for i in range(22)], args)
    if set(parts) - {"github"}:
        mode = "materialised" if args.materialised else "count-only"
        print(f"{mode}, batch {args.batch_size}; median of {args.runs} runs; search: the share of the run in "
              f"the engine's submit; speed-up against {args.gpus[0]} GPU")
        print(f"{'workload':<22} {'queries':>7} {'gpus':>4} {'updates':>9} {'seconds':>8} {'updates/s':>11} "
              f"{'search':>7} {'speed-up':>9} {'counts':>6}")
    if "human" in parts:
        root = args.datasets / "human"
        g0 = read_graph(root / "data.graph")
        queries = [(f"Q_{i}", read_query(root / "queries" / f"Q_{i}.graph")) for i in range(1, 101)]
        table("human", g0, pieces(read_stream(root / "insertion.graph")), queries, args)
    if "yeast" in parts:
        root = args.datasets / "yeast"
        with tempfile.TemporaryDirectory() as tmp:
            g0_path, stream, _, _ = make_stream(root / "data.graph", Path(tmp), 1)
            g0 = read_graph(g0_path)
            queries = [(n, read_query(root / "queries" / f"{n}.graph")) for n in YEAST_QUERIES]
            table("yeast mixed", g0, pieces(read_stream(stream)), queries, args)
    if "lj" in parts:
        wl = args.workload
        if not (wl / "MANIFEST.sha256").exists():
            t = time.perf_counter()
            subprocess.run([sys.executable, str(HERE / "workloads.py"), "--out", str(wl)], check=True,
                           stdout=subprocess.DEVNULL)
            print(f"(built {wl} in {time.perf_counter() - t:.0f} s)", flush=True)
        t = time.perf_counter()
        g0 = read_graph(wl / "data.graph")
        items = pieces(read_stream(wl / f"{args.stream}.graph"))
        print(f"(lj: {g0.n} vertices, {g0.num_edges} edges read in {time.perf_counter() - t:.0f} s)", flush=True)
        for name in args.sets.split(","):
            queries = [(p.stem, read_query(p)) for p in query_files([wl / "queries" / name])]
            if not args.alone:
                table(f"lj {name}", g0, items, queries, args, args.seconds)
            for qname, q in queries[:args.alone]:  # the set's first --alone queries, each registered alone
                table(f"lj {name} {qname.rsplit('_', 1)[-1]}", g0, items, [(qname, q)], args, args.seconds)


if __name__ == "__main__":
    main()
