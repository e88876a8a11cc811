"""Time of the GPU executor's device search (Executor._search: upload, launch, read-back) and of
its whole run per batch, on the inline pipeline over a dataset's insertion stream, for query
sets and executor tunings (blocks per SM : offload us [: match_at's shared-memory carveout, the
percent of the SM's L1/shared memory it prefers as shared memory; the driver's choice if not
given]; "default": the executor's own). Count-only queries.

    python bench/ex_search.py --datasets .data --part human --batch-sizes 4096 \\
        --sets all,72,74,38,56,99,18 --tunings default,2:200,1:150,1:100:25
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from replay_gpu import decoded

from csmd.backends import continuous_engine
from csmd.gpu.matcher import Tuning
from csmd.gpu.module import kernel
from csmd.model.formats import read_graph, read_query
from csmd.pipeline.stages import Pipeline


def run(g0, upd, queries, b: int, tuning: Tuning | None):
    """(search s, executor s, total s, batches, matches) of one inline replay."""
    eng = continuous_engine("gpu", g0)
    ex = eng.executor
    if tuning:
        ex.tuning, ex._shapes = tuning, {}
    pipe = Pipeline(g0, engine=eng, batch_size=b, threaded=False)
    for name, q in queries:
        pipe.add_query(name, q, True)
    spent = {"search": 0.0, "run": 0.0}
    matches = [0]

    def timed(name, f, count=False):
        def w(*a, **k):
            t = time.perf_counter()
            r = f(*a, **k)
            spent[name] += time.perf_counter() - t
            if count:
                matches[0] += sum(int(m.counts.sum()) for m in r.values())
            return r
        return w

    ex._search = timed("search", ex._search)
    ex.run = timed("run", ex.run, count=True)
    t0 = time.perf_counter()
    st = pipe.run(iter(upd), lambda r: None)
    total = time.perf_counter() - t0
    eng.close()
    return spent["search"], spent["run"], total, st.batches, matches[0]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", default=".data")
    ap.add_argument("--part", default="human")
    ap.add_argument("--batch-sizes", default="4096")
    ap.add_argument("--sets", default="all,72,74,38,56,99,18")
    ap.add_argument("--tunings", default="default")
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    root = Path(args.datasets) / args.part
    g0 = read_graph(root / "data.graph")
    upd = decoded(root / "insertion.graph")
    names = sorted((p.stem for p in (root / "queries").glob("Q_*.graph")), key=lambda s: int(s[2:]))
    qs = {n: read_query(root / "queries" / f"{n}.graph") for n in names}
    sets = {s: [(n, qs[n]) for n in (names if s == "all" else [f"Q_{s}"])] for s in args.sets.split(",")}
    print(f"{'set':<5} {'b':>5} {'tuning':>8} {'batches':>7} {'search ms':>10} {'run ms':>8} {'total ms':>9} {'matches':>12}")
    for b in (int(x) for x in args.batch_sizes.split(",")):
        for t in args.tunings.split(","):
            tuning, carveout = None, -1
            if t != "default":
                blocks, off, *rest = t.split(":")
                tuning = Tuning(max_blocks_per_sm=int(blocks), offload_us=float(off))
                carveout = int(rest[0]) if rest else -1
            kernel("matcher", "match_at").preferred_shared_memory_carveout = carveout
            for s, queries in sets.items():
                run(g0, upd, queries, b, tuning)  # warm: compile, caches
                r = min((run(g0, upd, queries, b, tuning) for _ in range(args.runs)), key=lambda x: x[0])
                print(f"{s:<5} {b:>5} {t:>8} {r[3]:>7} {r[0] * 1e3:>10.2f} {r[1] * 1e3:>8.2f} {r[2] * 1e3:>9.2f} "
                      f"{r[4]:>12}", flush=True)


if __name__ == "__main__":
    main()
