"""Event time: every delta of timed streams (windows, lateness, late updates, replaced and expired
edges) against a model that applies the semantics by definition, on every engine; the formats."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from csmd.connectors.records import BadRecord, Record, decode_updates
from csmd.errors import InputError
from csmd.jobs.replay import replay
from csmd.model.formats import parse_query_text, parse_update, read_graph, read_query
from csmd.model.labels import LabelNames
from csmd.pipeline.event_time import EventTime

from brute import directed_embeddings, embeddings
from continuous_cases import count_change


class TimedModel:
    """An undirected labelled graph with each edge's ts (None: the initial graph's, never expires),
    and the watermark, changed one step at a time as docs/design.md says event time does."""

    def __init__(self, rng: random.Random, n: int, labels: int, window: int | None, lateness: int,
                 directed: bool = False):
        self.rng, self.labels, self.window, self.lateness, self.directed = rng, labels, window, lateness, directed
        self.vlabel = {10 + 2 * i: rng.randrange(labels) for i in range(n)}
        self.edges: dict = {}  # edge (an arc (u, v), or a frozenset pair) -> (label, ts)
        ids = list(self.vlabel)
        for i, a in enumerate(ids):
            for b in ids[i + 1:]:
                if rng.random() < 0.25:
                    self.edges[self.key(*rng.sample((a, b), 2))] = (0, rng.choice([None, rng.randrange(-20, 40)]))
        self.high = None
        self.next_id = 10 + 2 * n

    @classmethod
    def read(cls, path, directed: bool = False, window: int | None = None, lateness: int = 0, names=None):
        """The model of a graph text file (labels by number, or by `names`; an edge's fifth field its ts)."""
        g = cls.__new__(cls)
        g.directed, g.window, g.lateness, g.high, g.vlabel, g.edges, g.next_id = directed, window, lateness, None, {}, {}, 0
        label = (lambda x: names[x]) if names else int
        for line in path.read_text().splitlines():
            f = line.split()
            if f and f[0] == "v":
                g.vlabel[int(f[1])] = label(f[2])
            elif f and f[0] == "e":
                g.edges[g.key(int(f[1]), int(f[2]))] = (label(f[3]), int(f[4]) if len(f) > 4 else None)
        g.next_id = max(g.vlabel, default=0) + 2
        return g

    def key(self, a, b):
        return (a, b) if self.directed else frozenset((a, b))

    def ends(self, e) -> tuple:
        """The edge's ends in the order its expiry is sorted by (an undirected one's smaller first)."""
        return e if self.directed else (min(e), max(e))

    def text(self) -> str:
        return "".join(f"v {v} {lab}\n" for v, lab in self.vlabel.items()) + \
            "".join(f"e {self.ends(e)[0]} {self.ends(e)[1]} {lab}{'' if ts is None else f' {ts}'}\n"
                    for e, (lab, ts) in self.edges.items())

    def matches(self, q) -> set:
        if self.directed:
            s, d, el = q.arcs()
            return set(directed_embeddings({e: lab for e, (lab, _) in self.edges.items()}, self.vlabel,
                                           dict(zip(zip(s.tolist(), d.tolist()), el.tolist())),
                                           [int(x) for x in q.labels]))
        ids = list(self.vlabel)
        pos = {v: i for i, v in enumerate(ids)}
        adj = [dict() for _ in ids]
        for e, (lab, _) in self.edges.items():
            a, b = (pos[x] for x in e)
            adj[a][b] = adj[b][a] = lab
        return {tuple(ids[i] for i in m) for m in embeddings(adj, [self.vlabel[v] for v in ids], q)}

    def record(self, t: int) -> str:
        """A random record at about event time t (jittered: out of order)."""
        rng, ids = self.rng, list(self.vlabel)
        ts = t + rng.randrange(-12, 4) if rng.random() < 0.9 else t - rng.randrange(20, 90)  # some late
        if len(ids) < 3:
            return f"v {self.next_id} {rng.randrange(self.labels)}"
        r = rng.random()
        if r < 0.55 or len(self.edges) < 2:
            a, b = rng.sample(ids, 2)
            if rng.random() < 0.15 and self.edges:  # re-insert a live edge: a new ts, or its own
                e = rng.choice(list(self.edges))
                a, b = self.ends(e)
                ts = self.edges[e][1] if rng.random() < 0.3 and self.edges[e][1] is not None else ts
            return f"e {a} {b} {rng.randrange(2)} {ts}"
        if r < 0.85:
            a, b = self.ends(rng.choice(list(self.edges))) if rng.random() < 0.85 else rng.sample(ids, 2)
            return f"-e {a} {b} 0 {ts}" if self.directed or rng.random() < 0.5 else f"-e {b} {a} 0 {ts}"
        if r < 0.93:
            vid = self.next_id if rng.random() < 0.6 else rng.choice(ids)
            return f"v {vid} {rng.randrange(self.labels)}"
        return f"-v {rng.choice(ids)}"

    def steps(self, line: str):
        """The record's steps, each a change whose deltas are its own: the record itself (a late
        one: none), a replaced edge's deletion and insertion apart, then each edge that expires."""
        op, *f = line.split()
        if op in ("v", "-v"):
            yield lambda: self._vertex(op, [int(x) for x in f])
            return
        a, b, lab, ts = (int(x) for x in f)
        e = self.key(a, b)
        if self.window is not None and self.high is not None and ts < self.high - self.lateness - self.window:
            return  # late
        self.high = ts if self.high is None else max(self.high, ts)
        if op == "e" and a != b:
            if e in self.edges and self.edges[e][1] != ts:
                yield lambda: self.edges.pop(e)
            if e not in self.edges:
                def insert():
                    for x in (a, b):
                        self.vlabel.setdefault(x, 0)
                        self.next_id = max(self.next_id, x + 2)
                    self.edges[e] = (lab, ts)
                yield insert
        elif op == "-e" and e in self.edges:
            yield lambda: self.edges.pop(e)
        if self.window is not None:
            horizon = self.high - self.lateness - self.window
            due = sorted((t, *self.ends(x)) for x, (_, t) in self.edges.items() if t is not None and t < horizon)
            for _, x, y in due:
                yield lambda x=x, y=y: self.edges.pop(self.key(x, y))

    def _vertex(self, op, f) -> None:
        if op == "v":
            self.vlabel[f[0]] = f[1]
            self.next_id = max(self.next_id, f[0] + 2)
        elif f[0] in self.vlabel:
            del self.vlabel[f[0]]
            self.edges = {e: x for e, x in self.edges.items() if f[0] not in e}


def timed_case(tmp_path, seed: int, steps: int = 60, directed: bool = False):
    rng = random.Random(seed)
    window = rng.choice([None, 15, 30, 60])
    lateness = rng.choice([0, 0, 5])
    model = TimedModel(rng, rng.randrange(5, 10), rng.randrange(1, 3), window, lateness, directed)
    (tmp_path / "g0.graph").write_text(model.text())
    queries = {}
    for i, k in enumerate((2, 3, rng.randrange(3, 5))):
        text = "".join(f"v {j} {rng.randrange(model.labels)}\n" for j in range(k)) + \
            "".join(f"e {' '.join(map(str, rng.sample((rng.randrange(j), j), 2)))} {rng.randrange(2)}\n"
                    for j in range(1, k))
        if k >= 3 and rng.random() < 0.5 and f" 0 {k - 1} " not in text and f" {k - 1} 0 " not in text:
            text += f"e 0 {k - 1} {rng.randrange(2)}\n"
        queries[f"q{i}"] = parse_query_text(text, f"q{i}", directed=directed)
        (tmp_path / f"q{i}.graph").write_text(text)
    truth = {name: Counter() for name in queries}
    lines = []
    for lineno in range(1, steps + 1):
        line = model.record(10 * lineno)
        for step in model.steps(line):
            count_change(truth, queries, model, lineno, step)
        lines.append(line)
    (tmp_path / "stream.txt").write_text("\n".join(lines) + "\n")
    return queries, truth, EventTime(window, lateness), model


def timed_replay(tmp_path, queries, spec, batch_size, backend, count_only=False, name="out.arrow", directed=False):
    out = None if count_only else tmp_path / name
    results, pipe = replay(read_graph(tmp_path / "g0.graph", directed=directed), tmp_path / "stream.txt", list(queries.items()),
                           batch_size=batch_size, count_only=count_only, output=out, show_progress=False,
                           backend=backend, event_time=spec)
    return (None if count_only else ipc.open_file(out).read_all()), results, pipe


def got_deltas(table, names) -> dict:
    got = {name: Counter() for name in names}
    for row in table.to_pylist():
        line = int(row["source"].rsplit(":", 1)[1])  # an expiry's source: "expired by stream.txt:N"
        got[row["query"]][(line, row["sign"], tuple(row["vertices"]))] += 1
    return got


@pytest.mark.parametrize("seed", range(40))
def test_every_timed_delta_equals_the_model(tmp_path, seed, backend):
    directed = seed % 3 == 2
    queries, truth, spec, model = timed_case(tmp_path, seed, directed=directed)
    table, results, pipe = timed_replay(tmp_path, queries, spec, random.Random(seed).choice([1, 7, 64]), backend,
                                        directed=directed)
    assert got_deltas(table, queries) == truth, (seed, spec)
    for res in results:
        assert res["positive"] == sum(c for (_, s, _), c in truth[res["query"]].items() if s > 0)
        assert res["negative"] == sum(c for (_, s, _), c in truth[res["query"]].items() if s < 0)
        assert res["watermark"] == (None if model.high is None else model.high - spec.lateness)
    # the live matches (every delta's sign summed) are the matches of the edges still in the window
    for name, q in queries.items():
        before = len(TimedModel.read(tmp_path / "g0.graph", directed).matches(q))
        assert before + sum(s * c for (_, s, _), c in truth[name].items()) == len(model.matches(q))


@pytest.mark.parametrize("seed", range(100, 106))
def test_timed_deltas_do_not_depend_on_batching(tmp_path, seed):
    queries, _, spec, _ = timed_case(tmp_path, seed, steps=80)
    reference, _, _ = timed_replay(tmp_path, queries, spec, 1, "cpu", name="ref.arrow")
    for b in (7, 64):
        table, _, _ = timed_replay(tmp_path, queries, spec, b, "cpu", name=f"b{b}.arrow")
        assert table.equals(reference), b


def test_late_updates_expiry_and_replacement_are_counted(tmp_path):
    (tmp_path / "g0.graph").write_text("v 1 0\nv 2 0\nv 3 0\nv 4 0\ne 1 2 0\n")
    (tmp_path / "stream.txt").write_text("e 2 3 0 10\ne 3 1 0 12\ne 1 4 0 20\ne 2 4 0 30\ne 2 3 0 5\ne 1 2 0 29\n")
    tri = {"tri": parse_query_text("v 0 0\nv 1 0\nv 2 0\ne 0 1\ne 1 2\ne 2 0\n", "tri")}
    table, results, pipe = timed_replay(tmp_path, tri, EventTime(10), 1, "cpu")
    # 2-3 (ts 10) and 1-3 (12) expire when ts 30 arrives: the triangle 1-2-3 vanishes on the
    # first, named by the record that moved the watermark; ts 5 is late; 1-2 (initial, untimed)
    # re-inserted with a ts is replaced: the triangle 1-2-4 vanishes with it and comes back
    got = Counter((r["source"].replace(f"{tmp_path}/", ""), r["sign"], tuple(sorted(r["vertices"])))
                  for r in table.to_pylist())
    assert got == {("stream.txt:2", 1, (1, 2, 3)): 6, ("stream.txt:4", 1, (1, 2, 4)): 6,
                   ("expired by stream.txt:4", -1, (1, 2, 3)): 6,
                   ("stream.txt:6", -1, (1, 2, 4)): 6, ("stream.txt:6", 1, (1, 2, 4)): 6}
    assert (results[0]["late"], results[0]["expired"], results[0]["watermark"]) == (1, 2, 30)
    assert results[0]["updates"] == 6 + 2 + 1 and pipe.ignored["late"] == 1


def test_window_off_keeps_every_edge_and_needs_the_ts_all_the_same(tmp_path):
    (tmp_path / "g0.graph").write_text("v 1 0\nv 2 0\nv 3 0\n")
    (tmp_path / "stream.txt").write_text("e 1 2 0 1\ne 2 3 0 1000\ne 1 3 0 5\n")
    tri = {"tri": parse_query_text("v 0 0\nv 1 0\nv 2 0\ne 0 1\ne 1 2\ne 2 0\n", "tri")}
    _, results, _ = timed_replay(tmp_path, tri, EventTime(None), 1, "cpu", count_only=True)
    assert (results[0]["positive"], results[0]["late"], results[0]["expired"]) == (6, 0, 0)
    (tmp_path / "stream.txt").write_text("e 1 2 0 1\ne 2 3 0\n")
    with pytest.raises(InputError, match=r"stream.txt:2: no ts: event time"):
        timed_replay(tmp_path, tri, EventTime(None), 1, "cpu", count_only=True)


def test_the_ts_in_every_input_format():
    assert parse_update("e 1 2 3 -40", "f", 1).ts == -40
    assert parse_update("-e 1 2 0 7", "f", 1).ts == 7
    assert parse_update("e 1 2 3", "f", 1).ts is None
    with pytest.raises(InputError, match="no ts"):
        parse_update("e 1 2 3", "f", 1, event_time=True)
    with pytest.raises(InputError, match="bad integer 'x' for ts"):
        parse_update("e 1 2 3 x", "f", 1)
    with pytest.raises(InputError, match="ts 9223372036854775808 out of range"):
        parse_update("e 1 2 3 9223372036854775808", "f", 1)
    assert parse_update("v 1 2", "f", 1, event_time=True).ts is None  # vertex records carry none

    def rec(value: bytes) -> Record:
        return Record("in", 0, 7, value)

    got = decode_updates(rec(json.dumps([{"op": "e", "u": 1, "v": 2, "ts": 5}, {"op": "v", "u": 3, "label": 1}])
                             .encode()), event_time=True)
    assert [u.ts for u in got] == [5, None]
    with pytest.raises(BadRecord, match="element 0: no ts"):
        decode_updates(rec(b'[{"op": "e", "u": 1, "v": 2}]'), event_time=True)
    with pytest.raises(BadRecord, match="ts '5' is not an integer"):
        decode_updates(rec(b'{"op": "e", "u": 1, "v": 2, "ts": "5"}'))
    with pytest.raises(BadRecord, match="no ts"):
        decode_updates(rec(b"e 1 2 0"), "text", event_time=True)
    assert decode_updates(rec(b"e 1 2 0 8"), "text", event_time=True)[0].ts == 8
    sink = pa.BufferOutputStream()
    table = pa.table({"op": ["e", "-e"], "u": [1, 1], "v": [2, 2], "ts": pa.array([3, None], pa.int64())})
    with ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    assert [u.ts for u in decode_updates(rec(sink.getvalue().to_pybytes()))] == [3, None]
    with pytest.raises(BadRecord, match="row 1: no ts"):
        decode_updates(rec(sink.getvalue().to_pybytes()), event_time=True)


def test_replay_command_line(tmp_path):
    (tmp_path / "g.graph").write_text("v 1 0\nv 2 0\nv 3 0\n")
    (tmp_path / "s.txt").write_text("e 1 2 0 1\ne 2 3 0 2\ne 1 3 0 50\n")
    (tmp_path / "q.graph").write_text("v 0 0\nv 1 0\ne 0 1\n")
    base = [sys.executable, "-m", "csmd", "replay", "--data", str(tmp_path / "g.graph"), "--stream",
            str(tmp_path / "s.txt"), "--query", str(tmp_path / "q.graph"), "--backend", "cpu", "--json"]
    out = subprocess.run(base + ["--window", "10"], capture_output=True, text=True, check=True).stdout
    res = json.loads(out)
    # 1-2 and 2-3 expire at ts 50: each edge is two matches of an edge query (both directions)
    assert (res["positive"], res["negative"], res["expired"], res["watermark"]) == (6, 4, 2, 50)
    bad = subprocess.run(base + ["--window", "-1"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--window: must be >= 0" in bad.stderr
    plain = json.loads(subprocess.run(base, capture_output=True, text=True, check=True).stdout)
    assert "watermark" not in plain and plain["positive"] == 6  # without event time the ts is read and unused


def test_the_initial_graph_gives_its_edges_a_ts_in_text_and_tables(tmp_path):
    """Edges of the initial graph with a ts expire when the first update moves the watermark
    past it; those without one stay."""
    (tmp_path / "g.graph").write_text("v 1 0\nv 2 0\nv 3 0\ne 1 2 0 5\ne 2 3 0\n")
    src, dst = pa.array([1, 2]), pa.array([2, 3])
    pq_path = tmp_path / "g.parquet"
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"src": src, "dst": dst, "label": pa.array([0, 0], pa.int32()),
                             "ts": pa.array([5, None], pa.int64())}), pq_path)
    (tmp_path / "stream.txt").write_text("e 1 3 0 100\n")
    edge = {"edge": parse_query_text("v 0 0\nv 1 0\ne 0 1\n", "edge")}
    for g in (read_graph(tmp_path / "g.graph"), read_graph(pq_path)):
        assert [c.tolist() for c in g.edge_ts] == [[1], [2], [5]]
        results, _ = replay(g, tmp_path / "stream.txt", list(edge.items()), batch_size=1, count_only=True,
                            show_progress=False, backend="cpu", event_time=EventTime(10))
        assert (results[0]["positive"], results[0]["negative"], results[0]["expired"]) == (2, 2, 1)
    with pytest.raises(InputError, match="bad integer 'x' for ts"):
        (tmp_path / "bad.graph").write_text("v 1 0\nv 2 0\ne 1 2 0 x\n")
        read_graph(tmp_path / "bad.graph")
    with pytest.raises(InputError, match=r"'e' takes u v \[label\], got 4 fields"):
        parse_query_text("v 0 0\nv 1 0\ne 0 1 0 5\n", "q")


def restarted_halfway(tmp_path, queries: dict, spec: EventTime, directed: bool):
    """The deltas (ids and all) of tmp_path's timed stream in one run, and in two: up to half its
    updates, a checkpoint, a restore from it, the rest; and the watermark's high before and after
    the checkpoint (the clock's, the restored graph's)."""
    from csmd.backends import continuous_engine
    from csmd.jobs.replay import read_stream
    from csmd.pipeline.deltas import DeltaEncoder
    from csmd.pipeline.stages import Pipeline
    from csmd.service.checkpoint_files import read_checkpoint, write_checkpoint

    updates = [u for x in read_stream(tmp_path / "stream.txt", event_time=True) for u in
               (x.updates() if hasattr(x, "updates") else [x])]
    half = len(updates) // 2

    def run(g, first_seq, retired, part):
        pipe = Pipeline(g, engine=continuous_engine("cpu", g, timed=True), threaded=False, batch_size=5,
                        first_seq=first_seq, retired=retired, event_time=spec)
        for name, q in queries.items():
            pipe.add_query(name, q)
        enc = DeltaEncoder(pipe.vertices)
        rows = []
        pipe.run(iter(part), lambda r: rows.extend(x for _, b, _ in enc.encode(r, by_update=True) for x in b.to_pylist()))
        return pipe, rows

    g0 = read_graph(tmp_path / "g0.graph", directed=directed)
    _, whole = run(g0, 0, None, updates)
    pipe, first = run(g0, 0, None, updates[:half])
    state = pipe.graph_state()
    ck = read_checkpoint(write_checkpoint(tmp_path / "ckpt", state, {"seq": state.seq, "offsets": {}}).parent)
    _, rest = run(ck.graph, ck.state["seq"], ck.retired, updates[half:])
    return whole, first + rest, (pipe.sequencer.clock.high, ck.graph.high_ts)


@pytest.mark.parametrize("seed", range(6))
def test_a_restart_from_a_checkpoint_expires_what_an_uninterrupted_run_would(tmp_path, seed):
    """A checkpoint in the middle of a timed stream keeps every edge's ts and the watermark: the
    rest of the stream after a restore gives the deltas (ids and all) of a run without one."""
    directed = seed % 2 == 1
    queries, _, spec, _ = timed_case(tmp_path, seed, steps=80, directed=directed)
    whole, restarted, (high, restored) = restarted_halfway(tmp_path, queries, spec, directed)
    assert restored == high
    assert restarted == whole, seed


def daemon_killed_midway(tmp_path, kafka_bootstrap, queries: dict, graph: dict):
    """tmp_path's timed stream through a daemon under event time (graph: more [graph] settings)
    killed with kill -9 after a checkpoint mid-stream, and restarted: (its deltas deduplicated by
    id, the restarted daemon, its stats at the stream's end, the topics)."""
    import signal
    import time

    from csmd.testing.kafka import DaemonProcess, daemon_config, dedup

    t, cfg, port = daemon_config(tmp_path, kafka_bootstrap, [tmp_path / f"{name}.graph" for name in queries],
                                 checkpoint=True, graph={"initial": str(tmp_path / "g0.graph"), "time": "event",
                                                         **graph})
    lines = (tmp_path / "stream.txt").read_text().splitlines()
    d = DaemonProcess(cfg, tmp_path / "d1.log", port)
    t.produce(t.input, lines[:200])
    d.wait_offset(200)
    time.sleep(1.0)  # a checkpoint mid-stream
    t.produce(t.input, lines[200:300])
    d.stop(signal.SIGKILL)
    d = DaemonProcess(cfg, tmp_path / "d2.log", port)
    t.produce(t.input, lines[300:])
    stats = d.wait_offset(len(lines))
    assert "restored checkpoint" in (tmp_path / "d2.log").read_text()
    return dedup(t.deltas())[0], d, stats, t


def test_the_daemon_expires_by_event_time_and_a_kill_9_loses_nothing(tmp_path, kafka_bootstrap):
    """[graph] time = "event" with a window: the deltas through Kafka, across a kill -9 and a
    restart from a checkpoint, are csmd replay's (deduplicated by id); a record without a ts is a
    dead letter; stats and metrics show the watermark and what expired."""
    from csmd.testing.kafka import metric, rows_of

    queries, _, _, _ = timed_case(tmp_path, 11, steps=400)
    spec = EventTime(30, 5)
    table, results, _ = timed_replay(tmp_path, queries, spec, 64, "cpu")
    assert results[0]["expired"] > 20 and results[0]["late"] > 5
    deduped, d, stats, t = daemon_killed_midway(tmp_path, kafka_bootstrap, queries, {"window": 30, "lateness": 5})
    assert rows_of(deduped) == rows_of(table)
    assert (stats["watermark"], stats["late"] > 0) == (results[0]["watermark"], True)
    assert metric(d.get("/metrics"), "csmd_watermark") == results[0]["watermark"]
    t.produce(t.input, ["e 10 12 0"])  # no ts: refused, named
    dead = t.read(t.dead_letter, until=lambda m: len(m) >= 1)
    assert b"no ts: event time" in dead[0].value() or any(b"no ts" in v for _, v in dead[0].headers() or [])
    assert d.stop() == 0


def test_a_window_without_event_time_is_refused_naming_the_setting():
    from csmd.errors import CsmdError
    from csmd.service.config import load_config

    with pytest.raises(CsmdError, match=r'CSMD_GRAPH__WINDOW: \[graph\] window needs \[graph\] time = "event"'):
        load_config(env={"CSMD_GRAPH__WINDOW": "10"})
    cfg = load_config(env={"CSMD_GRAPH__TIME": "event", "CSMD_GRAPH__WINDOW": "10"})
    assert cfg.graph.event_time() == EventTime(10, 0)
    assert load_config(env={"CSMD_GRAPH__TIME": "event"}).graph.event_time() == EventTime(None, 0)
    assert load_config(env={}).graph.event_time() is None


def test_cluster_instances_of_another_event_time_differ():
    from csmd.service.config import load_config
    from csmd.service.deployment import describe, differences

    ours = describe(load_config(env={"CSMD_GRAPH__TIME": "event", "CSMD_GRAPH__WINDOW": "60"}), [], "a")
    theirs = describe(load_config(env={}), [], "b")
    assert differences(ours, theirs) == ["[graph] time, window, lateness: event, window 60, lateness 0 here, none in "
                                         "the deployment"]
    assert differences(ours, describe(load_config(env={"CSMD_GRAPH__TIME": "event", "CSMD_GRAPH__WINDOW": "60"}),
                                      [], "b")) == []


def test_the_readme_windows_example_prints_what_the_model_counts():
    """The README's timed money-flow example, run as written, prints the instances (--distinct)
    that appear and vanish as the model applies the window."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    block = (repo / "README.md").read_text().split("<!-- example: money-flow-timed")[1].split("\n", 1)[1]
    command, table = block.split("\n\n")[:2]
    command = command.replace("\\\n", " ").split()
    shown = {f[0]: (int(f[1]), int(f[2])) for f in (line.split() for line in table.splitlines()[1:])}
    run = subprocess.run([sys.executable, "-m", "csmd", *command[1:], "--json", "--backend", "cpu"], cwd=repo,
                         capture_output=True, text=True, check=True)
    got = {r["query"]: (r["positive"], r["negative"]) for r in map(json.loads, run.stdout.splitlines())}
    sample = repo / "samples" / "money-flow"
    names = {"account": 0, "device": 1, "transfer": 0, "login": 1}  # labels.toml's, for the model
    model = TimedModel.read(sample / "timed-graph.graph", True, int(command[command.index("--window") + 1]),
                            names=names)
    labels = LabelNames.load(sample / "labels.toml")
    queries = {q: read_query(sample / "queries" / f"{q}.graph", labels, directed=True) for q in ("cycle3", "cycle4")}

    def instances(q):  # --distinct: one per set of arcs
        s, d, _ = q.arcs()
        return {frozenset((m[a], m[b]) for a, b in zip(s.tolist(), d.tolist())) for m in model.matches(q)}

    truth = {q: [0, 0] for q in queries}
    for line in (sample / "timed-stream.txt").read_text().splitlines():
        if line.startswith("e"):
            op, u, v, lab, ts = line.split()
            for step in model.steps(f"{op} {u} {v} {names[lab]} {ts}"):
                before = {q: instances(g) for q, g in queries.items()}
                step()
                for q, g in queries.items():
                    after = instances(g)
                    truth[q][0] += len(after - before[q])
                    truth[q][1] += len(before[q] - after)
    assert got == shown == {q: tuple(t) for q, t in truth.items()}


def test_what_a_new_user_tried_a_self_loop_a_timestamp_column_and_a_window_without_time(tmp_path):
    """A timed self-loop in the initial graph is dropped with the graph's self-loops (it used to be
    expired, a crash); a table's ts may be a timestamp column, and one of another type is not
    read as event times (a table read without them must load); --time none --window is refused."""
    import pyarrow.parquet as pq

    (tmp_path / "g.graph").write_text("v 1 0\nv 2 0\ne 1 1 0 3\ne 1 2 0 100\n")
    (tmp_path / "stream.txt").write_text("e 5 6 0 100\n")
    edge = {"edge": parse_query_text("v 0 0\nv 1 0\ne 0 1\n", "edge")}
    for directed in (False, True):
        results, _ = replay(read_graph(tmp_path / "g.graph", directed=directed), tmp_path / "stream.txt",
                            list(edge.items()), batch_size=1, count_only=True, show_progress=False, backend="cpu",
                            event_time=EventTime(10))
        assert (results[0]["expired"], results[0]["updates"]) == (0, 1)
    stamps = pa.array([10, 50], pa.timestamp("ms"))
    pq.write_table(pa.table({"src": [1, 2], "dst": [2, 3], "ts": stamps}), tmp_path / "t.parquet")
    assert read_graph(tmp_path / "t.parquet").edge_ts[2].tolist() == [10, 50]
    pq.write_table(pa.table({"src": [1, 2], "dst": [2, 3], "ts": [1.5, 2.5]}), tmp_path / "f.parquet")
    g = read_graph(tmp_path / "f.parquet")
    assert g.num_edges == 2 and g.edge_ts is None
    sink = pa.BufferOutputStream()
    table = pa.table({"op": ["e"], "u": [1], "v": [2], "ts": pa.array([7], pa.timestamp("s"))})
    with ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    assert decode_updates(Record("in", 0, 7, sink.getvalue().to_pybytes()), event_time=True)[0].ts == 7
    (tmp_path / "q.graph").write_text("v 0 0\nv 1 0\ne 0 1\n")
    base = [sys.executable, "-m", "csmd", "replay", "--data", str(tmp_path / "g.graph"), "--stream",
            str(tmp_path / "stream.txt"), "--query", str(tmp_path / "q.graph"), "--backend", "cpu"]
    for extra, message in ((["--time", "none", "--window", "5"], "--window needs --time event"),
                           (["--window", str(2**63)], "--window: must be >= 0 and below 2^63")):
        bad = subprocess.run(base + extra, capture_output=True, text=True)
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_an_edge_update_without_a_ts_that_reaches_the_sequencer_is_applied_untimed():
    """The decoders refuse it under event time; one made in code must not stop the pipeline."""
    from csmd.backends import continuous_engine
    from csmd.model.formats import Update
    from csmd.pipeline.stages import Pipeline

    from csmd.model.graph import Graph

    g = Graph.from_edges([0, 0, 0], [], [], ext_ids=[1, 2, 3])
    pipe = Pipeline(g, engine=continuous_engine("cpu", g), threaded=False, event_time=EventTime(5))
    pipe.run(iter([Update("e", 1, 2), Update("e", 2, 3, ts=100), Update("e", 1, 3, ts=200)]), lambda r: None)
    assert pipe.graph_state().edge_ts.to_pylist() in ([None, 200], [200, None])  # 2-3 expired, 1-2 never does
