"""Scale-out: updates/s of 1, 2 and 4 daemons sharing one stream ([cluster]), and the failover time.

Throughput, for two workloads, count-only (every human match would be some 10^9 delta
rows): the human insertion stream with Q_1..Q_100 registered, and the mixed
insert/delete stream made from yeast (bench/replay_yeast.py's, seeded) with its 17
queries. --rounds H Y makes the streams H and Y rounds long (128 and 16: some 3.5 and 15 s
on one instance of the compiled engine, 4 threads), so that the measurement is the
steady state (as in production) rather than start-up and drain: round 1 is the stream
itself, round 2 undoes it (every insertion deleted, every deletion re-inserted), round 3
does it again, and so on, each round in its own seeded order. Every update of every round
changes the graph and is matched at its own timestamp: real work, not padding. One human
round lasts about 0.03 s on one instance, too short for the split part to show (start-up
of the pipeline, the last batch's drain and the commit interval weigh as much); 32 rounds,
the default until the human stream's run fell to 0.8 s, leave the 100 ms commit interval
and the drain an eighth of a run and more.

Before the measured runs of a workload, one unmeasured run (one instance, a piece of its
first round and of its undoing) fills numba's on-disk cache: on a fresh machine the first
daemon compiles, during its stream, the kernels its start-up warm-up does not reach (the
deletion paths among them), which made the first human run 6.7 s instead of 1.1 s.

The whole stream is produced at once, and the time runs from the first record produced
until every shard's committed progress has passed the last record (every delta
acknowledged by the broker). Each instance gets --threads matching threads (CSMD_THREADS;
default: cores // the most instances measured), the same whatever the instance count, as
if each instance had a machine of its own (their pipeline threads come on top: see below);
every instance still applies every update (the graph is replicated), only the matching is
split. Any other daemon setting goes to every instance through its variable, e.g.
CSMD_PIPELINE__MAX_BATCH=4096 (the daemons inherit the environment).

--stages runs the daemons under bench/stage_timers.py and prints, for the last run of each
workload and instance count, where each instance's time went: thread CPU seconds of the
replicated stages (fetch, consume, sequence, apply), of the split ones (match: wall seconds of
submitting a search and waiting for it; search: CPU seconds of the compiled engine's threads
doing it; canonical, publish, acks) and of the cluster's bookkeeping, the
longest single call of any stage but match, the (op, query) pairs it matched, and when (seconds after
the first record was produced) it had taken in the last record, put out the last batch
and committed the last progress.

--bound also runs, in each run, N concurrent `csmd replay`s of the whole stream for each
instance count N, each with --threads threads (no Kafka, no split: every process does what
the lone instance does), and prints `bound`, N times how much faster one replay alone ran
than the slowest of N at once: the speed-up that N processes get from this machine at this
moment (cores slow down as more of them work; the host is shared), and `of bound`, the
speed-up in run over it. A split that reaches its bound has lost nothing to the design.

--per-record K puts K updates (text lines) in each input record, as a producer that batches
its updates would: the shards split (record, query) pairs, so fewer, fuller records.

Failover: two instances, the stream flowing at --rate updates/s; one is killed
(SIGKILL) and the time runs until the committed progress of every shard it owned
moves again (Kafka noticed, the survivor re-matched the shard from its progress and
its deltas are acknowledged), for two session timeouts.

Median (and best) of --runs runs; each run measures every instance count in turn, and
`in run` is the median of the speed-ups within one run (the hosts lent drift by 40% and
more over minutes: one run's counts see the same host). Prints a table, with how much of
the machine each run took: the CPU seconds of the broker and of every instance over the run's wall seconds
("cores busy"; this process, which produces the stream and polls the progress, is left
out). Each instance runs its pipeline stages beside its matching threads, so 4 instances
of cores // 4 threads want more cores than the machine has (13.8 of 16 busy on an H100
host): there the split is bound by the machine, not by the design; --threads 2 leaves
them room. Embedded broker; --backend cpu (the
compiled engine), numpy (its matching is some 10x slower, so the share that scales
weighs more) or gpu (each instance on its own GPU: a on GPU 0, b on GPU 1, ..., mod
--gpus; the failover runs stay on the compiled engine).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

from replay_yeast import QUERIES as YEAST_QUERIES

from csmd.connectors.broker import EmbeddedBroker
from csmd.testing.kafka import CSMD, Cluster, kill_leftovers
from csmd.testing.streams import in_rounds, make_stream

SHARDS = 12
STAGE_TIMERS = [sys.executable, str(Path(__file__).resolve().parent / "stage_timers.py")]
REPLICATED, SPLIT, BOOKKEEPING = ("fetch", "consume", "sequence", "apply"), ("match", "search", "canonical", "publish", "acks"), \
    ("select", "sync", "poll")


class Workload(NamedTuple):
    name: str
    graph: Path  # the initial graph
    queries: list[Path]  # query files or folders
    lines: list[str]  # the stream's records


def human_workload(datasets: Path, root: Path, rounds: int) -> Workload:
    human = datasets / "human"
    lines = [ln.strip() for ln in (human / "insertion.graph").read_text().splitlines() if ln.strip()]
    return Workload("human", human / "data.graph", [human / "queries"], in_rounds(lines, rounds))


def yeast_workload(datasets: Path, root: Path, rounds: int) -> Workload:
    yeast = datasets / "yeast"
    g0, stream, _ins, _dels = make_stream(yeast / "data.graph", root, seed=1)
    lines = [ln for ln in stream.read_text().splitlines() if ln]
    return Workload("yeast", g0, [yeast / "queries" / f"{q}.graph" for q in YEAST_QUERIES], in_rounds(lines, rounds))


def replay_command(w: Workload, root: Path, backend: str = "cpu") -> list[str]:
    """`csmd replay` of the workload's whole stream, count-only: the matching one instance does, without Kafka."""
    stream = root / f"{w.name}-replay.txt"
    stream.write_text("\n".join(w.lines) + "\n")
    return [sys.executable, "-m", "csmd", "replay", "--data", str(w.graph), "--stream", str(stream),
            "--query", *map(str, w.queries), "--count-only", "--json", "--backend", backend]


def replay_seconds(cmd: list[str], processes: int, threads: int) -> float:
    """Seconds of the slowest of `processes` concurrent replays."""
    env = {**os.environ, "CSMD_THREADS": str(threads)}
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(processes)]
    seconds = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode:
            sys.exit(f"replay failed ({p.returncode}): {err[-2000:]}")
        seconds.append(json.loads(out.splitlines()[-1])["seconds"])  # one line per query, the run's seconds
    return max(seconds)


def cluster(root: Path, bootstrap: str, w: Workload, tag: str, threads: int, backend: str = "cpu",
            command=CSMD, gpus: int = 1, **settings) -> Cluster:
    """Daemons for the workload; with the GPU engine, instance a on GPU 0, b on GPU 1, ... (mod `gpus`)."""
    work = root / tag
    work.mkdir()
    overrides = {"graph": {"initial": str(w.graph)},
                 "queries": {"paths": [str(q) for q in w.queries], "count_only": True},
                 "pipeline": {"backend": backend}, "log": {"level": "warning"}}

    def env(name: str) -> dict:
        gpu = {"CUDA_VISIBLE_DEVICES": str((ord(name) - ord("a")) % gpus)} if backend == "gpu" else {}
        return {"CSMD_THREADS": str(threads), **gpu}

    return Cluster(work, bootstrap, [], SHARDS, overrides, env, command, **settings)


def throughput(root, w: Workload, n: int, run: int, threads: int, backend: str,
               stages: bool, gpus: int = 1, per_record: int = 1) -> tuple[float, "Busy", dict[str, dict] | None]:
    """Updates/s of `n` instances, the stream's lines `per_record` to an input record, and the
    CPU the run took; with `stages`, each instance's stage timers and events, the event times
    in seconds after the first record was produced."""
    lines = ["\n".join(w.lines[i:i + per_record]) for i in range(0, len(w.lines), per_record)]
    tag = f"{w.name}-x{n}-{run}"
    timers = root / f"stages-{tag}"
    timers.mkdir()
    with broker(root, tag) as b:
        c = cluster(root, b.bootstrap, w, tag, threads, backend, [*STAGE_TIMERS, str(timers)] if stages else CSMD,
                    gpus)
        names = [chr(ord("a") + i) for i in range(n)]
        c.start(*names)
        c.wait_balanced(names)
        procs = [b.proc.pid, *(c.members[x].proc.pid for x in names)]
        cpu0, steal0 = [cpu_seconds(pid) for pid in procs], steal_seconds()
        t0, wall0 = time.monotonic(), time.time()
        c.t.produce(c.t.input, lines)
        c.wait_progress(len(lines), timeout=600, poll=0.02)
        seconds = time.monotonic() - t0
        cpu = [cpu_seconds(pid) - c0 for pid, c0 in zip(procs, cpu0)]
        stolen = steal_seconds() - steal0
        c.stop(*names)
    busy = Busy(seconds, cpu[0], cpu[1:], stolen)
    print(f"{w.name}: {n} instances, run {run}: {seconds:.2f} s, CPU s " + " ".join(f"{x:.1f}" for x in cpu[1:])
          + f" | broker {cpu[0]:.1f}, stolen {stolen:.1f}", file=sys.stderr)
    if not stages:
        return len(w.lines) / seconds, busy, None
    found = {}
    for name in names:
        d = json.loads((timers / f"{name}.json").read_text())
        d["events"] = {k: t - wall0 for k, t in d["events"].items()}
        found[name] = d
    return len(w.lines) / seconds, busy, found


class Busy(NamedTuple):
    """A run's wall seconds and the CPU seconds the broker and each instance used in it."""

    seconds: float
    broker: float
    instances: list[float]
    stolen: float  # CPU seconds the hypervisor gave this machine's CPUs to others meanwhile (all CPUs)

    def cores(self) -> float:
        """Cores kept busy on average: what the run took of the machine."""
        return (self.broker + sum(self.instances)) / self.seconds


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of a process so far (Linux: /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def steal_seconds() -> float:
    """CPU seconds stolen from this virtual machine so far, all CPUs together (Linux: /proc/stat's
    steal): time its CPUs wanted to run and the hypervisor ran someone else's."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0


def broker(root: Path, tag: str) -> EmbeddedBroker:
    """A fresh broker for each measurement (the in-memory one slows down as runs pile up topics)."""
    return EmbeddedBroker(log_path=root / f"broker-{tag}.log")


def failover(root, w: Workload, session_ms: int, rate: float, run: int) -> float:
    tag = f"f{session_ms}-{run}"
    with broker(root, tag) as b:
        return _failover(cluster(root, b.bootstrap, w, tag, max(1, (os.cpu_count() or 1) // 2),
                                 session_timeout_ms=session_ms), w.lines, rate)


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
    ap.add_argument("--sessions", type=int, nargs="*", default=[2000, 10000], help="session timeouts (ms)")
    ap.add_argument("--threads", type=int, help="matching threads per instance (default: cores // most instances)")
    ap.add_argument("--backend", choices=("cpu", "numpy", "gpu"), default="cpu",
                    help="the engine of the throughput runs (numpy: slower matching, so it weighs more)")
    ap.add_argument("--gpus", type=int, default=1, help="with --backend gpu: instance i runs on GPU i mod GPUS")
    ap.add_argument("--workloads", nargs="+", choices=("human", "yeast"), default=["human", "yeast"])
    ap.add_argument("--rounds", type=int, nargs=2, default=[128, 16], metavar=("HUMAN", "YEAST"),
                    help="rounds of each stream: the stream, its undoing, the stream again, ... (1: the stream alone)")
    ap.add_argument("--stages", action="store_true", help="time each instance's stages (bench/stage_timers.py)")
    ap.add_argument("--per-record", type=int, default=1, metavar="K",
                    help="updates per input record (text lines; a producer that batches its updates)")
    ap.add_argument("--bound", action="store_true",
                    help="in each run, also time N concurrent replays of the whole stream (no Kafka, no split) for "
                         "each count N: what the machine gives N processes at once (not with --backend gpu)")
    args = ap.parse_args()
    if args.bound and args.backend == "gpu":
        sys.exit("bench/cluster.py: --bound times CPU replays; leave it out with --backend gpu")
    if not (args.datasets / "human" / "queries").is_dir():
        sys.exit(f"bench/cluster.py: {args.datasets / 'human'} not found (use --datasets DIR)")
    args.datasets = args.datasets.resolve()  # the daemons run in their own folders
    threads = args.threads or max(1, (os.cpu_count() or 1) // max(args.instances))
    rates, busy, failovers, workloads, stages, alone = {}, {}, {}, {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        try:
            for name in args.workloads:
                make = {"human": human_workload, "yeast": yeast_workload}[name]
                rounds = dict(zip(("human", "yeast"), args.rounds))[name]
                w = workloads[name] = make(args.datasets, root, rounds)
                first = w.lines[:len(w.lines) // rounds]
                throughput(root, w._replace(lines=in_rounds(first[:200], 2)), 1, "warm-up", threads, args.backend,
                           False, args.gpus, args.per_record)
                replay = replay_command(w, root, args.backend) if args.bound else None
                for r in range(args.runs):  # each run measures every count: a host's drift over minutes hits them alike
                    for n in args.instances:
                        rate, b, timed = throughput(root, w, n, r, threads, args.backend, args.stages, args.gpus,
                                                    args.per_record)
                        rates.setdefault((name, n), []).append(rate)
                        busy.setdefault((name, n), []).append(b)
                        stages[name, n] = timed
                    for n in args.instances if replay else ():  # the same run: the host's drift hits both alike
                        alone.setdefault((name, n), []).append(replay_seconds(replay, n, threads))
                    print(f"done: {name}, run {r}", file=sys.stderr)
            human = workloads.get("human") or human_workload(args.datasets, root, args.rounds[0])
            for ms in args.sessions:
                failovers[ms] = statistics.median(failover(root, human, ms, args.rate, r) for r in range(args.runs))
                print(f"done: failover, session timeout {ms} ms", file=sys.stderr)
        finally:
            kill_leftovers()
    engine = (f"gpu engine, {args.gpus} GPUs (instance i on GPU i mod {args.gpus})" if args.backend == "gpu"
              else f"{args.backend} engine, {threads} matching threads per instance")
    print(f"\n{SHARDS} shards; embedded Tansu broker (a fresh one per run); {engine}; "
          f"{os.cpu_count()} cores on this machine, shared by the broker and every instance; count-only; "
          f"{args.per_record} updates per input record; median of {args.runs} runs\n")
    print("cores busy: CPU seconds of the broker and every instance over the run's wall seconds (of "
          f"{os.cpu_count()}); stolen: cores the hypervisor gave to other machines meanwhile; CPU s: each "
          f"instance's, then the broker's (medians of the runs)\n")
    if alone:
        print("bound: N over how much slower each of N concurrent replays of the whole stream (no Kafka, no split) "
              f"ran than one alone, in the same run: what the machine gives N processes of {threads} threads at once; "
              "of bound: the speed-up in run over it (medians of the runs)\n")
    print(f"{'workload':>34} {'instances':>9} {'updates/s':>10} {'speed-up':>9} {'in run':>7} {'best run':>9} "
          f"{'cores busy':>10} {'stolen':>6} {'CPU s':>24}" + (f" {'bound':>6} {'of bound':>8}" if alone else ""))
    for name, w in workloads.items():
        what = f"{name}: {len(w.lines)} updates, {len(queries_of(w))} queries"
        first = rates[name, args.instances[0]]
        base = statistics.median(first)
        for n in args.instances:
            r, runs = statistics.median(rates[name, n]), busy[name, n]
            paired = statistics.median(x / y for x, y in zip(rates[name, n], first))
            each = [statistics.median(b.instances[i] for b in runs) for i in range(n)]
            cpu = " ".join(f"{x:.1f}" for x in each) + f" | {statistics.median(b.broker for b in runs):.1f}"
            print(f"{what:>34} {n:>9} {r:>10.0f} {r / base:>8.2f}x {paired:>6.2f}x {max(rates[name, n]):>9.0f} "
                  f"{statistics.median(b.cores() for b in runs):>10.1f} "
                  f"{statistics.median(b.stolen / b.seconds for b in runs):>6.2f} {cpu:>24}" + bound_columns(
                      alone, name, n, args.instances[0], rates))
    if args.stages:
        print_stages(workloads, stages, args.per_record)
    if not failovers:
        return
    print(f"\nfailover: human stream, 2 instances, {args.rate:.0f} updates/s offered; SIGKILL to the killed "
          f"instance's shards committing progress again\n")
    print(f"{'session timeout ms':>18} {'failover s':>11}")
    for ms, s in failovers.items():
        print(f"{ms:>18} {s:>11.2f}")


def bound_columns(alone: dict, name: str, n: int, base: int, rates: dict) -> str:
    """The machine's bound for n instances and the speed-up's share of it, run by run (empty without --bound)."""
    if not alone:
        return ""
    runs = list(zip(alone[name, n], alone[name, base], rates[name, n], rates[name, base]))
    bound = [(n / base) * t_base / t_n for t_n, t_base, _r, _rb in runs]
    share = [(r / rb) / b for (_t, _tb, r, rb), b in zip(runs, bound)]
    return f" {statistics.median(bound):>5.2f}x {statistics.median(share):>7.0%}"


def print_stages(workloads: dict[str, Workload], stages: dict, per_record: int) -> None:
    print("\nwhere the time went, last run of each: thread CPU seconds per stage (replicated: every instance does "
          "all of it; split: only a shard's owner, match in wall seconds, search: the CPU seconds of its engine "
          "threads (compiled engine); cluster: bookkeeping); the longest call of a stage but match; seconds after the first record was produced when the instance had taken in the "
          "last record, put out its last batch, committed the end\n")
    cols = [*REPLICATED, *SPLIT, *BOOKKEEPING]
    print(f"{'workload':>8} {'n':>2} {'inst':>4} {'batches':>7} {'pairs':>8} " + " ".join(f"{c:>8.8}" for c in cols)
          + f" {'longest':>16} {'last in':>8} {'last out':>8} {'committed':>9}")
    for (name, n), found in stages.items():
        end = -(-len(workloads[name].lines) // per_record)  # input records
        for inst, d in found.items():
            t, ev = d["stages"], d["events"]
            batches, _records, ops = t.get("ops matched", (0, 0, 0))
            committed = min((v for k, v in ev.items() if k.startswith("committed ") and int(k.split()[1]) >= end),
                            default=float("nan"))
            longest = max((c for c in cols if c not in ("match", "search") and c in t), key=lambda c: t[c][3])
            print(f"{name:>8} {n:>2} {inst:>4} {batches:>7} {ops:>8} "
                  + " ".join(f"{t.get(c, (0, 0, 0))[1 if c == 'match' else 2]:>8.3f}" for c in cols)
                  + f" {longest:>10.10} {t[longest][3]:>5.3f}"
                  + f" {ev.get('last record', float('nan')):>8.3f} {ev.get('last batch out', float('nan')):>8.3f}"
                  + f" {committed:>9.3f}")


def queries_of(w: Workload) -> list[Path]:
    return [f for q in w.queries for f in (sorted(q.iterdir()) if q.is_dir() else [q])]


if __name__ == "__main__":
    main()
