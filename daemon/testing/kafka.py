"""Running the daemon against a broker, for the tests and the benchmarks: topics, producing, reading
deltas back, the process, a cluster of them.

The broker is the embedded one, or the cluster named by KAFKA_BOOTSTRAP.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import subprocess
import sys
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import pyarrow as pa
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from csmd.connectors.broker import free_port
from csmd.connectors.kafka import ensure_topics
from csmd.jobs.replay import replay
from csmd.model.formats import read_graph, read_query

REPO = Path(__file__).resolve().parents[2]  # the source checkout: daemon/testing/kafka.py
HUMAN = REPO / "samples" / "human"
QUIET = {"log_level": 0}
QUERIES = ["Q_1", "Q_2", "Q_5", "Q_8"]  # the daemon tests' queries, what `reference` replays


def human_lines() -> list[str]:
    return [line.strip() for line in (HUMAN / "insertion.graph").read_text().splitlines() if line.strip()]


def expected_totals() -> dict[str, int]:
    out = {}
    for line in (HUMAN / "expected_insert_counts.txt").read_text().splitlines():
        name, count = line.split(":")
        out[name.strip()] = int(count)
    return out


def samples(metrics_text: str) -> dict[tuple, float]:
    """/metrics text, parsed by Prometheus' own parser: (sample name, sorted label items) -> value."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(metrics_text) for s in fam.samples}


def metric(metrics_text: str, name: str, **labels) -> float | None:
    """One sample's value; None when the series is absent."""
    return samples(metrics_text).get((name, tuple(sorted(labels.items()))))


def rows_of(table: pa.Table) -> Counter:
    cols = [table.column(c).to_pylist() for c in ("query", "seq", "sign", "vertices")]
    return Counter((q, s, g, tuple(v)) for q, s, g, v in zip(*cols))


def dedup(table: pa.Table) -> tuple[pa.Table, int]:
    """Rows with distinct delta ids; the number of duplicates dropped. Duplicates must be identical."""
    ids = list(zip(*(table.column(c).to_pylist() for c in ("input", "partition", "offset", "query", "index"))))
    content = list(zip(*(table.column(c).to_pylist() for c in ("seq", "sign", "vertices"))))
    seen: dict = {}
    keep = []
    for i, (key, body) in enumerate(zip(ids, content)):
        if key in seen:
            assert seen[key] == body, f"delta id {key} names two different deltas"
            continue
        seen[key] = body
        keep.append(i)
    return table.take(keep), len(ids) - len(keep)


def replay_rows(queries, folder: Path) -> Counter:
    """`csmd replay`'s deltas of the human stream for `queries` (the truth of the daemon tests, its own
    tests check it against brute force): (query, seq, sign, vertices) -> count."""
    out = folder / "deltas.arrow"
    replay(read_graph(HUMAN / "data.graph"), HUMAN / "insertion.graph",
           [(q, read_query(HUMAN / "queries" / f"{q}.graph")) for q in queries], batch_size=64,
           count_only=False, output=out, show_progress=False)
    return rows_of(pa.ipc.open_file(str(out)).read_all())


class Topics:
    """Fresh topic names for one test (a shared cluster keeps old ones)."""

    def __init__(self, bootstrap: str, partitions: int = 1):
        tag = uuid.uuid4().hex[:8]
        self.bootstrap = bootstrap
        self.input, self.output = f"t{tag}.updates", f"t{tag}.deltas"
        self.control, self.dead_letter = f"t{tag}.control", f"t{tag}.dlq"
        ensure_topics({"bootstrap.servers": bootstrap}, {self.input: partitions, self.output: 1, self.control: 1,
                                                         self.dead_letter: 1})

    def produce(self, topic: str, values, headers=None, partition: int = -1) -> None:
        p = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 5, **QUIET})
        for v in values:
            p.produce(topic, v if isinstance(v, bytes) else v.encode(), headers=headers, partition=partition)
            p.poll(0)
        assert p.flush(30) == 0

    def read(self, topic: str, expect_idle: float = 1.5, timeout: float = 60.0, until=None) -> list:
        """Every message of partition 0 of `topic`, read until nothing new for expect_idle seconds
        (or until `until(messages)` holds)."""
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "reader-" + uuid.uuid4().hex[:6],
                      "enable.auto.commit": False, "fetch.wait.max.ms": 10, "isolation.level": "read_committed",
                      **QUIET})
        c.assign([TopicPartition(topic, 0, 0)])
        out, last, t0 = [], time.monotonic(), time.monotonic()
        try:
            while time.monotonic() - t0 < timeout:
                msgs = [m for m in c.consume(1000, 0.1) if m.error() is None]
                out += msgs
                if msgs:
                    last = time.monotonic()
                if until is not None and until(out):
                    break
                if until is None and time.monotonic() - last > expect_idle:
                    break
        finally:
            c.close()
        return out

    def committed(self, group: str) -> int:
        """The group's committed offset of input partition 0 (-1 when none)."""
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": group, **QUIET})
        try:
            return c.committed([TopicPartition(self.input, 0)], timeout=10)[0].offset
        finally:
            c.close()

    def deltas(self, **kw) -> pa.Table:
        msgs = self.read(self.output, **kw)
        tables = [pa.ipc.open_stream(m.value()).read_all() for m in msgs]
        return pa.concat_tables(tables) if tables else None


def daemon_config(tmp_path: Path, bootstrap: str, queries=QUERIES, *, checkpoint: bool = False,
                  **overrides) -> tuple[Topics, Path, int]:
    """Fresh topics, an admin port and a config file in tmp_path naming them (queries: of the human
    sample; checkpoint: to tmp_path/ckpt; overrides: as config_text's): (topics, config, port)."""
    t = Topics(bootstrap)
    port = new_admin_port()
    cfg = tmp_path / "d.toml"
    cfg.write_text(config_text(t, queries, admin_port=port, checkpoint_dir=tmp_path / "ckpt" if checkpoint else None,
                               **overrides))
    return t, cfg, port


def config_text(t: Topics, query_names, *, admin_port: int, checkpoint_dir=None, **overrides) -> str:
    """A daemon config (TOML) for topics `t`; query_names: of the human sample, or paths of query
    files; overrides: section=dict of settings."""
    cfg = {
        "kafka": {"bootstrap": t.bootstrap, "group": f"g-{t.input}"},
        "topics": {"input": t.input, "output": t.output, "control": t.control, "dead_letter": t.dead_letter},
        "graph": {"initial": str(HUMAN / "data.graph")},
        "queries": {"paths": [str(q if isinstance(q, Path) else HUMAN / "queries" / f"{q}.graph") for q in query_names]},
        "admin": {"listen": f"127.0.0.1:{admin_port}"},
        "log": {"format": "json", "level": "info"},
    }
    if checkpoint_dir:
        cfg["checkpoint"] = {"dir": str(checkpoint_dir), "interval_s": 0.5}
    for section, values in overrides.items():
        cfg.setdefault(section, {}).update(values)
    def value(v) -> str:  # a dict as an inline table (librdkafka settings: quoted dotted keys)
        return "{ " + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + " }" if isinstance(v, dict) \
            else json.dumps(v)

    return "".join(f"[{sec}]\n" + "".join(f"{k} = {value(v)}\n" for k, v in vals.items()) + "\n"
                   for sec, vals in cfg.items())


class Proxy:
    """A TCP forwarder from `port` to the broker at `target`: `cut()` makes the broker
    unreachable (open connections dropped, new ones refused) without losing its state;
    `start()` again restores it."""

    def __init__(self, port: int, target: int):
        self.port, self.target = port, target
        self._socks: list[socket.socket] = []
        self._listener: socket.socket | None = None

    def start(self) -> "Proxy":
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", self.port))
        self._listener.listen(64)
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()
        return self

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                return
            self._socks += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        for s in (a, b):
            s.close()

    def cut(self) -> None:
        self._listener.close()
        for s in self._socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self._socks = []


RUNNING: list["DaemonProcess"] = []  # killed by the tests' teardown if a test fails


CSMD = [sys.executable, "-m", "csmd"]
# `csmd` whose cluster members commit no shard progress (hold_progress.py): a test kills them
# before any progress moved, at a point no commit races
HOLD_PROGRESS = [sys.executable, "-m", "csmd.testing.hold_progress"]


def _not_json(constant: str):
    raise AssertionError(f"the admin endpoint answered {constant}, which is not JSON")


class DaemonProcess:
    """`csmd run` in a child process, with its admin endpoint; command: what runs `csmd` (a wrapper
    that times its stages, in bench/cluster.py)."""

    def __init__(self, config: Path, log: Path, admin_port: int, env=None, command=CSMD):
        self.url = f"http://127.0.0.1:{admin_port}"
        self.log = log
        self.proc = subprocess.Popen([*command, "run", "--config", str(config)],
                                     stdout=subprocess.DEVNULL, stderr=open(log, "ab"),
                                     env={**os.environ, **(env or {})})
        RUNNING.append(self)
        self.wait_healthy()

    def get(self, path: str):
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as r:
                body = r.read()
        except TimeoutError:  # a stuck daemon: its thread stacks go to its log (SIGUSR1)
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(1)
            raise AssertionError(f"{path} timed out; daemon threads:\n{self.log.read_text()[-6000:]}") from None
        if not r.headers.get("Content-Type", "").startswith("application/json"):
            return body.decode()
        return json.loads(body, parse_constant=_not_json)  # strict: NaN or Infinity is no JSON

    def wait_healthy(self, timeout: float = 60.0) -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                if self.get("/health")["status"] == "running":
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError("daemon did not become healthy:\n" + self.log.read_text()[-3000:])

    def wait_offset(self, offset: int, timeout: float = 60.0) -> dict:
        """Until every input record below `offset` (partition 0) is done."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            s = self.get("/stats")
            if s["offsets"].get("0", 0) >= offset and s["pending_records"] == 0:
                return s
            time.sleep(0.05)
        raise AssertionError(f"daemon did not reach offset {offset}: {self.get('/stats')}")

    def stop(self, sig=signal.SIGTERM, timeout: float = 60.0) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:  # a stuck daemon: its thread stacks go to its log (SIGUSR1)
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(1)
            raise AssertionError(f"daemon did not stop within {timeout} s of {signal.Signals(sig).name}; "
                                 f"its log and threads:\n{self.log.read_text()[-12000:]}") from None


def new_admin_port() -> int:
    return free_port()


def kill_leftovers() -> None:
    while RUNNING:
        d = RUNNING.pop()
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


class Cluster:
    """Daemon processes with [cluster] enabled sharing one stream's matching: one config each (its admin
    port and instance name). cluster: [cluster] settings; overrides: other config sections; env: the
    processes' extra environment (or a function of the member's name giving it); command: what runs
    `csmd` (as DaemonProcess)."""

    def __init__(self, tmp_path, bootstrap, queries, shards: int, overrides=None, env=None, command=CSMD,
                 checkpoints: bool = False, **cluster):
        self.tmp, self.t, self.queries, self.shards = tmp_path, Topics(bootstrap), queries, shards
        self.checkpoints = checkpoints  # each member writes its own, to tmp_path/ckpt-<name>
        self.group = f"c-{uuid.uuid4().hex[:8]}"
        self.settings = {"enabled": True, "shards": shards, "group": self.group, "session_timeout_ms": 2000,
                         **cluster}
        self.overrides, self.env = {"delivery": {"commit_interval_ms": 100}, **(overrides or {})}, env
        self.command = command
        self.members: dict[str, DaemonProcess] = {}
        self._reader = None  # reads the group's offsets (one consumer: making one per read costs CPU)
        self._reading = threading.Lock()

    def start(self, *names: str) -> list[DaemonProcess]:
        """Start these members side by side (each waits until it is healthy)."""
        def one(name):
            port = new_admin_port()
            cfg = self.tmp / f"{name}.toml"
            cfg.write_text(config_text(self.t, self.queries, admin_port=port,
                                       checkpoint_dir=self.tmp / f"ckpt-{name}" if self.checkpoints else None,
                                       cluster={**self.settings, "instance": name}, **self.overrides))
            env = self.env(name) if callable(self.env) else self.env
            self.members[name] = DaemonProcess(cfg, self.tmp / f"{name}.log", port, env, self.command)

        threads = [threading.Thread(target=one, args=(n,)) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        missing = [n for n in names if n not in self.members]
        assert not missing, f"{missing} did not start: see their logs in {self.tmp}"
        return [self.members[n] for n in names]

    def stop(self, *names: str) -> list[int]:
        """SIGTERM to these members at once; their exit codes."""
        for n in names:
            self.members[n].proc.send_signal(signal.SIGTERM)
        return [self.members[n].proc.wait(60) for n in names]

    def owners(self, names=None) -> dict[str, set]:
        """Each running member's live shards (owned, and re-matched up to the gain)."""
        return {n: set(self.members[n].get("/stats")["cluster"]["live"]) for n in names or self.members}

    def wait_balanced(self, names, timeout: float = 60.0) -> dict[str, set]:
        """Until the members `names` hold every shard between them, all live, as evenly as Kafka's assignor
        deals them out (counts one apart at most). Covering every shard is not enough: in the middle of a
        cooperative rebalance a joining member may be live on one shard while another it is getting is
        still live on its old owner, and that shard moves (and is re-matched) after the return."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            owners = self.owners(names)
            counts = [len(o) for o in owners.values()]
            if (min(counts) and max(counts) - min(counts) <= 1
                    and sorted(s for o in owners.values() for s in o) == list(range(self.shards))):
                return owners
            time.sleep(0.1)
        raise AssertionError(f"shards not balanced over {names}: {self.owners(names)}")

    def progress(self) -> dict[int, int]:
        """Every shard's committed progress, as the group holds it (negative: none yet)."""
        with self._reading:
            if self._reader is None:
                self._reader = Consumer({"bootstrap.servers": self.t.bootstrap, "group.id": self.group, **QUIET})
            tps = self._reader.committed([TopicPartition(f"{self.group}.shards", s) for s in range(self.shards)],
                                         timeout=10)
        return {tp.partition: tp.offset for tp in tps}

    def wait_progress(self, offset: int, timeout: float = 90.0, poll: float = 0.1) -> None:
        """Until every shard's progress reached `offset`: every delta is delivered."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if all(o >= offset for o in self.progress().values()):
                return
            for name, m in self.members.items():  # a daemon that failed: say so now, not at the timeout
                if m.proc.poll() is not None and m.proc.returncode != -signal.SIGKILL:
                    raise AssertionError(f"{name} exited with {m.proc.returncode}:\n{m.log.read_text()[-3000:]}")
            time.sleep(poll)
        alive = [m.get("/stats")["cluster"] for m in self.members.values() if m.proc.poll() is None]
        raise AssertionError(f"progress {self.progress()} never reached {offset}; stats: {alive}")

    def deltas(self) -> tuple[pa.Table, list[str]]:
        """Every delta on the output topic and, per row, the instance that published it."""
        tables, by = [], []
        for m in self.t.read(self.t.output):
            table = pa.ipc.open_stream(m.value()).read_all()
            tables.append(table)
            by += [dict(m.headers())["csmd-instance"].decode()] * table.num_rows
        return pa.concat_tables(tables), by


class ProgressWatch:
    """Reads every shard's progress all along (a thread): it must never go back."""

    def __init__(self, cluster: Cluster):
        self.cluster, self.stop, self.backwards = cluster, threading.Event(), []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        last: dict[int, int] = {}
        while not self.stop.is_set():
            for s, o in self.cluster.progress().items():
                if o < 0:  # none committed yet
                    continue
                if o < last.get(s, -1):
                    self.backwards.append((s, last[s], o))
                last[s] = max(last.get(s, -1), o)
            time.sleep(0.05)

    def close(self) -> list:
        self.stop.set()
        self.thread.join()
        return self.backwards


class Trickle:
    """Produces `lines` slowly in the background (36 every 0.1 s) up to the last quarter, which
    waits for `finish()`: whatever the machine's speed, instances that come and
    go before finish() do so mid-stream, with records before and after them."""

    def __init__(self, c: Cluster, lines, step: int = 36, pause: float = 0.1):
        self.c, self.lines, self.sent, self.cap = c, lines, 0, len(lines) - len(lines) // 4
        self.hurry = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(step, pause), daemon=True)
        self.thread.start()

    def _run(self, step, pause):
        while self.sent < self.cap and not self.hurry.is_set():
            end = min(self.cap, self.sent + step)
            self.c.t.produce(self.c.t.input, self.lines[self.sent:end])
            self.sent = end
            time.sleep(pause)

    def finish(self) -> None:
        """Send the rest now."""
        self.hurry.set()
        self.thread.join()
        self.c.t.produce(self.c.t.input, self.lines[self.sent:])
