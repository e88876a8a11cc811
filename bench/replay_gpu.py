"""Continuous matching on the GPU engine: the human insertion stream against RapidFlow, and the fixed cost.

Parts (--parts, comma-separated):
  human   Q_1..Q_N count-only over the human insertion stream: each query alone and all
          registered at once, median of --runs runs of the pipeline on updates decoded
          beforehand (sequencing, GU, EX, GC and the canonical delta order: what RapidFlow's
          query time covers, which excludes loading), beside RapidFlow's query time on the
          CPU of a device machine (rapidflow_query_times.txt, second column); and the
          end-to-end `csmd replay` time of all queries (parsing included). Counts are
          checked against expected_insert_counts.txt where it has them, and against the
          CPU engine for the rest when --check-cpu is given.
  latency response time (a record's arrival at the batcher to its deltas ready, p50 and
          p99) of Q_1..Q_40 registered together, the updates paced at --rate per second
          and at the maximum rate (all available at once), per batch size; the
          throughput at the maximum rate; and the GPU busy share (nvidia-smi's utilization:
          the share of time a kernel ran, sampled every 50 ms). Each run again with batches
          that grow up to --max-batch while the executor is behind (the daemon's default).
  floor   the fixed cost: a query whose labels match nothing (no candidates, no search)
          and a one-edge query (every seed a match, no search), per update and per batch,
          for several batch sizes.

    python bench/replay_gpu.py [--datasets DIR] [--parts human,latency,floor] [--runs 3] [--queries 100]
                               [--batch-size 4096] [--rate 1000] [--max-batch 4096] [--backend gpu]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from csmd.backends import continuous_engine
from csmd.jobs import COUNT_ONLY_REPLAY_BATCH
from csmd.jobs.replay import decoded_updates, read_stream, replay
from csmd.model.formats import UpdateBlock, read_graph, read_query
from csmd.model.graph import Graph
from csmd.pipeline.stages import Pipeline

from replay import DEVICE_CPU, read_rapidflow


def decoded(stream: Path) -> list:
    """The stream one Update a record: what a paced source hands the batcher."""
    return list(decoded_updates(stream))


def blocks(stream: Path) -> tuple[list, int]:
    """The stream as `csmd replay` reads it (column blocks, cut into batches without a step
    per record), decoded beforehand, and its number of updates."""
    items = read_stream(stream)
    return items, sum(len(x) if isinstance(x, UpdateBlock) else 1 for x in items)


POLL = 0.00005  # seconds: how long the paced source waits between its polls (each None closes a forming batch)


def paced(updates: list, rate: float, due: list):
    """The updates at `rate` a second (None while none is due, so that a partial batch closes
    on time, as a polling source does); rate 0: all at once. `due` receives each update's
    arrival time (monotonic): when it was due, however late the pipeline took it."""
    t0 = time.monotonic()
    for i, u in enumerate(updates):
        due.append(t0 + i / rate if rate else t0)
        while (now := time.monotonic()) < due[-1]:
            time.sleep(min(due[-1] - now, POLL))
            yield None
        yield u


def timed(g0, updates: list, queries, batch_size, runs, backend="gpu", rate=0.0, max_batch=None):
    """(median seconds, {query: positive}, stats, response times) of `runs` pipeline runs over
    decoded updates; response time per update: from its arrival (due time) to its batch's
    matches being ready."""
    out = []
    for _ in range(runs):
        pipe = Pipeline(g0, engine=continuous_engine(backend, g0), batch_size=batch_size, max_batch=max_batch)
        for name, q in queries:
            pipe.add_query(name, q, True)
        totals = dict.fromkeys((n for n, _ in queries), 0)
        due, response = [], []

        def on_result(result):
            for d in result.deltas:
                totals[d.name] += d.positive
            at = len(response)  # one record is one update here
            response.extend(result.done - t for t in due[at: at + result.batch.records])

        t0 = time.perf_counter()
        stats = pipe.run(paced(updates, rate, due), on_result)
        sec = time.perf_counter() - t0
        pipe.engine.close()
        out.append((sec, totals, stats, np.array(response)))
    out.sort(key=lambda r: r[0])
    return out[len(out) // 2]


@contextmanager
def gpu_busy():
    """Yields a list that receives the device's mean utilization (%) over the block: the share of
    time a kernel was running, sampled by nvidia-smi every 50 ms; empty without nvidia-smi."""
    out: list[float] = []
    smi = shutil.which("nvidia-smi")
    if smi is None:
        yield out
        return
    proc = subprocess.Popen([smi, "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "50", "-i", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        yield out
    finally:
        proc.terminate()
        samples = [float(x) for x in proc.communicate()[0].split() if x.strip().replace(".", "").isdigit()]
        if samples:
            out.append(sum(samples) / len(samples))


def expected_counts(path: Path) -> dict[str, int]:
    return {k.strip(): int(v) for k, v in (line.split(":") for line in path.read_text().splitlines() if line.strip())}


def part_human(args, root: Path) -> None:
    g0 = read_graph(root / "data.graph")
    stream = root / "insertion.graph"
    upd, updates = blocks(stream)
    rf = read_rapidflow(root / "rapidflow_query_times.txt", DEVICE_CPU)
    expected = expected_counts(root / "expected_insert_counts.txt")
    names = [f"Q_{i}" for i in range(1, args.queries + 1)]
    queries = [(n, read_query(root / "queries" / f"{n}.graph")) for n in names]
    timed(g0, upd, queries[:1], args.batch_size, 1, args.backend)  # compile and load the kernels
    print(f"\nhuman: {g0.n} vertices, {g0.num_edges} edges; {updates} insertions; batch size {args.batch_size}; "
          f"count-only; median of {args.runs} runs")
    print(f"{'query':<6} {'|V|':>3} {'matches':>12} {args.backend + ' s':>8} {'RapidFlow s':>11} {'speed-up':>8} {'check':>6}")
    total, bad = 0.0, []
    for name, q in queries:
        sec, res, _, _ = timed(g0, upd, [(name, q)], args.batch_size, args.runs, args.backend)
        total += sec
        got = res[name]
        if name in expected:
            ok = "exp" if got == expected[name] else "WRONG"
        elif args.check_cpu:
            cpu = replay(g0, stream, [(name, q)], batch_size=args.batch_size, count_only=True, show_progress=False,
                         backend="cpu")[0][0]["positive"]
            ok = "cpu" if got == cpu else "WRONG"
        else:
            ok = "-"
        if ok == "WRONG":
            bad.append(name)
        print(f"{name:<6} {q.n:>3} {got:>12} {sec:>8.4f} {rf[name]:>11.6f} {rf[name] / sec:>7.2f}x {ok:>6}", flush=True)
    sec, res, stats, _ = timed(g0, upd, queries, args.batch_size, args.runs, args.backend)
    e2e = sorted(replay(g0, stream, queries, batch_size=args.batch_size, count_only=True, show_progress=False,
                        backend=args.backend)[0][0]["seconds"] for _ in range(args.runs))[args.runs // 2]
    rf_total = sum(rf[n] for n in names)
    heavy = [n for n in names if rf[n] > 0.010]
    print(f"sum of one-at-a-time runs: {total:.3f} s; RapidFlow sum {rf_total:.3f} s")
    print(f"all {len(names)} registered at once: {sec:.3f} s ({updates / sec:,.0f} updates/s); "
          f"RapidFlow / csmd = {rf_total / sec:.2f}x; GU ahead of EX by up to {stats.max_ahead} batches")
    print(f"all {len(names)} at once, csmd replay end to end (parsing included): {e2e:.3f} s")
    print(f"queries RapidFlow needs > 10 ms for: {', '.join(heavy)}")
    print(f"count mismatches: {bad or 'none'}")


def part_floor(args, root: Path) -> None:
    g0 = read_graph(root / "data.graph")
    upd, updates = blocks(root / "insertion.graph")
    absent = int(np.max(g0.labels)) + 1
    none = Graph.from_edges(np.array([absent, absent, absent]), np.array([0, 1]), np.array([1, 2]))
    edge_labels = np.bincount(g0.labels).argsort()[-1:]
    one_edge = Graph.from_edges(np.array([edge_labels[0], edge_labels[0]]), np.array([0]), np.array([1]))
    print(f"\nfixed cost: {updates} updates; median of {args.runs} runs")
    print(f"{'query':<26} {'batch':>6} {'batches':>7} {'seconds':>8} {'us/update':>10} {'us/batch':>9}")
    for label, q in (("no candidates", none), ("one edge (no search)", one_edge)):
        for b in (1, 8, 64, 512, 4096):
            runs = 1 if b == 1 else args.runs
            sec, _, _, _ = timed(g0, upd, [("q", q)], b, runs, args.backend)
            nb = -(-updates // b)
            print(f"{label:<26} {b:>6} {nb:>7} {sec:>8.4f} {sec / updates * 1e6:>10.1f} {sec / nb * 1e6:>9.1f}",
                  flush=True)


def part_latency(args, root: Path) -> None:
    g0 = read_graph(root / "data.graph")
    upd = decoded(root / "insertion.graph")
    queries = [(f"Q_{i}", read_query(root / "queries" / f"Q_{i}.graph")) for i in range(1, 41)]
    print(f"\nresponse time: {len(upd)} insertions, Q_1..Q_40 count-only, one run each; max batch: the most records "
          f"a batch takes while the executor is behind ([pipeline] max_batch; '-': batches stay at the batch size); "
          f"p50/p99: from an update's due time when paced, from the batcher taking it at the maximum rate; inline: "
          f"batches whose stages all ran on the updater's thread")
    print(f"{'rate':>10} {'batch':>6} {'max batch':>9} {'largest':>7} {'inline':>7} {'seconds':>8} {'updates/s':>10} "
          f"{'p50 ms':>8} {'p99 ms':>8} {'GPU busy':>8}")
    timed(g0, upd, queries, 1, 1, args.backend, 0.0, args.max_batch)  # compile every kernel the table's runs use
    runs = [(rate, b, None) for rate in (args.rate, 0.0) for b in (1, 8, 64, 512)]
    runs += [(rate, b, args.max_batch) for rate in (args.rate, 0.0) for b in (1, 8, 64, 512)]
    for rate, b, grow in runs:
        with gpu_busy() as busy:
            sec, _, stats, response = timed(g0, upd, queries, b, 1, args.backend, rate, grow)
        if rate:
            p50, p99 = np.quantile(response, [0.5, 0.99])
        else:
            p50, p99 = stats.latency.quantile(0.5), stats.latency.quantile(0.99)
        share = f"{busy[0]:.0f}%" if busy else "-"
        print(f"{rate or 'max':>10} {b:>6} {grow or '-':>9} {stats.largest:>7} {stats.inline:>7} {sec:>8.3f} "
              f"{len(upd) / sec:>10,.0f} {p50 * 1e3:>8.2f} {p99 * 1e3:>8.2f} {share:>8}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "datasets")
    ap.add_argument("--parts", default="human,latency,floor")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=COUNT_ONLY_REPLAY_BATCH, help="the human part's (csmd replay --count-only's default)")
    ap.add_argument("--backend", default="gpu", help="the engine timed (cpu: the same table on the CPU engine)")
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--rate", type=float, default=1000.0, help="paced updates a second (latency)")
    ap.add_argument("--max-batch", type=int, default=4096, help="the grown batches' limit of the latency part's second half")
    ap.add_argument("--check-cpu", action="store_true", help="check counts without an expected value on the CPU engine")
    args = ap.parse_args()
    root = args.datasets / "human"
    parts = {"human": part_human, "latency": part_latency, "floor": part_floor}
    for p in args.parts.split(","):
        parts[p](args, root)


if __name__ == "__main__":
    main()
