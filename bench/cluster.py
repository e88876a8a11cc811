"""Scale-out: updates/s of 1, 2 and 4 daemons sharing one stream ([cluster]), and the failover time.

Throughput: the human insertion stream with Q_1..Q_100 registered, count-only (every
match would be some 10^9 delta rows); the whole stream is produced at once, and the
time runs from the first record produced until every shard's committed progress has
passed the last record (every delta acknowledged by the broker). Each instance gets
CSMD_THREADS = cores // instances, so that together they do not oversubscribe the
machine; every instance still applies every update (the graph is replicated), only
the matching is split.

Failover: two instances, the stream flowing at --rate updates/s; one is killed
(SIGKILL) and the time runs until the committed progress of every shard it owned
moves again (Kafka noticed, the survivor re-matched the shard from its progress and
its deltas are acknowledged), for two session timeouts.

Median (and best) of --runs runs; prints a table. Embedded broker, CPU engine.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from kafka_harness import Cluster, kill_leftovers  # noqa: E402

from csmd.connectors.broker import EmbeddedBroker  # noqa: E402

SHARDS = 12


def cluster(root: Path, bootstrap: str, human: Path, tag: str, threads: int, **settings) -> Cluster:
    work = root / tag
    work.mkdir()
    overrides = {"graph": {"initial": str(human / "data.graph")},
                 "queries": {"paths": [str(human / "queries")], "count_only": True},
                 "log": {"level": "warning"}}
    return Cluster(work, bootstrap, [], SHARDS, overrides, {"CSMD_THREADS": str(threads)}, **settings)


def throughput(root, human, lines, n: int, run: int) -> float:
    tag = f"x{n}-{run}"
    with broker(root, tag) as b:
        c = cluster(root, b.bootstrap, human, tag, max(1, (os.cpu_count() or 1) // n))
        names = [chr(ord("a") + i) for i in range(n)]
        c.start(*names)
        c.wait_balanced(names)
        t0 = time.monotonic()
        c.t.produce(c.t.input, lines)
        c.wait_progress(len(lines), timeout=600, poll=0.02)
        seconds = time.monotonic() - t0
        c.stop(*names)
    print(f"{n} instances, run {run}: {seconds:.2f} s", file=sys.stderr)
    return len(lines) / seconds


def broker(root: Path, tag: str) -> EmbeddedBroker:
    """A fresh broker for each measurement (the in-memory one slows down as runs pile up topics)."""
    return EmbeddedBroker(log_path=root / f"broker-{tag}.log")


def failover(root, human, lines, session_ms: int, rate: float, run: int) -> float:
    tag = f"f{session_ms}-{run}"
    with broker(root, tag) as b:
        return _failover(cluster(root, b.bootstrap, human, tag, max(1, (os.cpu_count() or 1) // 2),
                                 session_timeout_ms=session_ms), lines, rate)


def _failover(c: Cluster, lines, rate: float) -> float:
    c.start("a", "b")
    owned = c.wait_balanced(["a", "b"])["b"]
    done = threading.Event()

    def stream():
        for i in range(0, len(lines), 10):
            if done.is_set():
                return
            c.t.produce(c.t.input, lines[i:i + 10])
            time.sleep(10 / rate)

    producer = threading.Thread(target=stream, daemon=True)
    producer.start()
    time.sleep(2)
    before = c.progress()
    c.members["b"].proc.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    while time.monotonic() - killed < 120:
        now = c.progress()
        if all(now[s] > before[s] for s in owned):
            break
        time.sleep(0.02)
    else:
        raise RuntimeError(f"the shards of the killed instance did not move on: {before} -> {c.progress()}")
    seconds = time.monotonic() - killed
    done.set()
    producer.join()
    c.stop("a")
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "datasets")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--instances", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--rate", type=float, default=400.0, help="updates/s offered during the failover runs")
    ap.add_argument("--sessions", type=int, nargs="+", default=[2000, 10000], help="session timeouts (ms)")
    args = ap.parse_args()
    human = args.datasets / "human"
    if not (human / "queries").is_dir():
        sys.exit(f"bench/cluster.py: {human} not found (use --datasets DIR)")
    lines = [ln.strip() for ln in (human / "insertion.graph").read_text().splitlines() if ln.strip()]
    queries = len(list((human / "queries").iterdir()))
    rates, failovers = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        try:
            for n in args.instances:
                rates[n] = [throughput(root, human, lines, n, r) for r in range(args.runs)]
                print(f"done: {n} instances", file=sys.stderr)
            for ms in args.sessions:
                failovers[ms] = statistics.median(failover(root, human, lines, ms, args.rate, r)
                                                  for r in range(args.runs))
                print(f"done: failover, session timeout {ms} ms", file=sys.stderr)
        finally:
            kill_leftovers()
    print(f"\nhuman insertion stream: {len(lines)} edge insertions, {queries} queries count-only; {SHARDS} shards; "
          f"embedded Tansu broker (a fresh one per run); CPU engine; {os.cpu_count()} cores on this machine, shared by the broker and "
          f"every instance; median of {args.runs} runs\n")
    print(f"{'instances':>9} {'updates/s':>10} {'speed-up':>9} {'best run':>9}")
    base = statistics.median(rates[args.instances[0]])
    for n, runs in rates.items():
        r = statistics.median(runs)
        print(f"{n:>9} {r:>10.0f} {r / base:>8.2f}x {max(runs):>9.0f}")
    print(f"\nfailover: 2 instances, {args.rate:.0f} updates/s offered; SIGKILL to the killed instance's shards "
          f"committing progress again\n")
    print(f"{'session timeout ms':>18} {'failover s':>11}")
    for ms, s in failovers.items():
        print(f"{ms:>18} {s:>11.2f}")


if __name__ == "__main__":
    main()
