"""What the machine's cores give the compiled engine's search: the yeast stream of
bench/cluster.py replayed (`csmd replay`, count-only, --backend cpu) by P concurrent
processes of T threads each, every process doing the whole stream.

bench/cluster.py's instances run side by side on one machine; this says how much of that
machine a search gets when they do, without Kafka or a split. On perfect hardware P
processes of one thread would each take as long as one alone, and 16 threads in one
process would be 16 times faster than one. The `slower` column is each configuration's
seconds per process over those of one process with the same threads alone; `work rate`
is the stream's matching done per second by all the processes together, over that of one
process with one thread.

    python bench/core_scaling.py [--rounds 4] [--runs 3] [--configs 1x1 1x4 16x1 ...]

Prints the median of --runs runs (the slowest process of each run; `seconds` as replay
reports it: the pipeline, not the process start).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from cluster import replay_command, replay_seconds, yeast_workload

DEFAULT_CONFIGS = ["1x1", "1x4", "1x8", "1x16", "2x4", "4x4", "16x1"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--datasets", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "datasets")
    ap.add_argument("--rounds", type=int, default=4, help="yeast stream rounds, as bench/cluster.py's")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS, help="PROCESSESxTHREADS")
    args = ap.parse_args()
    configs = [tuple(int(x) for x in c.lower().split("x")) for c in args.configs]
    with tempfile.TemporaryDirectory() as tmp:
        w = yeast_workload(args.datasets, Path(tmp), args.rounds)
        cmd = replay_command(w, Path(tmp))
        replay_seconds(cmd, 1, 1)  # numba's on-disk cache
        seconds = {}
        for p, t in configs:
            seconds[p, t] = statistics.median(replay_seconds(cmd, p, t) for _ in range(args.runs))
            print(f"{p} x {t}: {seconds[p, t]:.2f} s", file=sys.stderr)
    print(f"\nyeast: {len(w.lines)} updates, {len(w.queries)} queries; {os.cpu_count()} cores; median of {args.runs} runs\n")
    print(f"{'processes':>9} {'threads':>7} {'seconds':>8} {'slower':>7} {'work rate':>9}")
    one = seconds.get((1, 1))
    for (p, t), s in seconds.items():
        alone = seconds.get((1, t))
        slower = f"{s / alone:6.2f}x" if alone and p > 1 else ""
        rate = f"{p * one / s:8.2f}x" if one else ""
        print(f"{p:9d} {t:7d} {s:8.2f} {slower:>7} {rate:>9}")


if __name__ == "__main__":
    main()
