"""How evenly shards split a stream's matching: the speed-up bound of 2 and 4 instances, by record or by (record, query).

Matches bench/cluster.py's stream (--workload, --rounds) one record at a time on the
compiled engine with one thread, timing each (record, query) search alone; then deals
the work out as a cluster would: each record to the shard its hash names, or each
(record, query) to the daemon's shard for it (pipeline/shards.py: the record's hash
shifted by the query's), the 12 shards evenly over the instances. The bound is the total over
the busiest instance's share (the replicated part and the per-batch costs left out).
Each trial places the stream elsewhere in the topic (offsets shifted, so other hashes)
and deals the shards out by another even map: the median, the 10th percentile and the
worst of --trials trials.

    python bench/shard_balance.py [--datasets DIR] [--workload yeast] [--rounds 4] [--trials 30]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ["CSMD_THREADS"] = "1"  # one search at a time, each timed alone

from cluster import SHARDS, human_workload, queries_of, yeast_workload  # noqa: E402

from csmd.backends import continuous_engine  # noqa: E402
from csmd.jobs.replay import decoded_updates  # noqa: E402
from csmd.model.formats import read_graph, read_query  # noqa: E402
from csmd.pipeline.queries import continuous_query  # noqa: E402
from csmd.pipeline.sequencer import Sequencer, Vertices  # noqa: E402
from csmd.pipeline.shards import record_hash, shard_of  # noqa: E402


def costs(w, root: Path) -> tuple[np.ndarray, list[str]]:
    """Seconds of each (record, query) search, each record applied alone before its searches."""
    g0 = read_graph(w.graph)
    engine = continuous_engine("cpu", g0)
    vertices = Vertices(g0)
    sequencer = Sequencer(vertices, engine, 0)
    files = queries_of(w)
    prepared = [engine.prepare(continuous_query(f.stem, read_query(f), vertices.labels, True)) for f in files]
    stream = root / "stream.txt"
    stream.write_text("\n".join(w.lines) + "\n")
    updates = list(decoded_updates(stream))
    out = np.zeros((len(updates), len(prepared)))
    for i, u in enumerate(updates):
        batch = sequencer.sequence([u], [0.0])
        engine.apply(batch)
        for j, pq in enumerate(prepared):
            t0 = time.perf_counter()
            engine.submit(batch, [pq]).result()
            out[i, j] = time.perf_counter() - t0
    return out, [f.stem for f in files]


def bounds(cost: np.ndarray, names: list[str], n: int, trials: int) -> dict[str, list[float]]:
    """Speed-up bounds of n instances, by unit, one per trial."""
    rng = np.random.default_rng(n)
    total = cost.sum()
    out = {"record": [], "(record, query)": []}
    for trial in range(trials):
        offsets = np.arange(len(cost)) + trial * 1_000_003
        owner = rng.permutation(SHARDS) % n  # shard -> instance, evenly
        busy = np.bincount(owner[record_hash(0, offsets, SHARDS)], cost.sum(1), n)
        out["record"].append(total / busy.max())
        shard = np.stack([shard_of(0, offsets, SHARDS, q) for q in names], axis=1)  # the daemon's split
        busy = np.bincount(owner[shard].ravel(), cost.ravel(), n)
        out["(record, query)"].append(total / busy.max())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "datasets")
    ap.add_argument("--workload", choices=("human", "yeast"), default="yeast")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--trials", type=int, default=30)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        make = {"human": human_workload, "yeast": yeast_workload}[args.workload]
        w = make(args.datasets, Path(tmp), args.rounds)
        cost, names = costs(w, Path(tmp))
    total, per_record = cost.sum(), np.sort(cost.sum(1))[::-1]
    share = cost.sum(0) / total
    print(f"{args.workload}, {args.rounds} rounds: {cost.shape[0]} records x {cost.shape[1]} queries, "
          f"{total:.2f} s of searches (one record and query at a time, 1 thread)")
    print(f"heaviest record {per_record[0]:.3f} s; the 10 heaviest {per_record[:10].sum() / total:.0%} of the "
          f"total; heaviest (record, query) {cost.max():.3f} s")
    print("heaviest queries: " + ", ".join(f"{names[j]} {share[j]:.0%}" for j in np.argsort(share)[::-1][:3]))
    print(f"\n{'instances':>9} {'unit':>16} {'median':>7} {'p10':>6} {'worst':>6}   (speed-up bound, {args.trials} trials)")
    for n in (2, 4):
        for unit, b in bounds(cost, names, n, args.trials).items():
            print(f"{n:>9} {unit:>16} {np.median(b):>6.2f}x {np.percentile(b, 10):>5.2f}x {min(b):>5.2f}x")


if __name__ == "__main__":
    main()
