"""Chaos (issue 12, item 7): many small records in text, JSON and Arrow with malformed ones
between them, kill -9 and SIGTERM at seeded random points, with and without checkpoints, and
a query registered through the control topic.

Pass: the deltas, deduplicated by delta id, are exactly `csmd replay`'s of the good stream;
every malformed record is dead-lettered; the daemon never exits on its own; SIGTERM exits 0
promptly; the group's committed offset never goes back; /health and /metrics answer
whenever the daemon is up. The seeds fix what is produced, where the stream is cut and what
stops the daemon there; when a kill lands inside the work varies, and every outcome must pass.
"""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from confluent_kafka import Consumer, TopicPartition

from csmd.jobs.replay import replay
from csmd.model.formats import read_graph, read_query
from csmd.testing.kafka import HUMAN, QUIET, DaemonProcess, daemon_config, dedup, human_lines, metric, rows_of

from helpers import arrow_message

CONFIGURED = ["Q_1", "Q_3"]
CONTROLLED = "Q_5"  # registered through the control topic mid-stream
BIG = 2**64 - 1

# malformed records: the first two are also sent alone to an idle daemon
MALFORMED = [
    b"x 1 2 0",
    json.dumps({"op": "e", "u": 1, "v": BIG}).encode(),
    f"e 1 {BIG}".encode(),
    b"e 1 2 abc",
    b"e 1\ne 2 3",
    json.dumps({"op": "e", "u": 1}).encode(),
    json.dumps([{"op": "e", "u": 1, "v": 2}, {"op": "q", "u": 1, "v": 2}]).encode(),  # refused whole
    b"{not json",
    arrow_message({"op": pa.array(["e"]), "u": pa.array([1], pa.uint64()), "v": pa.array([BIG], pa.uint64())}),
    arrow_message({"op": pa.array(["e"]), "u": pa.array([1])}),
    b"ARROW1 but not an Arrow file",
]


def good_stream(rng: random.Random, tmp_path: Path, inserts: int) -> list[tuple[str, int, int]]:
    """Insertions of the human stream with deletions between them (some re-inserted) of earlier
    edges that were in matches when inserted, so vanished matches are part of the test."""
    ins = [("e", int(u), int(v)) for _, u, v, *_ in (line.split() for line in human_lines()[:inserts])]
    matched = {seq for _q, seq, _s, _v in reference(tmp_path / "inserts", ins)}
    out, live = [], []
    for i, up in enumerate(ins):
        out.append(up)
        if i in matched:
            live.append(up[1:])
        if live and rng.random() < 0.25:
            u, v = live.pop(rng.randrange(len(live)))
            out.append(("-e", u, v))
            if rng.random() < 0.5:
                out.append(("e", u, v))
    return out


def encode(rng: random.Random, ups: list[tuple[str, int, int]]) -> bytes:
    """One record holding `ups`, as text, JSON or Arrow."""
    kind = rng.choice(["text", "json", "arrow"])
    if kind == "text":
        return "\n".join(f"{op} {u} {v}" for op, u, v in ups).encode()
    if kind == "json":
        objs = [{"op": op, "u": u, "v": v} for op, u, v in ups]
        return json.dumps(objs if len(objs) > 1 or rng.random() < 0.5 else objs[0]).encode()
    return arrow_message({"op": pa.array([x[0] for x in ups]), "u": pa.array([x[1] for x in ups], pa.int64()),
                   "v": pa.array([x[2] for x in ups], pa.int64())})


def records(rng: random.Random, ups) -> list[tuple[bytes, bool]]:
    """(bytes, malformed) in stream order: small records of 1-4 updates, malformed ones between."""
    out, i = [], 0
    while i < len(ups):
        k = rng.randint(1, 4)
        out.append((encode(rng, ups[i:i + k]), False))
        i += k
        if rng.random() < 0.03:
            out.append((rng.choice(MALFORMED), True))
    return out


def reference(folder: Path, ups) -> Counter:
    """`csmd replay`'s deltas of `ups` for every query of the test, as rows_of counts them."""
    folder.mkdir(exist_ok=True)
    stream = folder / "good.stream"
    stream.write_text("".join(f"{op} {u} {v}\n" for op, u, v in ups))
    out = folder / "reference.arrow"
    queries = [(q, read_query(HUMAN / "queries" / f"{q}.graph")) for q in CONFIGURED + [CONTROLLED]]
    replay(read_graph(HUMAN / "data.graph"), stream, queries, batch_size=64, count_only=False, output=out,
           show_progress=False)
    return rows_of(ipc.open_file(str(out)).read_all())


class Watch:
    """Checks /health, /metrics and the group's committed offset while a daemon is up, from a thread."""

    def __init__(self, topics, group: str):
        self.d: DaemonProcess | None = None
        self.lock = threading.Lock()  # held across one round of checks: a stop never lands inside one
        self.problems: list[str] = []
        self.rounds = 0
        self.committed: list[int] = []
        self._consumer = Consumer({"bootstrap.servers": topics.bootstrap, "group.id": group, **QUIET})
        self._tp = TopicPartition(topics.input, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def up(self, d: DaemonProcess) -> None:
        with self.lock:
            self.d = d

    def down(self, sig) -> int | None:
        """Stop the daemon with `sig`; for SIGTERM, its exit code (it must come promptly)."""
        with self.lock:
            d, self.d = self.d, None
        if d.proc.poll() is not None:
            self.problems.append(f"the daemon exited on its own with {d.proc.returncode}")
        t0 = time.monotonic()
        code = d.stop(sig, timeout=30)
        if sig == signal.SIGTERM and time.monotonic() - t0 > 10:
            self.problems.append(f"SIGTERM took {time.monotonic() - t0:.1f} s")
        return code

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            with self.lock:
                if self.d is not None:
                    self._check(self.d)
            offset = self._consumer.committed([self._tp], timeout=10)[0].offset
            if offset >= 0:
                if self.committed and offset < self.committed[-1]:
                    self.problems.append(f"committed offset went back: {self.committed[-1]} -> {offset}")
                self.committed.append(offset)

    def _check(self, d: DaemonProcess) -> None:
        try:
            if d.proc.poll() is not None:
                self.problems.append(f"the daemon exited on its own with {d.proc.returncode}")
            elif d.get("/health")["status"] != "running":
                self.problems.append("/health is not running")
            elif metric(d.get("/metrics"), "csmd_updates_total") is None:
                self.problems.append("/metrics has no csmd_updates_total")
            self.rounds += 1
        except Exception as exc:  # noqa: BLE001 (any failure to answer is the finding)
            self.problems.append(f"admin endpoint: {exc!r}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._consumer.close()


def run_chaos(tmp_path, kafka_bootstrap, seed: int, inserts: int, phases: int, checkpoint: bool) -> None:
    rng = random.Random(seed)
    ups = good_stream(rng, tmp_path, inserts)
    recs = records(rng, ups)
    want_all = reference(tmp_path / "good", ups)
    t, cfg, port = daemon_config(tmp_path, kafka_bootstrap, CONFIGURED, checkpoint=checkpoint,
                         delivery={"commit_interval_ms": 50})
    group = f"g-{t.input}"
    cuts = sorted(rng.sample(range(1, len(recs)), phases - 1)) + [len(recs)]
    stops = [signal.SIGKILL, signal.SIGTERM] + [rng.choice([signal.SIGKILL, signal.SIGTERM]) for _ in cuts[3:]]
    rng.shuffle(stops)
    watch = Watch(t, group)
    produced, bad_offsets, lo = 0, {}, 0
    try:
        for phase, hi in enumerate(cuts):
            d = DaemonProcess(cfg, tmp_path / f"d{phase}.log", port)
            watch.up(d)
            # a malformed record read while nothing else is pending: dead-lettered, the daemon stays up
            d.wait_offset(produced)
            lone = MALFORMED[phase % 2]
            t.produce(t.input, [lone])
            bad_offsets[produced] = lone
            produced += 1
            d.wait_offset(produced)
            chunk = recs[lo:hi]
            bad_offsets.update({produced + i: v for i, (v, bad) in enumerate(chunk) if bad})
            # produced while the daemon works: a stop can land before all of it is in
            sender = threading.Thread(target=t.produce, args=(t.input, [v for v, _ in chunk]))
            sender.start()
            stop_at = produced + rng.randint(1, len(chunk))  # the stop comes once the daemon has taken this
            produced += len(chunk)
            lo = hi
            if phase == 0:  # registered while the chunk is in flight; took effect where `applied` says
                q = (HUMAN / "queries" / f"{CONTROLLED}.graph").read_text()
                t.produce(t.control, [json.dumps({"op": "add", "name": CONTROLLED, "query": q})])
                t.read(t.control, until=lambda m: any(json.loads(x.value())["op"] == "applied" for x in m))
            if phase < len(stops):
                while d.get("/stats")["offsets"].get("0", 0) < stop_at:
                    time.sleep(0.005)
                code = watch.down(stops[phase])
                assert stops[phase] == signal.SIGKILL or code == 0, f"SIGTERM exit {code}"
            sender.join()
        d.wait_offset(produced)
        table = t.deltas()
        dead = t.read(t.dead_letter, until=lambda m: {int(dict(x.headers())["csmd-offset"]) for x in m}
                      >= set(bad_offsets))
        assert watch.down(signal.SIGTERM) == 0
    finally:
        watch.close()
    assert not watch.problems, watch.problems
    assert watch.rounds >= 5 and watch.committed, "the watcher ran"
    assert watch.committed[-1] <= t.committed(group) == produced

    applied = [json.loads(m.value()) for m in t.read(t.control)]
    seqs = {a["seq"] for a in applied if a["op"] == "applied" and a["name"] == CONTROLLED}
    assert len(seqs) == 1, f"the registration took effect at one update: {seqs}"
    since = seqs.pop()
    want = Counter({k: n for k, n in want_all.items() if k[0] != CONTROLLED or k[1] >= since})
    deduped, _dups = dedup(table)
    assert rows_of(deduped) == want
    letters = {int(dict(m.headers())["csmd-offset"]): m.value() for m in dead}  # duplicates dropped by offset
    assert letters == bad_offsets
    assert all(dict(m.headers())["csmd-error"] for m in dead)


@pytest.mark.parametrize("checkpoint,seed", [(True, 1), (False, 2)], ids=["checkpoint", "no-checkpoint"])
def test_chaos(tmp_path, kafka_bootstrap, checkpoint, seed):
    run_chaos(tmp_path, kafka_bootstrap, seed, inserts=1200, phases=4, checkpoint=checkpoint)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3, 9))
def test_chaos_long(tmp_path, kafka_bootstrap, seed):
    run_chaos(tmp_path, kafka_bootstrap, seed, inserts=len(human_lines()), phases=8, checkpoint=seed % 2 == 0)
