"""Static matching: the compiled CPU engine against the numpy one, same plans, same counts.

    python bench/static_engines.py [--datasets DIR] [--sample 20] [--time-limit 10]

Per query set (HPRD, all queries; yeast, the first --sample queries of each class in
natural order): the summed time of each engine's search (plans are shared and not
timed), the speed-up, and how many counts differ (must be 0). A query that reaches
--time-limit on either engine is left out of both sums and counted. Then the first-use
compile time: a one-query `csmd match` in a fresh process with an empty numba cache,
against the same with the cache warm.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from first_use import first_use

from csmd.cpu import compiled, matcher
from csmd.model.formats import read_graph, read_query
from csmd.model.plan import plan_query

YEAST_CLASSES = ["query_dense_4", "query_dense_8", "query_sparse_8", "query_dense_16", "query_sparse_16"]


def natural_key(p: Path):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]


def compare(g, files, time_limit):
    """(compiled seconds, numpy seconds, differing counts, timed-out queries) over the files."""
    t_c = t_n = 0.0
    differ = timeouts = 0
    for f in files:
        plan = plan_query(g, read_query(f))
        c = compiled.search(g, plan, time_limit=time_limit)
        n = matcher.search(g, plan, time_limit=time_limit)
        if not (c.complete and n.complete):
            timeouts += 1
            continue
        t_c += c.seconds
        t_n += n.seconds
        differ += c.count != n.count
    return t_c, t_n, differ, timeouts


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "datasets")
    ap.add_argument("--sample", type=int, default=20)
    ap.add_argument("--time-limit", type=float, default=10.0)
    args = ap.parse_args()
    sets = []
    hprd = args.datasets / "hprd"
    sets.append(("HPRD, all", read_graph(hprd / "data.graph"), sorted((hprd / "queries").glob("*.graph"),
                                                                      key=natural_key)))
    yeast = args.datasets / "yeast"
    gy = read_graph(yeast / "data.graph")
    for cls in YEAST_CLASSES:
        files = sorted(yeast.glob(f"queries/{cls}_*.graph"), key=natural_key)[: args.sample]
        sets.append((f"yeast {cls}", gy, files))
    compiled.search(sets[0][1], plan_query(sets[0][1], read_query(sets[0][2][0])))  # load the kernels
    print(f"{'query set':<26} {'queries':>7} {'compiled s':>10} {'numpy s':>9} {'speed-up':>8} {'differ':>6} "
          f"{'timed out':>9}")
    for name, g, files in sets:
        t_c, t_n, differ, timeouts = compare(g, files, args.time_limit)
        print(f"{name:<26} {len(files):>7} {t_c:>10.3f} {t_n:>9.3f} {t_n / max(t_c, 1e-9):>8.1f} {differ:>6} "
              f"{timeouts:>9}", flush=True)
    cold, warm = first_use(["match", "--json", "--backend", "cpu", "--data", str(hprd / "data.graph"), "--query",
                            str(sets[0][2][0])])
    print(f"one-query `csmd match --backend cpu` in a fresh process: {cold:.1f} s with an empty numba cache "
          f"(compiles), {warm:.1f} s warm")


if __name__ == "__main__":
    main()
