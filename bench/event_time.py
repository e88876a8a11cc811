"""What event time costs: the human stream with every query, untimed against timed, with and without a window.

The human insertion stream is given event times (update k has ts k + 1) and replayed
count-only with all its queries registered at once, in four modes: untimed (`csmd replay`
as without event time), timed with no window (the ts read and kept, nothing expires), and
windows of 1,000 and 100 updates (the edges that fall out expire: the stream grows by
their deletions). Per mode and batch size: replay's `seconds` (the pipeline over the
stream read from its file as it goes: a timed stream's lines are decoded one by one, an
untimed one's in the compiled pass), the median of --runs runs in this process, the
updates (sequence numbers: records plus expiries) and updates per second; and of those
seconds, the sequencer's (numbering, the clock, the ops: the host's work per batch that
event time adds to, whatever the engine).

    python bench/event_time.py [--datasets DIR] [--runs 3] [--batch-sizes 64,4096] [--backend cpu]
"""

from __future__ import annotations

import argparse
from contextlib import contextmanager
import os
import statistics
import tempfile
import time
from pathlib import Path

from csmd.jobs.replay import replay
from csmd.model.formats import query_files, read_graph, read_query
from csmd.pipeline.event_time import EventTime
from csmd.pipeline.sequencer import Sequencer

MODES = {"untimed": None, "timed, no window": EventTime(None), "window 1000": EventTime(1000),
         "window 100": EventTime(100)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "datasets")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch-sizes", default="64,4096")
    ap.add_argument("--backend", default="cpu")
    args = ap.parse_args()
    human = args.datasets / "human"
    g0 = read_graph(human / "data.graph")
    queries = [(p.stem, read_query(p)) for p in query_files([human / "queries"])]
    plain = human / "insertion.graph"
    with tempfile.TemporaryDirectory() as tmp:
        timed = Path(tmp) / "timed.txt"
        timed.write_text("".join(f"{line.rstrip()} {k + 1}\n" for k, line in enumerate(plain.read_text().splitlines())))
        print(f"human: {g0.num_edges} edges, {len(plain.read_text().splitlines())} insertions, {len(queries)} queries "
              f"at once, count-only; {args.backend} engine, {os.cpu_count()} cores; median of {args.runs}")
        print(f"{'mode':<18} {'batch':>6} {'seconds':>8} {'updates':>8} {'updates/s':>10} {'expired':>8} "
              f"{'sequencer s':>11}")
        for bs in map(int, args.batch_sizes.split(",")):
            for name, spec in MODES.items():
                runs = []
                for _ in range(args.runs):
                    with sequencer_seconds() as spent:
                        runs.append(replay(g0, plain if spec is None else timed, queries, batch_size=bs,
                                           count_only=True, show_progress=False, backend=args.backend,
                                           event_time=spec)[0][0] | {"sequencer": spent})
                sec = statistics.median(r["seconds"] for r in runs)
                print(f"{name:<18} {bs:>6} {sec:>8.3f} {runs[0]['updates']:>8} {runs[0]['updates'] / sec:>10,.0f} "
                      f"{runs[0].get('expired', '-'):>8} {statistics.median(r['sequencer'][0] for r in runs):>11.3f}",
                      flush=True)


@contextmanager
def sequencer_seconds():
    """A list whose one element adds up the seconds spent in Sequencer.sequence meanwhile."""
    spent, sequence = [0.0], Sequencer.sequence

    def timed(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return sequence(self, *args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t0

    Sequencer.sequence = timed
    try:
        yield spent
    finally:
        Sequencer.sequence = sequence


if __name__ == "__main__":
    main()
