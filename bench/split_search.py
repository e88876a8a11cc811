"""What splitting a batch's search over instances costs the search itself: the compiled
engine's search CPU seconds summed over n cluster members' shares, against one instance's.

bench/cluster.py's instances ran 17% more search CPU together than one instance alone
(human, 4 instances, one thread each). This takes the machine out: one process, one
thread, the members' shares searched one after the other on the same graph, as the daemon
selects them (pipeline/shards.py's ShardWork: n members of 12 shards, each (record, query)
to its shard's owner). What is left over 1.00 is the split's own cost: a record's ops are
searched by every member owning one of its queries, and each pays the first reads of the
ops' neighbourhoods that one instance pays once.

    python bench/split_search.py [--datasets DIR] [--workload human] [--batches 4] [--runs 7]

The stream is bench/cluster.py's (--per-record updates to a record, as there); --batches
batches of 16384 updates are applied, then searched; the instance counts take turns, run by
run (a host's drift hits them alike). Prints the median of --runs runs.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from cluster import human_workload, in_rounds, queries_of, yeast_workload

from csmd.cpu.compiled import CompiledEngine
from csmd.model.formats import Update, read_graph, read_query
from csmd.cli.replay import decoded_updates
from csmd.pipeline.queries import continuous_query
from csmd.pipeline.sequencer import Sequencer, Vertices
from csmd.pipeline.shards import ShardWork

BATCH = 16384
SHARDS = 12


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "datasets")
    ap.add_argument("--workload", choices=("human", "yeast"), default="human")
    ap.add_argument("--per-record", type=int, default=64, help="updates per input record (bench/cluster.py's)")
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        make = {"human": human_workload, "yeast": yeast_workload}[args.workload]
        w = make(args.datasets, Path(tmp), 1)
        w = w._replace(lines=in_rounds(w.lines, -(-args.batches * BATCH // len(w.lines))))
        stream = Path(tmp) / "stream.txt"
        stream.write_text("\n".join(w.lines) + "\n")
        updates = list(decoded_updates(stream))[: args.batches * BATCH]
        g0 = read_graph(w.graph)  # yeast's is made in tmp
    engine = CompiledEngine(g0, threads=1)
    sequencer = Sequencer(Vertices(g0), engine)
    registered = [(cq, engine.prepare(cq)) for cq in (
        continuous_query(f.stem, read_query(f), sequencer.vertices.labels, True) for f in queries_of(w))]
    batches = []
    for i in range(0, len(updates), BATCH):
        batch = sequencer.sequence(updates[i:i + BATCH], np.zeros(len(updates[i:i + BATCH])))
        engine.apply(batch)
        # the record of each update as the cluster's input would have it: per_record lines a record
        batch.record_of = {s: Update("e", 0, 0, 0, "", ("stream", 0, s // args.per_record))
                           for s in range(batch.first_seq, batch.end_seq)}
        batches.append(batch)
    searched = {"t": 0.0}
    plain = CompiledEngine._match

    def timed(self, *a):  # the search's own CPU, as bench/stage_timers.py's `search`
        t0 = time.thread_time()
        try:
            return plain(self, *a)
        finally:
            searched["t"] += time.thread_time() - t0

    CompiledEngine._match = timed
    counts = (1, 2, 4)
    seconds: dict[int, list[float]] = {n: [] for n in counts}
    for _ in range(args.runs + 1):  # the first run warms up (compiles, caches) and is dropped
        for n in counts:
            searched["t"] = 0.0
            for member in range(n):
                work = ShardWork(SHARDS, 0, 0)
                work.owned = {s: 0 for s in range(SHARDS) if s % n == member}
                for batch in batches:
                    part = work.select(batch, registered)
                    if part is not None:
                        engine.submit(part.work, [pq for _cq, pq in part.queries], part.edges).result()
            seconds[n].append(searched["t"])
    ops = sum(len(b.edge_seq) for b in batches)
    print(f"{args.workload}: {ops} updates in {len(batches)} batches, {len(registered)} queries, "
          f"{args.per_record} updates a record, {SHARDS} shards, 1 thread; median of {args.runs} runs\n")
    print(f"{'instances':>9} {'search CPU s, all members':>26} {'over one':>9}")
    for n in counts:
        over = statistics.median(x / y for x, y in zip(seconds[n][1:], seconds[1][1:]))
        print(f"{n:>9} {statistics.median(seconds[n][1:]):>26.3f} {over:>8.3f}x")


if __name__ == "__main__":
    main()
