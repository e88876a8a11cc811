"""`make run`: the embedded broker, the daemon, and the human insertion stream, with live delta counts.

Starts the Tansu broker on a free port, the daemon (`csmd run` with the demo
config, in a child process: its log goes to out/daemon.log), then produces the
stream at a steady rate while it reads the output topic and shows what arrives.
Ctrl-C, or the end of the stream, stops everything cleanly: the daemon drains
and commits on SIGTERM.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pyarrow.ipc as ipc

from csmd.cli.live import Window, query_table, status_line
from csmd.connectors.broker import EmbeddedBroker, free_port

from csmd.service.admin import call
from csmd.service.config import load_config
from csmd.errors import CsmdError


def _expected(path: Path) -> dict[str, int]:
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        if ":" in line:
            name, count = line.split(":")
            out[name.strip()] = int(count)
    return out


class _Totals:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_query: dict[str, list[int]] = {}
        self.records = 0
        self.count = 0  # deltas, or matches of count-only queries (each delta's count)

    def table(self, expected: dict[str, int], top: int | None) -> list[str]:
        with self.lock:
            by_query = {q: list(v) for q, v in self.by_query.items()}
        return query_table(by_query, expected, top)

    def add(self, table) -> None:
        with self.lock:
            self.records += 1
            self.count += sum(table.column("count").to_pylist())
            for q, s, c in zip(table.column("query").to_pylist(), table.column("sign").to_pylist(),
                               table.column("count").to_pylist()):
                self.by_query.setdefault(q, [0, 0])[0 if s > 0 else 1] += c


def _read_deltas(bootstrap: str, topic: str, totals: _Totals, stop: threading.Event) -> None:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "demo-view-" + uuid.uuid4().hex[:6],
                  "fetch.wait.max.ms": 10, "log_level": 0})
    c.assign([TopicPartition(topic, 0, 0)])
    try:
        while not stop.is_set():
            for m in c.consume(500, 0.1):
                if m.error() is None:
                    totals.add(ipc.open_stream(m.value()).read_all())
    finally:
        c.close()


def _produce(bootstrap: str, topic: str, lines: list[str], rate: float, sent: list, stop: threading.Event) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 0})
    t0 = time.monotonic()
    for i, line in enumerate(lines):
        if stop.is_set():
            break
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        p.produce(topic, line.encode())
        p.poll(0)
        sent[0] = i + 1
    p.flush(30)


def _interrupt(_signum, _frame):
    raise KeyboardInterrupt


def _keep(bootstrap: str, url: str, queries: Path, daemon: subprocess.Popen) -> None:
    """--keep: the broker and the daemon stay up for `csmd admin` until Ctrl-C (or SIGTERM)."""
    print(f"\nkept running: broker {bootstrap}, daemon admin {url} (Ctrl-C stops both); try\n"
          f"  csmd admin --url {url} stats\n"
          f"  csmd admin --url {url} match --query {queries / 'Q_1.graph'}\n"
          f"  csmd admin --url {url} remove --name Q_40\n"
          f"  csmd admin --url {url} add --query {queries / 'Q_40.graph'}", flush=True)
    while daemon.poll() is None:
        time.sleep(0.5)
    print(f"the daemon exited with {daemon.returncode}; see out/daemon.log")


def run_demo(args) -> int:
    repo = Path.cwd()
    out = repo / "out"
    out.mkdir(exist_ok=True)
    cfg = load_config(args.config, env={})
    if cfg.checkpoint.dir:  # the embedded broker starts empty: old checkpoints name offsets it never had
        shutil.rmtree(cfg.checkpoint.dir, ignore_errors=True)
    graph = Path(cfg.graph.initial)
    stream = graph.parent / "insertion.graph"
    lines = [ln.strip() for ln in stream.read_text().splitlines() if ln.strip()]
    expected = _expected(graph.parent / "expected_insert_counts.txt")
    tty = sys.stdout.isatty()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, _interrupt)  # stopped like Ctrl-C: the daemon and the broker go too
    with EmbeddedBroker(log_path=out / "broker.log") as broker:
        admin_port = free_port()
        env = {**os.environ, "CSMD_KAFKA__BOOTSTRAP": broker.bootstrap,
               "CSMD_ADMIN__LISTEN": f"127.0.0.1:{admin_port}", "CSMD_LOG__FORMAT": "json", "CSMD_LOG__LEVEL": "info"}
        url = f"http://127.0.0.1:{admin_port}"
        print(f"embedded Kafka broker at {broker.bootstrap}; daemon log: out/daemon.log; admin: {url}")
        # in a session of its own, like the broker: Ctrl-C in the terminal reaches the demo alone, which
        # stops the daemon (SIGTERM: drain, commit, checkpoint) and then the broker, in that order
        daemon = subprocess.Popen([sys.executable, "-m", "csmd", "run", "--config", str(args.config)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=open(out / "daemon.log", "wb"),
                                  start_new_session=True)
        try:
            deadline = time.monotonic() + 120
            while True:
                if daemon.poll() is not None:
                    raise CsmdError(f"the daemon exited with {daemon.returncode}; see out/daemon.log")
                try:
                    if call(url, "GET", "/health", timeout=2)["status"] == "running":
                        break
                except CsmdError:
                    pass
                if time.monotonic() > deadline:
                    raise CsmdError("the daemon did not start within 120 s; see out/daemon.log")
                time.sleep(0.1)
            queries = call(url, "GET", "/queries")["queries"]
            count_only = all(q["count_only"] for q in queries)
            print(f"daemon running with {len(queries)} queries; streaming {len(lines)} edge insertions "
                  f"of {stream} at {args.rate:.0f}/s (Ctrl-C stops)\n")
            totals, sent = _Totals(), [0]
            workers = [threading.Thread(target=_read_deltas, args=(broker.bootstrap, cfg.topics.output, totals,
                                                                   stop), daemon=True),
                       threading.Thread(target=_produce, args=(broker.bootstrap, cfg.topics.input, lines,
                                                               args.rate, sent, stop), daemon=True)]
            for w in workers:
                w.start()
            window, drawn, printed = Window(), 0, 0.0
            while True:
                try:
                    s = call(url, "GET", "/stats")
                except CsmdError:
                    if daemon.poll() is not None:
                        raise CsmdError(f"the daemon exited with {daemon.returncode}; see out/daemon.log") from None
                    raise
                acked = s["acknowledged"].get("0", 0)
                now = time.monotonic()
                window.add(now, acked=acked, deltas=totals.count)
                status = status_line(produced=sent[0], total=len(lines), acknowledged=acked,
                                     updates_per_s=window.rate("acked"), deltas_per_s=window.rate("deltas"),
                                     count_only=count_only, latency_p50_s=s["latency_p50_s"],
                                     latency_p99_s=s["latency_p99_s"], dead_letters=s["dead_letters"])
                finished = acked >= len(lines) and s["pending_records"] == 0
                view = [status, ""] + totals.table(expected, 12)
                if tty:  # redrawn in place
                    sys.stdout.write(("\x1b[%dA" % drawn if drawn else "") + "\x1b[J" + "\n".join(view) + "\n")
                    drawn = len(view)
                elif finished or now - printed >= 2:  # a log of the view, every 2 s
                    print("\n".join(view) + "\n", flush=True)
                    printed = now
                if finished:
                    time.sleep(1.0)  # the last deltas reach the viewer
                    break
                time.sleep(0.5)
            print("\nfinal delta totals per query (new matches = the expected counts of the insertion stream):")
            print("\n".join(totals.table(expected, None)))
            agree = sum(totals.by_query.get(q, [0])[0] == n for q, n in expected.items())
            print(f"\n{agree}/{len(expected)} queries equal expected_insert_counts.txt")
            if args.keep:
                _keep(broker.bootstrap, url, graph.parent / "queries", daemon)
        except KeyboardInterrupt:
            print("\ninterrupted: stopping")
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave the daemon running
            stop.set()
            if daemon.poll() is None:
                daemon.send_signal(signal.SIGTERM)  # drains, commits, writes a last checkpoint
                try:
                    daemon.wait(60)
                except subprocess.TimeoutExpired:
                    daemon.kill()
            print(f"daemon stopped (exit {daemon.returncode}); broker stopped")
    return 0 if daemon.returncode == 0 else 1
