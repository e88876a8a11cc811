"""Continuous matching on the CPU: the human insertion stream through the full pipeline, beside RapidFlow.

Prints, per query registered alone and for all queries registered at once (count-only,
median of --runs runs): csmd's seconds, RapidFlow's query time on a 2-core VM
(rapidflow_query_times.txt, third column) and the ratio; then the fixed per-update cost
(a query whose labels match nothing) on each CPU engine, and the compiled engine's
first-use compile time (a fresh numba cache) against a warm start.

What is timed, on both sides. RapidFlow's query time covers its loop over the updates
(apply each to its graph and views, then search); it loads the data graph, the query and
the whole update stream into memory, and builds its views and orders, before its clock
starts. csmd's seconds here are replay's over the stream decoded into memory beforehand
(read_stream): sequencing (external ids, duplicate checks), the graph updater, the
executor, the GC and the canonical delta order of every update, in batches of
--batch-size; not loading g0 into the engine, not planning the queries, not reading the
file. `csmd replay` itself also reads the file as it goes (about 0.3 ms for this stream):
the last line prints that end-to-end figure for all queries at once. RapidFlow runs on one
thread; csmd's compiled engine splits a batch's searches over its threads (CSMD_THREADS,
default the cores; the header says how many) once a batch searches for over 0.5 ms.

    python bench/replay.py [--datasets DIR] [--runs 3] [--batch-size 4096] [--queries 100] [--backend cpu]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from first_use import first_use

from csmd.cpu.workers import thread_count
from csmd.jobs import COUNT_ONLY_REPLAY_BATCH
from csmd.jobs.replay import read_stream, replay
from csmd.model.formats import read_graph, read_query
from csmd.model.graph import Graph


_decoded: dict = {}


def measure(g0, stream: Path, queries, batch_size, runs, backend, in_memory: bool = True):
    """(median seconds, results of the last run) of replay, count-only; in_memory: over the
    stream decoded beforehand (what RapidFlow's query time covers), else reading the file."""
    if in_memory and stream not in _decoded:
        _decoded[stream] = read_stream(stream)
    secs, res = [], None
    for _ in range(runs):
        res, _ = replay(g0, _decoded[stream] if in_memory else stream, queries, batch_size=batch_size,
                        count_only=True, show_progress=False, backend=backend)
        secs.append(res[0]["seconds"])
    return statistics.median(secs), res


DEVICE_CPU, VM = 1, 2  # the time columns of rapidflow_query_times.txt


def read_rapidflow(path: Path, column: int = VM) -> dict[str, float]:
    """Query -> RapidFlow's seconds: on a 2-core VM like this one (VM) or a device machine's CPU."""
    out = {}
    for line in path.read_text().splitlines():
        if line.startswith("Q_"):
            fields = line.split()
            out[fields[0]] = float(fields[column])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "datasets")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=COUNT_ONLY_REPLAY_BATCH,
                    help="updates per batch (default: what `csmd replay --count-only` takes)")
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--backend", default="cpu", help="cpu (compiled) or numpy")
    ap.add_argument("--no-compile-time", action="store_true", help="skip the fresh-cache compile measurement")
    args = ap.parse_args()
    root = args.datasets / "human"
    g0 = read_graph(root / "data.graph")
    stream = root / "insertion.graph"
    updates = sum(1 for line in open(stream) if line.strip())
    rapidflow = read_rapidflow(root / "rapidflow_query_times.txt")
    names = [f"Q_{i}" for i in range(1, args.queries + 1)]
    queries = [(n, read_query(root / "queries" / f"{n}.graph")) for n in names]
    measure(g0, stream, queries[:1], args.batch_size, 1, args.backend)  # numba's cache load is not a query's time
    print(f"human: {g0.n} vertices, {g0.num_edges} edges; stream: {updates} insertions; batch size "
          f"{args.batch_size}; median of {args.runs} runs; engine {args.backend} ({thread_count()} threads), "
          f"count-only, stream decoded beforehand; RapidFlow: 2-core VM, 1 thread")
    print(f"{'query':<8} {'|V(q)|':>6} {'positive':>12} {'csmd s':>8} {'RapidFlow s':>11} {'ratio':>7}")
    total = rf_total = 0.0
    for name, q in queries:
        sec, res = measure(g0, stream, [(name, q)], args.batch_size, args.runs, args.backend)
        total += sec
        rf_total += rapidflow[name]
        print(f"{name:<8} {q.n:>6} {res[0]['positive']:>12} {sec:>8.3f} {rapidflow[name]:>11.4f} "
              f"{sec / rapidflow[name]:>7.1f}", flush=True)
    together, _ = measure(g0, stream, queries, args.batch_size, args.runs, args.backend)
    print(f"{'sum of one-at-a-time runs':<34} {total:>8.3f} s   RapidFlow {rf_total:.3f} s   "
          f"ratio {total / rf_total:.2f}")
    print(f"{f'all {len(queries)} registered at once':<34} {together:>8.3f} s   RapidFlow {rf_total:.3f} s   "
          f"ratio {together / rf_total:.2f}")
    end_to_end, _ = measure(g0, stream, queries, args.batch_size, args.runs, args.backend, in_memory=False)
    print(f"{'all at once, reading the file too':<34} {end_to_end:>8.3f} s   (csmd replay's own seconds)")
    # the fixed cost: a query whose labels no vertex has, so nothing is ever searched
    absent = int(g0.labels.max()) + 1
    nothing = Graph.from_edges([absent, absent + 1], [0], [1])
    for backend in ("numpy", "cpu"):
        sec, _ = measure(g0, stream, [("nothing", nothing)], args.batch_size, args.runs, backend)
        print(f"fixed per-update cost, engine {backend:<6} {sec:>8.3f} s   {sec / updates * 1e6:.1f} us per update")
    if not args.no_compile_time:
        cold, warm = first_use(["replay", "--json", "--backend", "cpu", "--data", str(root / "data.graph"), "--stream",
                                str(stream), "--query", str(root / "queries" / "Q_1.graph")])
        print(f"compiled engine, one-query replay in a fresh process: {cold:.1f} s with an empty numba cache "
              f"(first use: compiles), {warm:.1f} s with it warm")


if __name__ == "__main__":
    main()
