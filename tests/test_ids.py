"""Vertex ids: published exactly whatever their length, bounded, of a declared kind, read from any
Arrow string type.

Truth: test_continuous's random model and its brute-force deltas (brute.py), with every integer
id spelled as a string of its own length, 1 to 256 UTF-8 bytes, multi-byte characters among them.
"""

from __future__ import annotations

import itertools
import json
import string
import subprocess
import sys
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from csmd.cli import main
from csmd.connectors.records import BadRecord, Record, decode_updates
from csmd.cpu.numpy_engine import CpuEngine
from csmd.model.formats import MAX_ID_BYTES, read_graph, read_query
from csmd.model.graph import Graph
from csmd.pipeline.stages import Pipeline
from csmd.service.checkpoint_files import read_checkpoint, write_checkpoint
from csmd.service.config import load_config
from csmd.testing.kafka import DaemonProcess, Topics, config_text, dedup, new_admin_port

from continuous_cases import Model, make_case

FILL = ["\U0001d11e", "\u20ac", "\u00e9", "x"]  # 4, 3, 2 and 1 UTF-8 bytes
LETTERS = string.ascii_letters + string.digits


def spelled(k: int, size: int) -> str:
    """Id number k (< 62) as a string of exactly `size` UTF-8 bytes: a letter of its own, then filler."""
    out, left = [LETTERS[k]], size - 1
    for ch in itertools.cycle(FILL):
        if not left:
            return "".join(out)
        if len(ch.encode()) <= left:
            out.append(ch)
            left -= len(ch.encode())


def _ids_of(line: str) -> list[str]:
    op, *f = line.split()
    return f[:1] if op in ("v", "-v") else f[:2]


class Case:
    """A random case of test_continuous with its ids spelled as strings: the initial graph's ids
    short, the ones the stream makes longer, up to MAX_ID_BYTES (the longest of them all)."""

    def __init__(self, tmp_path, seed: int = 7, steps: int = 80):
        self.tmp = tmp_path
        self.qpaths, truth = make_case(tmp_path, seed, steps)
        g = read_graph(tmp_path / "g0.graph")
        self.int_lines = (tmp_path / "stream.txt").read_text().splitlines()
        ids = sorted(set(g.ext_ids.tolist()) | {int(x) for ln in self.int_lines for x in _ids_of(ln)})
        assert 2 < len(ids) <= len(LETTERS)
        self.name = {x: spelled(k, 1 + round(k * (MAX_ID_BYTES - 1) / (len(ids) - 1))) for k, x in enumerate(ids)}
        self.made = {self.name[x] for x in ids if x not in set(g.ext_ids.tolist())}  # by the stream
        name = np.array([self.name[x] for x in g.ext_ids.tolist()], dtype=object)
        s, d, e = g.edge_list()
        self.graph = tmp_path / "g0.parquet"
        pq.write_table(pa.table({"src": name[s], "dst": name[d], "label": e}), self.graph)
        pq.write_table(pa.table({"id": name, "label": g.labels}), tmp_path / "g0.vertices.parquet")
        # the initial graph as update lines, for a deployment that starts empty
        self.setup = [f"v {x} {lab}" for x, lab in zip(name, g.labels.tolist())] + \
            [f"e {name[a]} {name[b]} {lab}" for a, b, lab in zip(s, d, e.tolist())]
        self.lines = [self.spell(ln) for ln in self.int_lines]
        self.stream = tmp_path / "named.txt"
        self.stream.write_text("\n".join(self.lines) + "\n")
        # query -> Counter of (stream line, sign, vertices)
        self.truth = {q: Counter({(line, sign, tuple(self.name[x] for x in m)): c for (line, sign, m), c in t.items()})
                      for q, t in truth.items()}
        self.g0 = g

    def check_new_ids_matched(self) -> None:
        """The case tests something: some delta names an id that the stream made."""
        assert any(set(m) & self.made for t in self.truth.values() for (_, _, m) in t), "no delta names a new id"

    def spell(self, line: str) -> str:
        op, *f = line.split()
        n = len(_ids_of(line))
        return " ".join([op, *(self.name[int(x)] for x in f[:n]), *f[n:]])

    def queries(self) -> list[str]:
        return [str(p) for p in self.qpaths]


def deltas_by_line(table: pa.Table, line_of) -> dict:
    """query -> Counter of (stream line, sign, vertices) of a delta table; line_of(row) says the line."""
    got: dict = {}
    for row in table.to_pylist():
        line = line_of(row)
        if line is not None:
            got.setdefault(row["query"], Counter())[(line, row["sign"], tuple(row["vertices"]))] += 1
    return got


def _replay_line(row) -> int:
    return int(row["source"].rsplit(":", 1)[1])


def test_ids_the_stream_makes_come_out_whole_from_replay_and_match(tmp_path):
    """Ids longer than any of the initial graph's were cut to the longest of those (`acct:17` came
    out as `acct`); each is written as it came, from 1 to 256 bytes, multi-byte ones too."""
    case = Case(tmp_path)
    case.check_new_ids_matched()
    out = tmp_path / "deltas.arrow"
    assert main(["replay", "--data", str(case.graph), "--stream", str(case.stream), "--query", *case.queries(),
                 "--batch-size", "3", "--backend", "cpu", "--output", str(out)]) == 0
    assert deltas_by_line(ipc.open_file(out).read_all(), _replay_line) == \
        {q: t for q, t in case.truth.items() if t}

    # csmd match --output on the graph the stream leaves, against brute force on the model
    model = Model.__new__(Model)
    model.vlabel = dict(zip(case.g0.ext_ids.tolist(), case.g0.labels.tolist()))
    s, d, e = case.g0.edge_list()
    model.edges = {frozenset((int(case.g0.ext_ids[a]), int(case.g0.ext_ids[b]))): lab
                   for a, b, lab in zip(s, d, e.tolist())}
    model.next_id = 0
    for line in case.int_lines:
        model.apply(line)
    ids = list(model.vlabel)
    final = tmp_path / "final.parquet"
    pq.write_table(pa.table({"src": [case.name[min(p)] for p in model.edges], "dst": [case.name[max(p)] for p in model.edges],
                             "label": list(model.edges.values())}), final)
    pq.write_table(pa.table({"id": [case.name[x] for x in ids], "label": [model.vlabel[x] for x in ids]}),
                   tmp_path / "final.vertices.parquet")
    out = tmp_path / "matches.arrow"
    assert main(["match", "--data", str(final), "--query", *case.queries(), "--backend", "cpu",
                 "--output", str(out)]) == 0
    table = ipc.open_file(out).read_all()
    for p in case.qpaths:
        want = Counter(tuple(case.name[x] for x in m) for m in model.matches(read_query(p)))
        got = Counter(tuple(v) for q, v in zip(table.column("query").to_pylist(), table.column("vertices").to_pylist())
                      if q == p.stem)
        assert got == want, p.stem


def test_the_daemon_publishes_string_ids_whole_before_and_after_a_restart(tmp_path, kafka_bootstrap):
    """A string-keyed daemon: the ids its stream makes were cut in its deltas, and after a restart from a
    checkpoint the same vertex came out under its full id. Half the stream, SIGTERM (a last checkpoint),
    a restart from that checkpoint, the other half: every delta as brute force says, ids whole."""
    case = Case(tmp_path)
    case.check_new_ids_matched()
    t, port = Topics(kafka_bootstrap), new_admin_port()
    cfg = tmp_path / "d.toml"
    cfg.write_text(config_text(t, [], admin_port=port, checkpoint_dir=tmp_path / "ckpt",
                               graph={"initial": str(case.graph)}, queries={"paths": case.queries()}))
    half = len(case.lines) // 2
    d = DaemonProcess(cfg, tmp_path / "d1.log", port)
    t.produce(t.input, case.lines[:half])
    d.wait_offset(half)
    assert d.stop() == 0
    d = DaemonProcess(cfg, tmp_path / "d2.log", port)
    assert "restored checkpoint" in (tmp_path / "d2.log").read_text()
    t.produce(t.input, case.lines[half:])
    d.wait_offset(len(case.lines))
    table, dups = dedup(t.deltas())
    assert dups == 0
    assert deltas_by_line(table, lambda row: row["offset"] + 1) == {q: tr for q, tr in case.truth.items() if tr}
    assert d.stop() == 0


def _fields(line: str) -> tuple[str, list, int]:
    """op, [u, v] (v None for vertex ops), label (0 where the line has none) of an update line."""
    op, *f = line.split()
    n = len(_ids_of(line))
    return op, f[:n] + [None] * (2 - n), int(f[n]) if len(f) > n else 0


def _typed(values, typ) -> pa.Array:
    """An Arrow column of strings of type typ ("dictionary": a dictionary of strings)."""
    return pa.array(values, pa.string()).dictionary_encode() if typ == "dictionary" else pa.array(values, typ)


def _arrow_bytes(columns: dict) -> bytes:
    batch = pa.record_batch({k: v if isinstance(v, pa.Array) else pa.array(v) for k, v in columns.items()})
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def _arrow_record(line: str, op_type, id_type) -> bytes:
    """One update line as an Arrow record whose op and id columns are of the given types."""
    op, (u, v), label = _fields(line)
    return _arrow_bytes({"op": _typed([op], op_type), "u": _typed([u], id_type), "v": _typed([v], id_type),
                         "label": pa.array([label], pa.int32())})


def _json_record(line: str) -> bytes:
    op, (u, v), label = _fields(line)
    return json.dumps({"op": op, "u": u, **({"v": v} if v is not None else {}), "label": label}).encode()


ARROW_TYPES = [(pa.string(), pa.large_string()), (pa.large_string(), pa.string_view()),
               (pa.string_view(), "dictionary"), ("dictionary", pa.string())]


def test_a_string_deployment_starts_empty_and_refuses_empty_and_long_ids(tmp_path, kafka_bootstrap):
    """[graph] ids = "string" with no initial graph: the daemon starts (an empty graph was int64 and
    dead-lettered every string id) and matches the initial graph's records and the stream, in text,
    JSON and Arrow records with large_string, string_view and dictionary columns. An empty id, one of
    257 bytes, one of 100,000 characters and a lone surrogate are dead letters saying why; nothing else
    is lost."""
    case = Case(tmp_path)
    t, port = Topics(kafka_bootstrap), new_admin_port()
    cfg = tmp_path / "d.toml"
    cfg.write_text(config_text(t, [], admin_port=port, graph={"initial": "", "ids": "string"},
                               queries={"paths": case.queries()}))
    d = DaemonProcess(cfg, tmp_path / "d.log", port)
    over = "\u00e9" * 128 + "x"  # 129 characters, 257 bytes
    bad = {b'{"op": "e", "u": "", "v": "b"}': "record: empty vertex id",  # the text format cannot make one
           f"e {case.lines[0].split()[1]} {over}".encode(): "is 257 bytes long (UTF-8), longer than max_id_bytes (256)",
           json.dumps({"op": "v", "u": "y" * 100_000, "label": 0}).encode(): "is 100000 bytes long",
           _arrow_record(f"e a {'z' * 300} 0", pa.large_string(), pa.string_view()): "row 0: vertex id 'zzz",
           b'{"op": "e", "u": "a", "v": "\\ud800"}': "not valid Unicode (a lone surrogate)"}  # no delta could hold it
    bad_before = dict(zip((5, 20, 35, 50, 65), bad))  # stream line -> a bad record just before it
    records, line_at = [ln.encode() for ln in case.setup], {}  # line_at: record offset -> stream line
    for i, ln in enumerate(case.lines, 1):
        if i in bad_before:
            records.append(bad_before[i])
        line_at[len(records)] = i
        records.append(ln.encode() if i % 3 == 0 else _json_record(ln) if i % 3 == 1 else
                       _arrow_record(ln, *ARROW_TYPES[i % len(ARROW_TYPES)]))
    t.produce(t.input, records)
    d.wait_offset(len(records))
    dl = t.read(t.dead_letter, until=lambda m: len(m) >= len(bad))
    assert len(dl) == len(bad)
    for m in dl:
        assert bad[m.value()] in dict(m.headers())["csmd-error"].decode()
    table, _ = dedup(t.deltas())
    assert deltas_by_line(table, lambda row: line_at.get(row["offset"])) == {q: tr for q, tr in case.truth.items() if tr}
    assert d.get("/health")["status"] == "running"
    assert d.stop() == 0


def test_a_daemon_whose_ids_setting_contradicts_its_graph_does_not_start(tmp_path, kafka_bootstrap):
    case = Case(tmp_path, steps=5)
    t, port = Topics(kafka_bootstrap), new_admin_port()
    cfg = tmp_path / "d.toml"
    cfg.write_text(config_text(t, [], admin_port=port, graph={"initial": str(case.graph), "ids": "int"},
                               queries={"paths": case.queries()}))
    proc = subprocess.run([sys.executable, "-m", "csmd", "run", "--config", str(cfg)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{case.graph}: [graph] ids is 'int', but the graph's vertex ids are strings" in proc.stderr
    with pytest.raises(Exception, match=r"\[graph\] ids must be one of auto, int, string, got 'str'"):
        load_config(env={"CSMD_GRAPH__IDS": "str"})
    with pytest.raises(Exception, match=r"\[graph\] max_id_bytes must be > 0"):
        load_config(env={"CSMD_GRAPH__MAX_ID_BYTES": "0"})


def _refused(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_an_id_over_max_id_bytes_or_empty_is_refused_with_its_place(tmp_path, capsys):
    """In a stream file: file:line: reason, exit 2 (a 100,000-character id took 46 s and 2.8 GB for 100
    inserts); in a graph table: file:row N: reason. A 256-byte id is fine (the first test)."""
    case = Case(tmp_path, steps=5)
    q = case.queries()[:1]
    long = tmp_path / "long.txt"
    for ident, limit, size in (("\u00e9" * 128 + "x", [], 257), ("y" * 100_000, [], 100_000),
                               ("abcdefghi", ["--max-id-bytes", "8"], 9)):
        long.write_text(f"e a b\ne b {ident}\n")
        err = _refused(capsys, ["replay", "--ids", "string", "--stream", str(long), "--query", *q, *limit])
        assert f"{long}:2: vertex id " in err and f"is {size} bytes long (UTF-8), longer than max_id_bytes" in err
    for table, vtable, where in (({"src": ["a", "b"], "dst": ["b", ""]}, None, "g.parquet:row 1: column 'dst': empty vertex id"),
                                 ({"src": ["a"], "dst": ["b"]}, {"id": ["a", "b" * 257], "label": [0, 0]},
                                  "g.vertices.parquet:row 1: column 'id': vertex id 'bbb")):
        pq.write_table(pa.table(table), tmp_path / "g.parquet")
        (tmp_path / "g.vertices.parquet").unlink(missing_ok=True)
        if vtable:
            pq.write_table(pa.table(vtable), tmp_path / "g.vertices.parquet")
        for cmd in (["match"], ["replay", "--stream", str(case.stream)]):
            assert where in _refused(capsys, [*cmd, "--data", str(tmp_path / "g.parquet"), "--query", *q])


def test_replay_with_ids_string_starts_from_an_empty_graph_and_a_contradiction_is_an_error(tmp_path, capsys):
    """--ids string with no --data, or with an empty string-keyed edge table (refused as `no vertices`
    before): the initial graph's lines, then the stream, give brute force's deltas. --ids that the
    graph's ids contradict is an error naming both."""
    case = Case(tmp_path)
    stream = tmp_path / "from-empty.txt"
    stream.write_text("\n".join(case.setup + case.lines) + "\n")
    empty = tmp_path / "empty.arrow"
    with ipc.new_file(empty, pa.schema([("src", pa.string()), ("dst", pa.string())])) as w:
        w.write_table(pa.table({"src": pa.array([], pa.string()), "dst": pa.array([], pa.string())}))
    assert read_graph(empty).str_ids and read_graph(empty).n == 0
    skip = len(case.setup)
    for data in ([], ["--data", str(empty)]):
        out = tmp_path / "deltas.arrow"
        assert main(["replay", *data, "--ids", "string", "--stream", str(stream), "--query", *case.queries(),
                     "--backend", "cpu", "--output", str(out)]) == 0
        got = deltas_by_line(ipc.open_file(out).read_all(),
                             lambda row: _replay_line(row) - skip if _replay_line(row) > skip else None)
        assert got == {q: tr for q, tr in case.truth.items() if tr}
    q = case.queries()[:1]
    for cmd in (["replay", "--stream", str(stream)], ["match"]):
        assert f"{case.graph}: --ids is 'int', but the graph's vertex ids are strings" in \
            _refused(capsys, [*cmd, "--data", str(case.graph), "--ids", "int", "--query", *q])
        assert f"g0.graph: --ids is 'string', but the graph's vertex ids are integers" in \
            _refused(capsys, [*cmd, "--data", str(tmp_path / "g0.graph"), "--ids", "string", "--query", *q])


@pytest.mark.parametrize("typ", [pa.large_string(), pa.string_view(), "dictionary"], ids=str)
@pytest.mark.parametrize("suffix", [".arrow", ".parquet"])
def test_large_string_string_view_and_dictionary_ids_load(tmp_path, typ, suffix):
    """What Polars (string_view by default) and pandas (categoricals: dictionaries) write: in graph
    tables (string_view was refused) and in Arrow update records (only plain string was taken)."""
    src, dst = ["acct:1", "acct:2", "dev:\u00e9", "acct:1"], ["dev:\u00e9", "dev:\u00e9", "card:9", "card:9"]
    edges = pa.table({"src": _typed(src, typ), "dst": _typed(dst, typ)})
    verts = pa.table({"id": _typed(["acct:1", "acct:2", "dev:\u00e9", "card:9", "lone"], typ),
                      "label": pa.array([0, 0, 1, 2, 0], pa.int32())})
    path = tmp_path / f"g{suffix}"
    for table, p in ((edges, path), (verts, tmp_path / f"g.vertices{suffix}")):
        if suffix == ".parquet":
            pq.write_table(table, p)
        else:
            with ipc.new_file(p, table.schema) as w:
                w.write_table(table)
    g = read_graph(path)
    assert (g.n, g.num_edges, g.str_ids) == (5, 4, True)
    assert sorted(g.ext_ids.tolist()) == sorted(["acct:1", "acct:2", "dev:\u00e9", "card:9", "lone"])
    ints = pa.table({"src": pa.array([5, 6, 5]).dictionary_encode(), "dst": pa.array([6, 7, 7]).dictionary_encode()})
    pq.write_table(ints, tmp_path / "i.parquet")
    gi = read_graph(tmp_path / "i.parquet")
    assert (gi.n, gi.num_edges, gi.str_ids, sorted(gi.ext_ids.tolist())) == (3, 3, False, [5, 6, 7])

    # Arrow update records: ids and op of each kind
    value = _arrow_bytes({"op": _typed(["e", "e", "v", "-e"], typ), "u": _typed(["a", "b", "c", "a"], typ),
                          "v": _typed(["b", "c", None, "b"], typ), "label": pa.array([0, 1, 2, 0], pa.int32())})
    ups = decode_updates(Record("in", 0, 3, value), "arrow", str_ids=True)
    assert [(u.op, u.u, u.v, u.label) for u in ups] == [("e", "a", "b", 0), ("e", "b", "c", 1), ("v", "c", -1, 2),
                                                          ("-e", "a", "b", 0)]
    value = _arrow_bytes({"op": _typed(["e"], typ), "u": pa.array([1]).dictionary_encode(),
                          "v": pa.array([2], pa.int8()).dictionary_encode()})
    assert [(u.u, u.v) for u in decode_updates(Record("in", 0, 4, value), "arrow")] == [(1, 2)]
    with pytest.raises(BadRecord, match="column 'u' is double"):
        decode_updates(Record("in", 0, 5, _arrow_bytes({"op": ["e"], "u": [1.5], "v": [2.5]})), "arrow")


def test_a_checkpoint_keeps_string_ids_whole_and_an_empty_graphs_kind(tmp_path):
    """An empty string-keyed graph was checkpointed with int64 ids (its kind read off its first id),
    and restored as an int graph that refused every string id; long ids come back whole."""
    from csmd.model.formats import initial_graph

    g0 = initial_graph("", "string")
    assert g0.str_ids and g0.n == 0
    pipe = Pipeline(g0, engine=CpuEngine(g0), threaded=False)
    long = "\u20ac" * 85  # 255 bytes
    pipe.run(iter(decode_updates(Record("in", 0, 0, f"e a {long}\ne {long} b".encode()), "text", True)),
             lambda result: None)
    for state in (Pipeline(g0, engine=CpuEngine(g0), threaded=False).graph_state(), pipe.graph_state()):
        folder = write_checkpoint(tmp_path / str(len(state.ext_ids)), state, {"seq": state.seq})
        g = read_checkpoint(folder.parent).graph
        assert g.str_ids and g.ext_ids.tolist() == state.ext_ids and g.ext_ids.dtype == object
    assert read_checkpoint(tmp_path / "3").graph.ext_ids.tolist() == ["a", long, "b"]


def test_the_encoder_keeps_int_ids_a_numpy_gather():
    """The int path stays an int64 array (the hot path); stream ids made after it grow it."""
    from csmd.pipeline.deltas import DeltaEncoder
    from csmd.pipeline.sequencer import Vertices

    vx = Vertices(Graph.from_edges([0, 0], [0], [1], ext_ids=np.array([5, 9])))
    enc = DeltaEncoder(vx)
    assert enc.ext_ids().dtype == np.int64 and enc.id_type == pa.int64()
    for x in range(100, 140):
        vx.add(x, 0)
    assert enc.ext_ids()[: vx.n].tolist() == [5, 9, *range(100, 140)] and enc.ext_ids().dtype == np.int64
    sx = Vertices(Graph.from_edges([0], [], [], ext_ids=np.array(["a"], object)))
    enc = DeltaEncoder(sx)
    sx.add("b" * 200, 0)
    assert enc.ext_ids()[: sx.n].tolist() == ["a", "b" * 200] and enc.id_type == pa.string()
