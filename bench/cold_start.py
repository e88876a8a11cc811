"""Cold start: `csmd replay --json` in fresh processes against the same replay warm in-process.

For each engine (cpu; gpu where CuPy sees a device) and batch size (4096, 64): the median over
--runs fresh processes of `setup_seconds` (csmd's code starting to the stream's start: imports,
reading the graph and the queries, the engine and its upload, planning, the warm-up), `seconds`
(the pipeline over the stream file) and the process's wall time (the interpreter's own start and
exit too); then `seconds` of the same replay run --runs more times in this process after a first
one (warm). Human insertion stream, all queries, count-only.

    python bench/cold_start.py [--datasets DIR] [--runs 5] [--queries 100]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from csmd.backends import gpu_unavailable_reason
from csmd.jobs.replay import replay
from csmd.model.formats import read_graph, read_query


def fresh(args: list[str], runs: int) -> tuple[float, float, float]:
    """Medians of (setup_seconds, seconds, wall seconds) of `csmd replay --json args` in fresh processes."""
    setup, secs, wall = [], [], []
    for _ in range(runs):
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-m", "csmd", "replay", "--json", *args], capture_output=True, text=True,
                             check=True).stdout
        wall.append(time.monotonic() - t0)
        res = json.loads(out.splitlines()[0])
        setup.append(res["setup_seconds"])
        secs.append(res["seconds"])
    return statistics.median(setup), statistics.median(secs), statistics.median(wall)


def warm(g0, stream: Path, queries, batch: int, backend: str, runs: int) -> float:
    """Median `seconds` of replay in this process, after a first run."""
    out = []
    for i in range(runs + 1):
        res, _ = replay(g0, stream, queries, batch_size=batch, count_only=True, show_progress=False, backend=backend)
        out.append(res[0]["seconds"])
    return statistics.median(out[1:])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "datasets")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--queries", type=int, default=100)
    args = ap.parse_args()
    root = args.datasets / "human"
    data, stream = root / "data.graph", root / "insertion.graph"
    paths = [root / "queries" / f"Q_{i}.graph" for i in range(1, args.queries + 1)]
    g0 = read_graph(data)
    queries = [(p.stem, read_query(p)) for p in paths]
    backends = ["cpu"] + ([] if gpu_unavailable_reason() else ["gpu"])
    print(f"human stream, {len(queries)} queries, count-only; fresh: median of {args.runs} processes; "
          f"warm: median of {args.runs} in-process runs after a first")
    print(f"{'engine':<6} {'batch':>6} {'fresh setup_s':>14} {'fresh seconds':>14} {'fresh wall':>11} "
          f"{'warm seconds':>13} {'fresh/warm':>11}")
    for backend in backends:
        for batch in (4096, 64):
            cli = ["--count-only", "--backend", backend, "--batch-size", str(batch), "--data", str(data),
                   "--stream", str(stream), "--query", *map(str, paths)]
            setup, cold, wall = fresh(cli, args.runs)
            hot = warm(g0, stream, queries, batch, backend, args.runs)
            print(f"{backend:<6} {batch:>6} {setup:>14.3f} {cold:>14.4f} {wall:>11.3f} {hot:>13.4f} "
                  f"{cold / hot:>11.2f}", flush=True)


if __name__ == "__main__":
    main()
