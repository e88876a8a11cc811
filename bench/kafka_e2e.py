"""Through Kafka (the embedded broker): where a record's round trip goes, and the daemon's share of it.

Paced (--rate updates/s, one update a record, the human insertion stream, Q_1..Q_N count-only),
per input record in one run:
  (a) end to end: from handing the record to the producer to a consumer of the output topic
      holding its first delta (records with deltas);
  (b) the broker's own hop: the same records produced at the same rate to a topic and consumed
      back with the consumer settings the daemon uses, no daemon between;
  (c) the daemon's own time: from a record's arrival at its consumer to its deltas acknowledged
      by the broker (its latency histogram, every record; `csmd admin stats`);
  (d) the same for the records with deltas alone (its delta latency histogram): (a)'s records.
(a) holds two hops of (b) and (d): a daemon that adds nothing of its own has a <= d + 2b.
Within (c), from the daemon's stats: (m) from an update's batch forming to its deltas ready,
(p) to its deltas handed to the producer; (c) less (p) is the wait for the batch to form and
for the broker's acknowledgement.

Burst: --rounds rounds of the human stream (each undoing the last, csmd.testing.streams.in_rounds),
--per-record updates a record, produced at once; updates/s from the first record produced to
every record done (its deltas acknowledged). Median of --runs runs. Prints a table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.ipc as ipc

from confluent_kafka import Consumer, Producer, TopicPartition

from csmd.connectors.broker import EmbeddedBroker
from csmd.testing.kafka import DaemonProcess, Topics, config_text, human_lines, kill_leftovers, new_admin_port
from csmd.testing.streams import in_rounds

QUIET = {"log_level": 0}
CONSUMER = {"fetch.wait.max.ms": 5, **QUIET}  # what the daemon's input consumer uses (connectors/kafka.py)


READY = b"bench-ready"  # the key (and value) of FirstSeen's first record, its own


def produce(bootstrap: str, topic: str, values: list[bytes], rate: float | None, key: bytes | None = None
            ) -> dict[int, float]:
    """Each record's offset -> when it was handed to the producer (paced at `rate`, or all at once)."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0 if rate else 5, **QUIET})
    handed: dict[int, float] = {}

    def delivered(err, msg, t):
        if err is None:
            handed[msg.offset()] = t

    t0 = time.monotonic()
    for i, v in enumerate(values):
        if rate:
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        now = time.time()
        p.produce(topic, v, key, on_delivery=lambda err, msg, t=now: delivered(err, msg, t))
        p.poll(0)
    p.flush(60)
    return handed


class FirstSeen:
    """A consumer thread: when each input offset was first seen on `topic` (the offsets of its
    delta rows for the output topic, the record's own offset for a plain topic)."""

    def __init__(self, bootstrap: str, topic: str, deltas: bool):
        self.seen: dict[int, float] = {}
        self._stop, self._ready = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, args=(bootstrap, topic, deltas), daemon=True)
        self._thread.start()
        # consuming before the first record is produced: a consumer's start (bootstrap, metadata, the
        # leader's connection, its first fetches) put 100-300 ms into the first records' (a)
        produce(bootstrap, topic, [READY], None, key=READY)
        if not self._ready.wait(30):
            raise RuntimeError(f"{topic}: the consumer did not receive a record in 30 s")

    def _run(self, bootstrap, topic, deltas):
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-" + topic, **CONSUMER})
        c.assign([TopicPartition(topic, 0, 0)])
        while not self._stop.is_set():
            # what is fetched already, else the first record to come: consume(n, t) waits for all n
            # (or t), which alone put 25 ms into every hop measured
            for m in c.consume(1000, 0) or c.consume(1, 0.05):
                if m.error() is None and m.key() == READY:
                    self._ready.set()
                elif m.error() is None:
                    now = time.time()
                    offs = np.unique(ipc.open_stream(m.value()).read_all().column("offset").to_numpy()).tolist() \
                        if deltas else [m.offset()]
                    for o in offs:
                        self.seen.setdefault(o, now)
        c.close()

    def close(self) -> dict[int, float]:
        time.sleep(1.0)
        self._stop.set()
        self._thread.join()
        return self.seen


PRODUCER: dict = {}  # the daemon's [kafka] producer settings (--producer)


def daemon(bootstrap: str, queries: list[Path], backend: str, workdir: Path) -> tuple[Topics, DaemonProcess]:
    t = Topics(bootstrap)
    port = new_admin_port()
    cfg = workdir / f"{t.input}.toml"
    cfg.write_text(config_text(t, [], admin_port=port, queries={"paths": [str(q) for q in queries], "count_only": True},
                               pipeline={"backend": backend}, log={"level": "warning"},
                               kafka={"bootstrap": bootstrap, "group": f"g-{t.input}", "producer": PRODUCER}))
    return t, DaemonProcess(cfg, workdir / f"{t.input}.log", port)


def wait_done(d: DaemonProcess, records: int) -> dict:
    while True:
        s = d.get("/stats")
        if s["offsets"].get("0", 0) >= records and s["pending_records"] == 0:
            return s
        time.sleep(0.01)


def paced(bootstrap: str, queries, backend: str, rate: float, workdir: Path) -> dict:
    """(a), (b) and (c) of one run, in seconds: each as (p50, p99)."""
    values = [line.encode() for line in human_lines()]
    t, d = daemon(bootstrap, queries, backend, workdir)
    produce(bootstrap, t.input, [b"e 0 0"], None)  # a self-loop, ignored: the stream starts once the daemon
    wait_done(d, 1)  # reads its input (its consumer's first fetch is the start's, not a record's latency)
    out = FirstSeen(bootstrap, t.output, deltas=True)
    handed = produce(bootstrap, t.input, values, rate)
    own = wait_done(d, len(values) + 1)
    seen = out.close()
    d.stop()
    a = [seen[o] - handed[o] for o in seen if o in handed]
    b = hop(bootstrap, values, rate)
    q = lambda x: (float(np.percentile(x, 50)), float(np.percentile(x, 99)))  # noqa: E731
    return {"a": q(a), "b": q(b), "c": (own["latency_p50_s"], own["latency_p99_s"]),
            "d": (own["delta_latency_p50_s"], own["delta_latency_p99_s"]),
            "m": (own["matched_p50_s"], own["matched_p99_s"]), "p": (own["produced_p50_s"], own["produced_p99_s"]),
            "with_deltas": len(a)}


def hop(bootstrap: str, values: list[bytes], rate: float) -> list[float]:
    """(b): each record's seconds from the producer to a consumer, through a fresh topic."""
    topic = Topics(bootstrap).input
    back = FirstSeen(bootstrap, topic, deltas=False)
    handed = produce(bootstrap, topic, values, rate)
    seen = back.close()
    return [seen[o] - handed[o] for o in seen if o in handed]


def burst(bootstrap: str, queries, backend: str, rounds: int, per_record: int, workdir: Path) -> tuple[float, int]:
    """(updates/s end to end, updates) of one run."""
    lines = in_rounds(human_lines(), rounds)
    values = ["\n".join(lines[i:i + per_record]).encode() for i in range(0, len(lines), per_record)]
    t, d = daemon(bootstrap, queries, backend, workdir)
    t0 = time.monotonic()
    produce(bootstrap, t.input, values, None)
    wait_done(d, len(values))
    seconds = time.monotonic() - t0
    d.stop()
    return len(lines) / seconds, len(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", nargs="+", default=["cpu"], help="engines to measure (cpu, gpu)")
    ap.add_argument("--datasets", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "datasets")
    ap.add_argument("--queries", type=int, default=100, help="Q_1..Q_N of the human dataset, count-only")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rate", type=float, default=1000.0, help="updates/s of the paced runs")
    ap.add_argument("--rounds", type=int, default=128, help="rounds of the human stream in the burst")
    ap.add_argument("--per-record", type=int, default=64, help="updates a record in the burst")
    ap.add_argument("--producer", nargs="*", default=[], metavar="KEY=VALUE",
                    help="the daemon's [kafka] producer settings (e.g. linger.ms=2)")
    args = ap.parse_args()
    PRODUCER.update(kv.split("=", 1) for kv in args.producer)
    queries = [args.datasets.resolve() / "human" / "queries" / f"Q_{i}.graph" for i in range(1, args.queries + 1)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker(log_path=Path(tmp) / "broker.log") as broker:
        work = Path(tmp)
        # a first paced run in a process, through a fresh broker, had its first 0.3 s of records reach
        # the consumer 100-300 ms late on the device hosts (the daemon had them acknowledged within
        # (d), and a CPU run after a GPU one in the same process did not): a hop first, not measured
        hop(broker.bootstrap, [line.encode() for line in human_lines()[:500]], args.rate)
        try:
            for backend in args.backend:
                runs = [paced(broker.bootstrap, queries, backend, args.rate, work) for _ in range(args.runs)]
                med = {k: tuple(statistics.median(r[k][i] for r in runs) for i in (0, 1)) for k in "abcdmp"}
                rates = [burst(broker.bootstrap, queries, backend, args.rounds, args.per_record, work)
                         for _ in range(args.runs)]
                rows.append((backend, med, runs[0]["with_deltas"], statistics.median(r[0] for r in rates),
                             rates[0][1]))
                print(f"done: {backend}", file=sys.stderr)
        finally:
            kill_leftovers()
    n = len(human_lines())
    print(f"\nhuman stream, Q_1..Q_{args.queries} count-only; embedded Tansu broker; median of {args.runs} runs")
    print(f"paced: {n} records of one update at {args.rate:.0f}/s; (a) handed to the producer -> first delta "
          f"consumed, (b) the same records through one topic, no daemon, (c) the daemon's own: arrival -> "
          f"deltas acknowledged, (d) the same for the records with deltas")
    print(f"burst: {args.rounds} rounds, {args.per_record} updates a record, produced at once; daemon's producer "
          f"settings: {PRODUCER or 'the defaults'}\n")
    print(f"{'engine':<7} {'(a) p50':>8} {'(a) p99':>8} {'(b) p50':>8} {'(b) p99':>8} {'(c) p50':>8} {'(c) p99':>8} "
          f"{'(d) p50':>8} {'(d) p99':>8} {'(m) p50':>8} {'(m) p99':>8} {'(p) p50':>8} {'(p) p99':>8} "
          f"{'d+2b p50':>9} {'records w/ deltas':>18} {'burst upd/s':>12} {'updates':>10}")
    for backend, med, with_deltas, rate, updates in rows:
        ms = {k: (v[0] * 1000, v[1] * 1000) for k, v in med.items()}
        print(f"{backend:<7} {ms['a'][0]:>8.1f} {ms['a'][1]:>8.1f} {ms['b'][0]:>8.1f} {ms['b'][1]:>8.1f} "
              + "".join(f"{ms[k][i]:>8.2f} " for k in "cdmp" for i in (0, 1))
              + f"{ms['d'][0] + 2 * ms['b'][0]:>9.1f} {with_deltas:>18} "
              f"{rate:>12.0f} {updates:>10}")
    print("\nms; (a) and (b) per record, (c), (d), (m) and (p) from the daemon's histograms (bucketed)")


if __name__ == "__main__":
    main()
