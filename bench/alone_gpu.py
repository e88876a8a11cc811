"""Human queries alone on the GPU engine, as `replay_gpu.py --parts human` times them (count-only,
the threaded pipeline over the decoded insertion stream, a fresh engine per run), with where
the time goes: a timeline of one run's stages (sequencing, apply, seeds, search, output; ms
from the start of the run, per thread) and the apply's device time (the stream synchronized
after it, in separate runs). --once: one run of the first query and nothing else (for ncu).
--profile FILE: cProfile of the engine's apply and submit calls of one inline run of the first
query (host time by function: CuPy calls, launches, read-backs), written to FILE.

    python bench/alone_gpu.py [--datasets .data] [--queries 72,74,18] [--runs 5] [--once] [--profile FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import threading
import time
from pathlib import Path

from csmd.backends import continuous_engine
from csmd.jobs.replay import read_stream
from csmd.model.formats import read_graph, read_query
from csmd.pipeline.stages import Pipeline

from replay_gpu import expected_counts

BATCH = 4096


def run(g0, items, name, q, spans=None, sync_apply=False):
    """(seconds, matches) of one pipeline run; spans (a list) receives (thread, stage, start, end) in s."""
    eng = continuous_engine("gpu", g0)
    pipe = Pipeline(g0, engine=eng, batch_size=BATCH)
    pipe.add_query(name, q, True)
    total = [0]
    t0 = [0.0]

    def timed(stage, f, after=None):
        def w(*a, **k):
            t = time.perf_counter()
            r = f(*a, **k)
            if after:
                after()
            if spans is not None:
                spans.append((threading.current_thread().name, stage, t - t0[0], time.perf_counter() - t0[0]))
            return r
        return w

    if spans is not None or sync_apply:
        seq, mvg = pipe.sequencer, eng.mvg
        seq.sequence = timed("sequence", seq.sequence)
        eng.apply = timed("apply", eng.apply, mvg.stream.synchronize if sync_apply else None)
        mvg._allocated = timed("apply read-back", mvg._allocated)
        eng.submit = timed("submit", eng.submit)
        ex = eng.executor
        ex._search = timed("search", ex._search)
        pipe._deltas = timed("deltas", pipe._deltas)

    def on_result(result):
        for d in result.deltas:
            total[0] += d.positive

    t0[0] = time.perf_counter()
    pipe.run(iter(items), on_result)
    sec = time.perf_counter() - t0[0]
    eng.close()
    return sec, total[0]


def profile(g0, items, name, q, path: Path) -> None:
    """cProfile of apply and submit (each stage apart) over one inline run."""
    eng = continuous_engine("gpu", g0)
    pipe = Pipeline(g0, engine=eng, batch_size=BATCH, threaded=False)
    pipe.add_query(name, q, True)
    prof = {"apply": cProfile.Profile(), "submit": cProfile.Profile()}

    def profiled(stage, f):
        def w(*a, **k):
            prof[stage].enable()
            try:
                return f(*a, **k)
            finally:
                prof[stage].disable()
        return w

    eng.apply, eng.submit = profiled("apply", eng.apply), profiled("submit", eng.submit)
    pipe.run(iter(items), lambda r: None)
    eng.close()
    out = io.StringIO()
    for stage, pr in prof.items():
        out.write(f"===== {name} {stage}\n")
        pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(30)
    path.write_text(out.getvalue())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--datasets", type=Path, default=Path(".data"))
    ap.add_argument("--queries", default="72,74,18")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--once", action="store_true")
    ap.add_argument("--profile", type=Path)
    args = ap.parse_args()
    root = args.datasets / "human"
    g0 = read_graph(root / "data.graph")
    items = read_stream(root / "insertion.graph")
    exp = expected_counts(root / "expected_insert_counts.txt")
    names = [f"Q_{x}" for x in args.queries.split(",")]
    qs = {n: read_query(root / "queries" / f"{n}.graph") for n in names}
    run(g0, items, names[0], qs[names[0]])  # compile and load the kernels
    if args.once:
        print(run(g0, items, names[0], qs[names[0]]))
        return
    if args.profile:
        profile(g0, items, names[0], qs[names[0]], args.profile)
    rows = []
    for n in names:
        runs = sorted(run(g0, items, n, qs[n]) for _ in range(args.runs))
        sec, got = runs[len(runs) // 2]
        synced = sorted(run(g0, items, n, qs[n], sync_apply=True)[0] for _ in range(3))[1]
        spans: list = []
        run(g0, items, n, qs[n], spans)
        print(f"\n{n}: timeline of one run (ms from its start)")
        for th, stage, a, b in sorted(spans, key=lambda s: s[2]):
            print(f"  {th:<12} {stage:<16} {a * 1e3:8.3f} {b * 1e3:8.3f} {1e3 * (b - a):8.3f}")
        check = "-" if n not in exp else "ok" if exp[n] == got else f"WRONG (expected {exp[n]})"
        rows.append((n, got, sec, synced, check))
    print(f"\n{'query':<6} {'matches':>12} {'ms':>8} {'ms, apply synced':>17} {'check':>6}  (median of {args.runs})")
    for n, got, sec, synced, check in rows:
        print(f"{n:<6} {got:>12} {sec * 1e3:>8.2f} {synced * 1e3:>17.2f} {check:>6}")


if __name__ == "__main__":
    main()
