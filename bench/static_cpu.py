"""Static matching on the CPU engine: csmd vs the expected counts and vs networkx.

    python bench/static_cpu.py [--datasets DIR] [--runs N] [--yeast-sample K] [--nx-timeout S]

Prints two plain-text tables on stdout (progress goes to stderr):

1. HPRD, all queries: total time of plan + search over the whole query set
   (median of --runs runs), median and max per-query time, and the number of
   counts that disagree with expected_counts.txt (must be 0).
2. Yeast, 4- and 8-vertex query classes, the first K queries of each class in
   natural order: per query the csmd time is the median of --runs runs of
   plan + search; networkx counts the same embeddings (label-preserving
   monomorphisms, automorphic ones counted separately) once per query with
   GraphMatcher.subgraph_monomorphisms_iter, abandoned after --nx-timeout seconds.
   Speed-up = sum(networkx time) / sum(csmd time) over the queries networkx
   finished, and the median of the per-query ratios; the last column counts a
   networkx timeout as the limit itself, a lower bound on the speed-up over all
   queries of the class.

Times exclude reading files. The data graph's lazily built indexes are warmed
with one untimed query before timing starts.
"""

from __future__ import annotations

import argparse
import re
import signal
import statistics
import sys
import time
from pathlib import Path

import networkx as nx
from networkx.algorithms.isomorphism import GraphMatcher

from csmd.cpu import matcher as cpu_matcher
from csmd.model.formats import read_graph, read_query
from csmd.model.plan import plan_query

REPO = Path(__file__).resolve().parent.parent
YEAST_CLASSES = ["query_dense_4", "query_dense_8", "query_sparse_8"]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def natural_key(p: Path):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p.name)]


def class_files(qdir: Path, prefix: str) -> list[Path]:
    pat = re.compile(re.escape(prefix) + r"_\d+\.graph$")
    return sorted((p for p in qdir.iterdir() if pat.match(p.name)), key=natural_key)


def csmd_once(g, q) -> tuple[int, float]:
    """One plan + search; returns (count, seconds)."""
    t0 = time.perf_counter()
    res = cpu_matcher.search(g, plan_query(g, q))
    dt = time.perf_counter() - t0
    if not res.complete:
        raise RuntimeError("csmd search stopped early without a limit")
    return res.count, dt


def to_nx(g) -> nx.Graph:
    """The csmd graph as a networkx graph (vertex attr 'l', edge attr 'el')."""
    G = nx.Graph()
    for v in range(g.n):
        G.add_node(v, l=int(g.labels[v]))
    for v in range(g.n):
        lo, hi = g.indptr[v], g.indptr[v + 1]
        for w, el in zip(g.indices[lo:hi].tolist(), g.elabels[lo:hi].tolist()):
            if v < w:
                G.add_edge(v, w, el=el)
    return G


class _NxTimeout(Exception):
    pass


def _raise_timeout(signum, frame):
    raise _NxTimeout


def nx_count(G: nx.Graph, Q: nx.Graph, timeout: float, edge_labels: bool) -> tuple[int, float, bool]:
    """Count monomorphisms Q -> G; returns (count, seconds, finished)."""
    node_match = lambda a, b: a["l"] == b["l"]  # noqa: E731
    edge_match = (lambda a, b: a["el"] == b["el"]) if edge_labels else None  # noqa: E731
    gm = GraphMatcher(G, Q, node_match=node_match, edge_match=edge_match)
    t0 = time.perf_counter()
    deadline = t0 + timeout
    n = 0
    # The in-loop check cannot fire while networkx searches long stretches without
    # yielding (e.g. a query with no matches); an interval timer bounds those.
    old = signal.signal(signal.SIGALRM, _raise_timeout)
    signal.setitimer(signal.ITIMER_REAL, timeout + 0.05)
    try:
        for _ in gm.subgraph_monomorphisms_iter():
            n += 1
            if time.perf_counter() > deadline:
                return n, time.perf_counter() - t0, False
    except _NxTimeout:
        return n, time.perf_counter() - t0, False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return n, time.perf_counter() - t0, True


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    fmt = lambda cells: "  ".join(  # noqa: E731
        c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    lines = [fmt(headers), "  ".join("-" * w for w in widths)]
    lines += [fmt(r) for r in rows]
    return "\n".join(lines)


def ms(s: float) -> str:
    return f"{s * 1e3:.2f} ms"


def bench_hprd(root: Path, runs: int) -> str:
    g = read_graph(root / "data.graph")
    expected = {}
    for line in (root / "expected_counts.txt").read_text().split():
        name, cnt = line.rsplit(":", 1)
        expected[name] = int(cnt)
    files = sorted((root / "queries").glob("*.graph"), key=natural_key)
    queries = [(f.stem, read_query(f)) for f in files]
    log(f"hprd: {g.n} vertices, {g.num_edges} edges, {len(queries)} queries")
    csmd_once(g, queries[0][1])  # warm the graph's lazy indexes

    totals, per_query = [], [[] for _ in queries]
    mismatches = missing = 0
    for r in range(runs):
        t_run = 0.0
        for i, (name, q) in enumerate(queries):
            cnt, dt = csmd_once(g, q)
            t_run += dt
            per_query[i].append(dt)
            if r == 0:
                if name not in expected:
                    missing += 1
                elif expected[name] != cnt:
                    mismatches += 1
                    log(f"  MISMATCH {name}: csmd {cnt}, expected {expected[name]}")
        totals.append(t_run)
        log(f"  run {r + 1}/{runs}: {t_run:.2f} s")
    med_q = [statistics.median(t) for t in per_query]
    worst = max(range(len(queries)), key=lambda i: med_q[i])
    headers = [f"HPRD ({g.n} V, {g.num_edges} E)", "queries", f"total (median of {runs})",
               "median/query", "max query", "mismatches"]
    row = ["all queries", str(len(queries)), f"{statistics.median(totals):.2f} s", ms(statistics.median(med_q)),
           f"{ms(med_q[worst])} ({queries[worst][0]})",
           str(mismatches) + (f" (+{missing} without expected count)" if missing else "")]
    return table(headers, [row])


def bench_yeast(root: Path, runs: int, sample: int, nx_timeout: float) -> str:
    g = read_graph(root / "data.graph")
    t0 = time.perf_counter()
    G = to_nx(g)
    edge_labels = bool(g.elabels.any())
    log(f"yeast: {g.n} vertices, {g.num_edges} edges; networkx graph built in {time.perf_counter() - t0:.2f} s")
    rows, disagreements = [], 0
    warmed = False
    for cls in YEAST_CLASSES:
        files = class_files(root / "queries", cls)[:sample]
        if not files:
            log(f"  {cls}: no query files, skipped")
            continue
        csmd_t, nx_t, ratios, nx_capped = [], [], [], []
        fin_csmd = 0.0
        for k, f in enumerate(files):
            q = read_query(f)
            if not warmed:
                csmd_once(g, q)
                warmed = True
            times, cnt = [], None
            for _ in range(runs):
                cnt, dt = csmd_once(g, q)
                times.append(dt)
            t_c = statistics.median(times)
            csmd_t.append(t_c)
            n_cnt, t_n, done = nx_count(G, to_nx(q), nx_timeout, edge_labels)
            nx_capped.append(t_n if done else nx_timeout)
            if done:
                nx_t.append(t_n)
                fin_csmd += t_c
                ratios.append(t_n / t_c)
                if n_cnt != cnt:
                    disagreements += 1
                    log(f"  DISAGREE {f.name}: csmd {cnt}, networkx {n_cnt}")
            log(f"  {cls} {k + 1}/{len(files)} {f.stem}: count {cnt}, csmd {ms(t_c)}, "
                f"networkx {ms(t_n) if done else 'timeout'}")
        nq = len(files)
        qv = read_query(files[0]).n
        rows.append([
            f"{cls} ({qv} V)", str(nq), ms(statistics.median(csmd_t)),
            ms(statistics.median(nx_t)) if nx_t else "-",
            f"{len(nx_t)}/{nq}",
            f"{sum(nx_t) / fin_csmd:.1f}x" if nx_t else "-",
            f"{statistics.median(ratios):.1f}x" if ratios else "-",
            f">= {sum(nx_capped) / sum(csmd_t):.1f}x",
        ])
    headers = [f"Yeast ({g.n} V, {g.num_edges} E)", "queries", f"csmd median/query (median of {runs})",
               "networkx median (finished)", f"nx finished (<{nx_timeout:g} s)", "speed-up (sum)",
               "speed-up (median)", "speed-up all (timeout = limit)"]
    return table(headers, rows) + f"\ncount disagreements where networkx finished: {disagreements}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", type=Path, default=REPO.parent / "shared" / "datasets",
                    help="folder holding hprd/ and yeast/ (default: ../shared/datasets from the repo root)")
    ap.add_argument("--runs", type=int, default=3, help="timed csmd runs per measurement (median)")
    ap.add_argument("--yeast-sample", type=int, default=25,
                    help="first K queries of each yeast class (default 25: most 8-vertex queries hit the "
                         "networkx timeout, and 50 per class would take well over 10 minutes)")
    ap.add_argument("--nx-timeout", type=float, default=10.0, help="seconds before networkx is abandoned")
    a = ap.parse_args(argv)
    if a.runs < 1 or a.yeast_sample < 1 or a.nx_timeout <= 0:
        ap.error("--runs and --yeast-sample must be >= 1, --nx-timeout > 0")
    for d in ("hprd", "yeast"):
        if not (a.datasets / d / "data.graph").is_file():
            ap.error(f"{a.datasets / d / 'data.graph'} not found (use --datasets)")
    print(bench_hprd(a.datasets / "hprd", a.runs))
    print()
    print(bench_yeast(a.datasets / "yeast", a.runs, a.yeast_sample, a.nx_timeout))
    return 0


if __name__ == "__main__":
    sys.exit(main())
