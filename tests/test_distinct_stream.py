"""Distinct continuous queries against brute force: one delta per subgraph instance.

An instance is a set of embeddings equal up to the query's automorphisms; two embeddings are
of one instance exactly when they map the query's edges onto the same data edges. The truth
here is the brute-force embeddings of each graph of the stream grouped that way (tests/brute.py,
no csmd code): an update's delta holds the instances that appear (+1) or vanish (-1) with it,
each once, as one of its embeddings.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter, defaultdict
from itertools import combinations

import pyarrow.compute as pc
import pyarrow.ipc as ipc
import pytest

from csmd.backends import continuous_engine
from csmd.jobs.replay import decoded_updates, replay
from csmd.model.formats import read_graph, read_query
from csmd.pipeline.sequencer import record_positions
from csmd.pipeline.stages import Pipeline
from csmd.testing.kafka import DaemonProcess, Topics, config_text, dedup, kill_leftovers, new_admin_port, rows_of

from brute import embeddings
from continuous_cases import Model

SHAPES = {  # symmetric shapes (|Aut| of the unlabelled one): what distinct queries are for
    "triangle": [(0, 1), (1, 2), (2, 0)],  # 6
    "ring": [(0, 1), (1, 2), (2, 3), (3, 0)],  # 8
    "star": [(0, 1), (0, 2), (0, 3)],  # 6
    "path": [(0, 1), (1, 2), (2, 3)],  # 2
    "clique": list(combinations(range(4), 2)),  # 24
    "edge": [(0, 1)],  # 2: the anchor's own two vertices are the symmetric pair
}


def query_text(rng: random.Random, edges, labels: int, elabels: int) -> str:
    """A shape, unlabelled half of the time (every automorphism), else with random labels (some)."""
    plain = rng.random() < 0.5
    n = 1 + max(max(e) for e in edges)
    lines = [f"v {u} {0 if plain else rng.randrange(labels)}" for u in range(n)]
    return "\n".join(lines + [f"e {a} {b} {0 if plain else rng.randrange(elabels)}" for a, b in edges]) + "\n"


def instance(q, m) -> frozenset:
    """The instance of embedding m (data ids by query vertex): the data edges it maps q's onto."""
    s, d, _ = q.edge_list()
    return frozenset(frozenset((m[a], m[b])) for a, b in zip(s.tolist(), d.tolist()))


def instances(model: Model, q) -> dict:
    """instance -> its embeddings, in the model's graph now."""
    out = defaultdict(set)
    for m in model.matches(q):
        out[instance(q, m)].add(m)
    return out


def automorphisms(q) -> int:
    """|Aut(q)|: the embeddings of q in itself."""
    s, d, e = q.edge_list()
    adj = [dict() for _ in range(q.n)]
    for a, b, lab in zip(s.tolist(), d.tolist(), e.tolist()):
        adj[a][b] = adj[b][a] = lab
    return sum(1 for _ in embeddings(adj, [int(x) for x in q.labels], q))


def make_case(tmp_path, seed: int, steps: int = 60, texts: dict | None = None):
    """A random graph and stream (insertions, deletions, vertex creation and deletion, labels) and
    queries (texts by name, else two of random shapes); truth: (query, line) -> Counter of (sign,
    instance) and instance -> its embeddings (every one any graph of the stream had)."""
    rng = random.Random(seed)
    labels, elabels = rng.choice([1, 1, 2]), rng.choice([1, 1, 2])
    model = Model(rng, n=rng.randrange(7, 13), labels=labels, elabels=elabels, p=rng.uniform(0.3, 0.6))
    (tmp_path / "g0.graph").write_text(model.text())
    if texts is None:
        texts = {name: query_text(rng, SHAPES[name], labels, elabels) for name in rng.sample(sorted(SHAPES), 2)}
    qpaths = []
    for name, text in texts.items():
        qpaths.append(tmp_path / f"{name}.graph")
        qpaths[-1].write_text(text)
    queries = {p.stem: read_query(p) for p in qpaths}
    truth = {name: defaultdict(Counter) for name in queries}
    found = {name: defaultdict(set) for name in queries}
    now = {name: instances(model, q) for name, q in queries.items()}
    lines = []
    for lineno in range(1, steps + 1):
        line = model.random_record()
        model.apply(line)
        lines.append(line)
        for name, q in queries.items():
            before, now[name] = now[name], instances(model, q)
            for sign, gone, kept in ((+1, now[name], before), (-1, before, now[name])):
                for key in gone.keys() - kept.keys():
                    truth[name][lineno][sign, key] += 1
                    found[name][key] |= gone[key]
    (tmp_path / "stream.txt").write_text("\n".join(lines) + "\n")
    return qpaths, queries, truth, found


def stream_deltas(tmp_path, qpaths, backend: str, batch_size: int, count_only: bool, distinct: bool = True):
    """The pipeline's deltas by (query, line): Counter of (sign, match in external ids), or of sign
    (count-only: the counts)."""
    g0 = read_graph(tmp_path / "g0.graph")
    pipe = Pipeline(g0, engine=continuous_engine(backend, g0), batch_size=batch_size)
    for p in qpaths:
        pipe.add_query(p.stem, read_query(p), count_only, distinct)
    got = defaultdict(Counter)

    def on_result(result):
        ext = pipe.vertices.ext_ids
        for d in result.deltas:
            lines = record_positions(result.batch.record_of, d.seq)[1].tolist()
            for i, (line, sign) in enumerate(zip(lines, d.sign.tolist())):
                if count_only:
                    got[d.name, line][sign] += int(d.counts[i])
                else:
                    got[d.name, line][sign, tuple(ext[v] for v in d.rows[i].tolist())] += 1

    try:
        pipe.run(decoded_updates(tmp_path / "stream.txt"), on_result)
    finally:
        pipe.engine.close()
    return got


def assert_instances(got, queries, truth, found, seed):
    """Each update's delta is its instances, each once, as one of the instance's embeddings."""
    for name, q in queries.items():
        lines = set(truth[name]) | {line for n, line in got if n == name}
        for line in lines:
            want = truth[name].get(line, Counter())
            rows = got.get((name, line), Counter())
            assert Counter({(sign, instance(q, m)): c for (sign, m), c in rows.items()}) == want, (seed, name, line)
            assert all(m in found[name][instance(q, m)] for _, m in rows), (seed, name, line)


@pytest.mark.parametrize("seed", range(24))
def test_each_delta_is_one_per_instance_equal_to_brute_force(tmp_path, seed, backend):
    qpaths, queries, truth, found = make_case(tmp_path, seed)
    got = stream_deltas(tmp_path, qpaths, backend, random.Random(seed).choice([1, 7, 64]), count_only=False)
    assert_instances(got, queries, truth, found, seed)


@pytest.mark.parametrize("seed", range(100, 116))
def test_distinct_counts_per_update_equal_brute_force_instances(tmp_path, seed, backend):
    """count_only: each update's counts are its numbers of instances that appear and vanish."""
    qpaths, queries, truth, _ = make_case(tmp_path, seed)
    got = stream_deltas(tmp_path, qpaths, backend, random.Random(seed).choice([1, 7, 64]), count_only=True)
    for name in queries:
        want = {line: Counter(sign for sign, _ in c.elements()) for line, c in truth[name].items()}
        have = {line: +c for (n, line), c in got.items() if n == name and +c}
        assert have == {line: c for line, c in want.items() if c}, (seed, name)


@pytest.mark.parametrize("seed", range(200, 206))
def test_deltas_do_not_depend_on_the_batching_and_times_aut_give_the_embeddings(tmp_path, seed, backend):
    """Batches of 1, 7 and 64 give the same distinct deltas (the same representative embeddings);
    every query's distinct totals times |Aut(q)| are its embedding totals."""
    qpaths, queries, _, _ = make_case(tmp_path, seed)
    runs = [stream_deltas(tmp_path, qpaths, backend, b, count_only=False) for b in (1, 7, 64)]
    assert runs[0] == runs[1] == runs[2]
    counted = stream_deltas(tmp_path, qpaths, backend, 7, count_only=True, distinct=False)
    for name, q in queries.items():
        aut = automorphisms(q)
        for sign in (+1, -1):
            distinct = sum(c for (n, _), rows in runs[0].items() if n == name for (s, _), c in rows.items() if s == sign)
            assert distinct * aut == sum(c[sign] for (n, _), c in counted.items() if n == name), (seed, name, sign)


# ---- the command line ----------------------------------------------------------------------------
RING_STREAM = "e 1 2\ne 2 3\ne 3 4\ne 4 1\ne 1 3\n-e 1 2\n"  # a 4-ring, a chord (two triangles), a break


def _ring_files(tmp_path):
    (tmp_path / "g0.graph").write_text("".join(f"v {v} 0\n" for v in (1, 2, 3, 4)))
    (tmp_path / "stream.txt").write_text(RING_STREAM)
    for name in ("ring", "triangle"):
        edges = SHAPES[name]
        (tmp_path / f"{name}.graph").write_text("".join(f"v {u} 0\n" for u in range(1 + max(max(e) for e in edges)))
                                                + "".join(f"e {a} {b}\n" for a, b in edges))


def _csmd(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "csmd", *map(str, args)], capture_output=True, text=True, timeout=300)


def test_replay_distinct_json_and_output_give_one_row_per_instance(tmp_path):
    """A new 4-ring gives one delta, not 8; the chord two triangles (one each, not 12); removing an
    edge of the ring and of a triangle takes back one of each."""
    _ring_files(tmp_path)
    common = ["replay", "--data", tmp_path / "g0.graph", "--stream", tmp_path / "stream.txt", "--query",
              tmp_path / "ring.graph", tmp_path / "triangle.graph", "--backend", "cpu", "--json"]
    plain = _csmd(*common)
    out = _csmd(*common, "--distinct", "--output", tmp_path / "d.arrow")
    assert plain.returncode == 0 and out.returncode == 0, out.stderr
    totals = {r["query"]: (r["positive"], r["negative"]) for r in map(json.loads, out.stdout.splitlines())}
    assert totals == {"ring": (1, 1), "triangle": (2, 1)}
    embedded = {r["query"]: (r["positive"], r["negative"]) for r in map(json.loads, plain.stdout.splitlines())}
    assert embedded == {"ring": (8, 8), "triangle": (12, 6)}
    rows = ipc.open_file(tmp_path / "d.arrow").read_all().to_pylist()
    got = sorted((r["query"], r["seq"], r["sign"], frozenset(r["vertices"])) for r in rows)
    assert got == sorted([("ring", 3, 1, frozenset({1, 2, 3, 4})), ("triangle", 4, 1, frozenset({1, 2, 3})),
                          ("triangle", 4, 1, frozenset({1, 3, 4})), ("ring", 5, -1, frozenset({1, 2, 3, 4})),
                          ("triangle", 5, -1, frozenset({1, 2, 3}))])
    # each row is an embedding: its query's edges are edges of the graph
    edges = {frozenset(map(int, ln.split()[1:3])) for ln in RING_STREAM.splitlines()}
    for r in rows:
        v = r["vertices"]
        assert all(frozenset((v[a], v[b])) in edges for a, b in SHAPES[r["query"]])


# ---- the daemon ----------------------------------------------------------------------------------
@pytest.fixture
def _no_leftover_daemons():
    yield
    kill_leftovers()


def test_daemon_publishes_distinct_deltas_before_and_after_a_restart(tmp_path, kafka_bootstrap, capsys,
                                                                     _no_leftover_daemons):
    """A query registered with `[queries] distinct = true`, another with `csmd admin add --distinct`:
    both publish one delta per instance (brute force), before and after a restart from a checkpoint,
    and in a daemon that rebuilds them from the control log and the config; the deltas are `csmd
    replay --distinct`'s, so a restart keeps the representative embedding of every instance (and
    the delta ids name one content each)."""
    from csmd.cli import main as csmd
    from csmd.service.admin import call

    plain = {name: query_text(random.Random(0), SHAPES[name], 1, 1) for name in ("ring", "triangle")}  # unlabelled
    qpaths, queries, truth, found = make_case(tmp_path, 7, steps=80, texts=plain)
    ring, triangle = qpaths
    assert any(truth[name] for name in queries)
    t = Topics(kafka_bootstrap)
    port = new_admin_port()
    cfg = tmp_path / "d.toml"
    cfg.write_text(config_text(t, [], admin_port=port, checkpoint_dir=tmp_path / "ckpt",
                               graph={"initial": str(tmp_path / "g0.graph")},
                               queries={"paths": [str(triangle)], "distinct": True}))
    lines = (tmp_path / "stream.txt").read_text().splitlines()
    half = len(lines) // 2
    d = DaemonProcess(cfg, tmp_path / "d1.log", port)
    assert csmd(["admin", "--url", d.url, "add", "--distinct", "--query", str(ring)]) == 0
    # `admin add --distinct --estimate` estimates instances: the embeddings' estimate / |Aut| (8)
    embedded = call(d.url, "POST", "/estimate", {"query": ring.read_text(), "time_limit": 2.0})["estimate"]
    capsys.readouterr()
    assert csmd(["admin", "--url", d.url, "--json", "add", "--distinct", "--estimate", "--name", "ring2",
                 "--query", str(ring)]) == 0
    assert embedded > 0 and json.loads(capsys.readouterr().out)["estimate"]["estimate"] == pytest.approx(embedded / 8)
    assert {q["name"]: q["distinct"] for q in d.get("/queries")["queries"]} == {"triangle": True, "ring": True,
                                                                                "ring2": True}
    t.produce(t.input, lines[:half])
    d.wait_offset(half)
    assert d.stop() == 0
    d = DaemonProcess(cfg, tmp_path / "d2.log", port)
    t.produce(t.input, lines[half:])
    d.wait_offset(len(lines))
    assert {q["name"]: q["distinct"] for q in d.get("/queries")["queries"]} == {"triangle": True, "ring": True,
                                                                                "ring2": True}
    assert d.stop() == 0
    assert "restored checkpoint" in (tmp_path / "d2.log").read_text()
    table, _ = dedup(t.deltas())
    table = table.filter(pc.field("query") != "ring2")
    got = defaultdict(Counter)
    for r in table.to_pylist():
        got[r["query"], r["offset"] + 1][r["sign"], tuple(r["vertices"])] += 1
    assert_instances(got, queries, truth, found, "daemon")
    out = tmp_path / "replay.arrow"
    replay(read_graph(tmp_path / "g0.graph"), tmp_path / "stream.txt", [(p.stem, queries[p.stem]) for p in qpaths],
           batch_size=64, count_only=False, distinct=True, output=out, show_progress=False)
    assert rows_of(table) == rows_of(ipc.open_file(out).read_all())
    # a daemon without checkpoints (another group, another output topic) takes the queries from the
    # control log and the config again: the same distinct deltas
    fresh = Topics(kafka_bootstrap)
    cfg.write_text(config_text(t, [], admin_port=port, graph={"initial": str(tmp_path / "g0.graph")},
                               queries={"paths": [str(triangle)], "distinct": True}, kafka={"group": "fresh"},
                               topics={"output": fresh.output}))
    d = DaemonProcess(cfg, tmp_path / "d3.log", port)
    d.wait_offset(len(lines))
    assert d.stop() == 0
    again = fresh.deltas()
    assert rows_of(again.filter(pc.field("query") != "ring2")) == rows_of(table)
