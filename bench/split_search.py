"""What splitting a batch's search over instances costs the search itself: the compiled
engine's search CPU seconds summed over n cluster members' shares, against one instance's.

bench/cluster.py's instances ran 17% more search CPU together than one instance alone
(human, 4 instances, one thread each). This takes the daemon out. By default it takes the
machine out too: one process, one thread, the members' shares searched one after the other
on the same graph, as the daemon selects them (pipeline/shards.py's ShardWork: n members of
12 shards, each (record, query) to its shard's owner). What is left over 1.00 is the split's
own cost: a record's ops are searched by every member owning one of its queries, and each
pays the first reads of the ops' neighbourhoods that one instance pays once.

--concurrent puts the machine back, without the daemon: one process per member, each with
its own copy of the graph (as instances have), searching its share at the same time as the
others; `busiest member` is the most search CPU a member took, `slowest member` the longest
wall time a member took (its share's selection, its searches and their results), and
`bound` one instance's wall time over the slowest member's: the speed-up n instances could reach if nothing but the
search ran. What the daemon's instances lose beyond that is their own (the pipeline's
threads beside the search, the shards' bookkeeping); what this loses against n, the
machine's (cores shared by hyperthreads, memory, the hypervisor).

    python bench/split_search.py [--datasets DIR] [--workload human] [--batches 4] [--runs 7] [--concurrent]

The stream is bench/cluster.py's (--per-record updates to a record, as there); --batches
batches of 16384 updates are applied, then searched; the instance counts take turns, run by
run (a host's drift hits them alike). Prints the median of --runs runs.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from cluster import human_workload, queries_of, yeast_workload

from csmd.cpu.compiled import CompiledEngine
from csmd.jobs.replay import read_stream
from csmd.model.formats import UpdateBlock, read_graph, read_query
from csmd.pipeline.queries import continuous_query
from csmd.pipeline.sequencer import Sequencer, Vertices
from csmd.pipeline.shards import ShardWork
from csmd.testing.streams import in_rounds

BATCH = 16384
SHARDS = 12
COUNTS = (1, 2, 4)


class Member:
    """An engine with the stream's batches applied and its queries registered, that searches a member's share."""

    def __init__(self, datasets: Path, workload: str, per_record: int, batches: int):
        with tempfile.TemporaryDirectory() as tmp:
            make = {"human": human_workload, "yeast": yeast_workload}[workload]
            w = make(datasets, Path(tmp), 1)
            w = w._replace(lines=in_rounds(w.lines, -(-batches * BATCH // len(w.lines))))
            stream = Path(tmp) / "stream.txt"
            stream.write_text("\n".join(w.lines) + "\n")
            whole = read_stream(stream)
            g0 = read_graph(w.graph)  # yeast's is made in tmp
        assert all(isinstance(b, UpdateBlock) for b in whole), "edge lines only: one block of columns"
        block = UpdateBlock.concat(whole).rows(0, batches * BATCH)
        # each row's record as the cluster's input would have it: per_record lines a record, their
        # offsets the block's line numbers (the daemon's batches are cut from such blocks)
        block = replace(block, lineno=np.arange(len(block), dtype=np.int64) // per_record, cut_from=None)
        self.engine = CompiledEngine(g0, threads=1)
        sequencer = Sequencer(Vertices(g0), self.engine)
        self.registered = [(cq, self.engine.prepare(cq)) for cq in (
            continuous_query(f.stem, read_query(f), sequencer.vertices.labels, True) for f in queries_of(w))]
        self.batches = []
        for i in range(0, len(block), BATCH):
            batch = sequencer.sequence(block.rows(i, i + BATCH), np.zeros(min(BATCH, len(block) - i)))
            self.engine.apply(batch)
            self.batches.append(batch)
        self.searched = 0.0
        plain, member = CompiledEngine._match, self

        def timed(engine, *a):  # the search's own CPU, as bench/stage_timers.py's `search`
            t0 = time.thread_time()
            try:
                return plain(engine, *a)
            finally:
                member.searched += time.thread_time() - t0

        CompiledEngine._match = timed

    def search(self, n: int, member: int) -> tuple[float, float]:
        """Search member `member` of n's share of every batch: (search CPU s, wall s)."""
        self.searched, t0 = 0.0, time.perf_counter()
        work = ShardWork(SHARDS, 0, 0)
        work.owned = {s: 0 for s in range(SHARDS) if s % n == member}
        for batch in self.batches:
            part = work.select(batch, self.registered)
            if part is not None:
                self.engine.submit(part.work, [pq for _cq, pq in part.queries], part.edges).result()
        return self.searched, time.perf_counter() - t0

    def sizes(self) -> tuple[int, int]:
        """(updates, queries)"""
        return sum(len(b.edge_seq) for b in self.batches), len(self.registered)


def serve(conn, *setup) -> None:
    """A concurrent member's process: set up, then search the share each (n, member) sent names."""
    m = Member(*setup)
    conn.send(m.sizes())
    while (job := conn.recv()) is not None:
        conn.send(m.search(*job))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "datasets")
    ap.add_argument("--workload", choices=("human", "yeast"), default="human")
    ap.add_argument("--per-record", type=int, default=64, help="updates per input record (bench/cluster.py's)")
    ap.add_argument("--batches", type=int, default=4)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--concurrent", action="store_true", help="each member in its own process, all at once")
    args = ap.parse_args()
    setup = (args.datasets, args.workload, args.per_record, args.batches)
    if args.concurrent:
        ctx = mp.get_context("spawn")
        pipes = [ctx.Pipe() for _ in range(max(COUNTS))]
        procs = [ctx.Process(target=serve, args=(child, *setup), daemon=True) for _parent, child in pipes]
        for p in procs:
            p.start()
        ops, queries = [parent.recv() for parent, _ in pipes][0]

        def run(n: int) -> list[tuple[float, float]]:
            for member in range(n):
                pipes[member][0].send((n, member))
            return [pipes[member][0].recv() for member in range(n)]
    else:
        local = Member(*setup)
        ops, queries = local.sizes()

        def run(n: int) -> list[tuple[float, float]]:
            return [local.search(n, member) for member in range(n)]

    results: dict[int, list[list[tuple[float, float]]]] = {n: [] for n in COUNTS}
    for _ in range(args.runs + 1):  # the first run warms up (compiles, caches) and is dropped
        for n in COUNTS:
            results[n].append(run(n))
    if args.concurrent:
        for parent, _ in pipes:
            parent.send(None)
    where = "one process per member, at once" if args.concurrent else "one process, the members in turn"
    print(f"{args.workload}: {ops} updates in {args.batches} batches, {queries} queries, {args.per_record} updates a "
          f"record, {SHARDS} shards, 1 thread; {where}; median of {args.runs} runs\n")
    cpu = {n: [sum(c for c, _ in r) for r in results[n][1:]] for n in COUNTS}
    busiest = {n: [max(c for c, _ in r) for r in results[n][1:]] for n in COUNTS}
    slowest = {n: [max(w for _, w in r) for r in results[n][1:]] for n in COUNTS}
    print(f"{'instances':>9} {'search CPU s, all members':>26} {'over one':>9} {'busiest member':>15}"
          + (f" {'slowest member s':>17} {'bound':>6}" if args.concurrent else ""))
    for n in COUNTS:
        over = statistics.median(x / y for x, y in zip(cpu[n], cpu[1]))
        line = f"{n:>9} {statistics.median(cpu[n]):>26.3f} {over:>8.3f}x {statistics.median(busiest[n]):>15.3f}"
        if args.concurrent:
            bound = statistics.median(y / x for x, y in zip(slowest[n], slowest[1]))
            line += f" {statistics.median(slowest[n]):>17.3f} {bound:>5.2f}x"
        print(line)

if __name__ == "__main__":
    main()
