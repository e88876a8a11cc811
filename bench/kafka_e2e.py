"""End-to-end through Kafka (embedded broker, CPU engine) against `csmd replay` on the same stream.

Throughput: the whole human insertion stream is produced at once; updates/s from
the first record produced until every record is done (its deltas acknowledged
by the broker). Latency: the stream is produced at a steady rate below capacity;
per update with deltas, from its produce time (the record's CreateTime) to the
moment a consumer of the output topic holds its first delta. Replay: the same
stream, queries and batch size through `csmd replay` in-process (no Kafka).
Median of --runs runs. Prints a table.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from kafka_harness import HUMAN, DaemonProcess, Topics, config_text, human_lines, kill_leftovers, new_admin_port  # noqa: E402

from csmd.connectors.broker import EmbeddedBroker  # noqa: E402
from csmd.model.formats import read_graph, read_query  # noqa: E402
from csmd.cli.replay import replay  # noqa: E402

SETS = {
    "4 queries, every match": (["Q_1", "Q_2", "Q_5", "Q_8"], False),
    "40 queries, count-only": ([f"Q_{i}" for i in range(1, 41)], True),
}


def run_kafka(bootstrap: str, queries, count_only: bool, rate: float | None, workdir: Path):
    """(seconds to drain the stream, latencies of updates with deltas or None, the daemon's own p50/p99)."""
    t = Topics(bootstrap)
    port = new_admin_port()
    cfg = workdir / f"{t.input}.toml"
    cfg.write_text(config_text(t, queries, admin_port=port, queries={"count_only": count_only},
                               log={"level": "warning"}))
    d = DaemonProcess(cfg, workdir / f"{t.input}.log", port)
    lines = human_lines()
    first_delta: dict[int, float] = {}
    produced: dict[int, float] = {}
    stop = threading.Event()

    def consume():
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-" + t.input, "fetch.wait.max.ms": 5,
                      "log_level": 0})
        c.assign([TopicPartition(t.output, 0, 0)])
        while not stop.is_set():
            for m in c.consume(1000, 0.05):
                if m.error() is None:
                    now = time.time()
                    offs = ipc.open_stream(m.value()).read_all().column("offset").to_numpy()
                    for o in np.unique(offs).tolist():
                        first_delta.setdefault(o, now)
        c.close()

    reader = threading.Thread(target=consume, daemon=True)
    reader.start()
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0 if rate else 5, "log_level": 0})

    def delivered(err, msg):
        if err is None:
            produced[msg.offset()] = msg.timestamp()[1] / 1000

    t0 = time.monotonic()
    for i, line in enumerate(lines):
        if rate:
            delay = t0 + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        p.produce(t.input, line.encode(), on_delivery=delivered)
        p.poll(0)
    p.flush(60)
    while True:
        s = d.get("/stats")
        if s["offsets"].get("0", 0) >= len(lines) and s["pending_records"] == 0:
            break
        time.sleep(0.01)
    seconds = time.monotonic() - t0
    own = (s["latency_p50_s"], s["latency_p99_s"])  # every record: arrival to deltas acknowledged
    time.sleep(1.0)
    stop.set()
    reader.join()
    d.stop()
    lat = [first_delta[o] - produced[o] for o in first_delta if o in produced] if rate else None
    return seconds, lat, own


def run_replay(queries, count_only: bool, workdir: Path) -> float:
    g0 = read_graph(HUMAN / "data.graph")
    qs = [(q, read_query(HUMAN / "queries" / f"{q}.graph")) for q in queries]
    out = None if count_only else workdir / "replay.arrow"
    t0 = time.monotonic()
    replay(g0, HUMAN / "insertion.graph", qs, batch_size=64, count_only=count_only, output=out, show_progress=False)
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rate", type=float, default=200.0, help="updates/s for the latency runs (below capacity)")
    args = ap.parse_args()
    n = len(human_lines())
    rows = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker(log_path=Path(tmp) / "broker.log") as broker:
        work = Path(tmp)
        try:
            for label, (queries, count_only) in SETS.items():
                kafka_s = statistics.median(run_kafka(broker.bootstrap, queries, count_only, None, work)[0]
                                            for _ in range(args.runs))
                replay_s = statistics.median(run_replay(queries, count_only, work) for _ in range(args.runs))
                runs = [run_kafka(broker.bootstrap, queries, count_only, args.rate, work) for _ in range(args.runs)]
                p50 = statistics.median(float(np.percentile(r[1], 50)) for r in runs)
                p99 = statistics.median(float(np.percentile(r[1], 99)) for r in runs)
                own50 = statistics.median(r[2][0] for r in runs)
                own99 = statistics.median(r[2][1] for r in runs)
                rows.append((label, n / kafka_s, n / replay_s, kafka_s / replay_s, p50, p99, len(runs[0][1]),
                             own50, own99))
                print(f"done: {label}", file=sys.stderr)
        finally:
            kill_leftovers()
    print(f"\nhuman insertion stream: {n} edge insertions; embedded Tansu broker; CPU engine; batch size 64; "
          f"median of {args.runs} runs; latency at {args.rate:.0f} updates/s offered\n")
    print("p50/p99: produced to first delta consumed, over the updates that have deltas;")
    print("all p50/p99: the daemon's own histogram, every record from arrival to its deltas acknowledged\n")
    print(f"{'queries':<26} {'kafka upd/s':>12} {'replay upd/s':>13} {'kafka/replay time':>18} "
          f"{'p50 ms':>8} {'p99 ms':>8} {'updates w/ deltas':>18} {'all p50 ms':>11} {'all p99 ms':>11}")
    for label, k, r, ratio, p50, p99, m, o50, o99 in rows:
        print(f"{label:<26} {k:>12.0f} {r:>13.0f} {ratio:>18.2f} {p50 * 1000:>8.1f} {p99 * 1000:>8.1f} {m:>18} "
              f"{o50 * 1000:>11.1f} {o99 * 1000:>11.1f}")


if __name__ == "__main__":
    main()
