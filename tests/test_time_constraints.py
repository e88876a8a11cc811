"""Query time constraints (`w SPAN`, `o i j`): every delta of seeded timed streams against a model
that enumerates the embeddings by brute force and keeps those whose edges' ts keep the span and
the order by definition (model/time_constraints.py), on every CPU engine; the live matches after a
stream against a static match of the edges left in the window; each match's ts_min and ts_max."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from csmd.backends import continuous_engine, static_matcher
from csmd.engine import Done
from csmd.errors import InputError
from csmd.model.formats import parse_query_text, read_graph
from csmd.model.graph import Graph
from csmd.model.labels import LabelNames
from csmd.pipeline.event_time import EventTime

from helpers import ENGINES
from test_event_time import TimedModel, daemon_killed_midway, got_deltas, restarted_halfway, timed_replay

TIMED = LabelNames(timed=True)
BACKENDS = ENGINES


class ConstrainedModel(TimedModel):
    """TimedModel whose matches of a query with time constraints are the embeddings whose edges
    keep them: max ts - min ts <= span, and ts(i) < ts(j) for each order pair, over the edges
    that have a ts (an edge without one constrains nothing). in_order: every update's ts is its
    step's (no jitter, nothing late); reverse: how often an insertion is an existing arc's reverse
    (directed: reciprocal pairs for the queries that hold one)."""

    in_order = False
    reverse = 0.2

    def edge_ts(self, q: Graph, m: tuple) -> list:
        """The ts (None: none) of the data edge each query edge number of q.time maps onto under m."""
        return [self.edges[self.key(m[u], m[v])][1] for u, v in q.time.ends]

    def keeps(self, q: Graph, m: tuple) -> bool:
        if q.time is None:
            return True
        ts = self.edge_ts(q, m)
        given = [t for t in ts if t is not None]
        if q.time.span is not None and given and max(given) - min(given) > q.time.span:
            return False
        return all(ts[i] is None or ts[j] is None or ts[i] < ts[j] for i, j in q.time.order)

    def matches(self, q) -> set:
        return {m for m in super().matches(q) if self.keeps(q, m)}

    def span_of(self, q: Graph, m: tuple) -> tuple:
        """(ts_min, ts_max) over the match's edges with a ts (None, None: none has one)."""
        s, d, _ = q.arcs()
        given = [self.edges[self.key(m[u], m[v])][1] for u, v in zip(s.tolist(), d.tolist())]
        given = [t for t in given if t is not None]
        return (min(given), max(given)) if given else (None, None)

    def record(self, t: int) -> str:
        if self.directed and self.edges and self.rng.random() < self.reverse:
            a, b = self.ends(self.rng.choice(list(self.edges)))
            line = f"e {b} {a} {self.rng.randrange(2)} {t + self.rng.randrange(-12, 4)}"
        else:
            line = super().record(t)
        if self.in_order and line.split()[0] in ("e", "-e"):
            line = line.rsplit(" ", 1)[0] + f" {t}"
        return line


def constrained_query(rng: random.Random, labels: int, k: int, directed: bool) -> str:
    """A random connected query of k vertices, as text, with random time constraints: a span (or
    none), and an order: a random permutation of its edges restricted to some pairs (a strict
    partial order); directed, sometimes a reciprocal pair with an order between its arcs."""
    text = "".join(f"v {j} {rng.randrange(labels)}\n" for j in range(k))
    pairs = [tuple(rng.sample((rng.randrange(j), j), 2)) for j in range(1, k)]
    if k >= 3 and rng.random() < 0.4 and not {(0, k - 1), (k - 1, 0)} & set(pairs):
        pairs.append((0, k - 1))
    if directed and rng.random() < 0.5:
        a, b = rng.choice(pairs)
        pairs.insert(rng.randrange(len(pairs) + 1), (b, a))
        reciprocal = (pairs.index((a, b)), pairs.index((b, a)))
    else:
        reciprocal = None
    text += "".join(f"e {a} {b} {rng.randrange(2)}\n" for a, b in pairs)
    kind = rng.random()
    if kind < 0.15:
        return text  # none: the search keeps nothing per row but the matches' ts
    if kind < 0.65:
        text += f"w {rng.choice([0, rng.randrange(1, 20), rng.randrange(20, 80)])}\n"
    rank = rng.sample(range(len(pairs)), len(pairs))
    chosen = [(i, j) for i in range(len(pairs)) for j in range(len(pairs))
              if rank[i] < rank[j] and rng.random() < 0.4]
    if reciprocal is not None and rng.random() < 0.8:
        i, j = reciprocal
        chosen.append((i, j) if rank[i] < rank[j] else (j, i))
    if kind >= 0.65 and not chosen and len(pairs) > 1:
        i, j = sorted(rng.sample(range(len(pairs)), 2), key=rank.__getitem__)
        chosen.append((i, j))
    text += "".join(f"o {i} {j}\n" for i, j in sorted(set(chosen)))
    return text


def constrained_case(tmp_path, seed: int, steps: int = 60, directed: bool = False, in_order: bool = False):
    """A seeded timed stream and constrained queries, with each update's deltas (by stream line,
    sign, match) and each delta's (ts_min, ts_max) counted on the model."""
    rng = random.Random(seed)
    window = rng.choice([None, 15, 30, 60])
    lateness = rng.choice([0, 0, 5])
    model = ConstrainedModel(rng, rng.randrange(5, 10), rng.randrange(1, 3), window, lateness, directed)
    model.in_order = in_order
    (tmp_path / "g0.graph").write_text(model.text())
    queries = {}
    for i, k in enumerate((2, 3, rng.randrange(3, 5))):
        text = constrained_query(rng, model.labels, k, directed)
        queries[f"q{i}"] = parse_query_text(text, f"q{i}", TIMED, directed=directed)
        (tmp_path / f"q{i}.graph").write_text(text)
    truth = {name: Counter() for name in queries}
    spans = {name: Counter() for name in queries}
    initial = {name: model.matches(q) for name, q in queries.items()}
    lines = []
    for lineno in range(1, steps + 1):
        line = model.record(10 * lineno)
        for step in model.steps(line):
            before = {name: model.matches(q) for name, q in queries.items()}
            gone = {name: {m: model.span_of(queries[name], m) for m in before[name]} for name in queries}
            step()
            for name, q in queries.items():
                after = model.matches(q)
                for m in after - before[name]:
                    truth[name][(lineno, +1, m)] += 1
                    spans[name][(lineno, +1, m, model.span_of(q, m))] += 1
                for m in before[name] - after:
                    truth[name][(lineno, -1, m)] += 1
                    spans[name][(lineno, -1, m, gone[name][m])] += 1
        lines.append(line)
    (tmp_path / "stream.txt").write_text("\n".join(lines) + "\n")
    return queries, truth, spans, initial, EventTime(window, lateness), model


def static_rows(backend: str, g: Graph, q: Graph) -> Counter:
    """Every match of q in g (external ids) by backend's static matcher."""
    got = Counter()

    def sink(rows):
        for r in rows.tolist():
            got[tuple(g.ext_ids[x].item() for x in r)] += 1

    res = static_matcher(backend).match(g, q, sink=sink)
    assert res.complete and res.count == sum(got.values())
    return got


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(36))
def test_every_constrained_delta_equals_the_model(tmp_path, seed, backend):
    """Per update, the matches that form and vanish, the constrained ones dropped, on an
    undirected or directed stream in order or slightly out of order; count-only alike; and the
    matches live after the stream (the initial ones plus the signs) are a static match of the
    edges the model still holds."""
    directed = seed % 3 != 0
    queries, truth, _, initial, spec, model = constrained_case(tmp_path, seed, directed=directed,
                                                               in_order=seed % 4 == 1)
    batch = random.Random(seed).choice([1, 7, 64])
    table, results, _ = timed_replay(tmp_path, queries, spec, batch, backend, directed=directed)
    got = got_deltas(table, queries)
    assert got == truth, (seed, spec)
    final = {name: model.matches(q) for name, q in queries.items()}
    for res in results:
        name = res["query"]
        assert res["positive"] == sum(c for (_, s, _), c in truth[name].items() if s > 0)
        assert res["negative"] == sum(c for (_, s, _), c in truth[name].items() if s < 0)
        assert res["positive"] - res["negative"] == len(final[name]) - len(initial[name])
    if seed % 2:
        _, counted, _ = timed_replay(tmp_path, queries, spec, batch, backend, count_only=True, directed=directed)
        assert [(r["positive"], r["negative"]) for r in counted] == [(r["positive"], r["negative"]) for r in results]
    g0 = read_graph(tmp_path / "g0.graph", directed=directed)
    (tmp_path / "final.graph").write_text(model.text())
    g = read_graph(tmp_path / "final.graph", directed=directed)
    for name, q in queries.items():
        live = Counter(initial[name]) if q.time is None or g0.edge_ts is None else static_rows(backend, g0, q)
        assert set(live) == initial[name]
        for (_, sign, m), c in got[name].items():
            live[m] += sign * c
        live = +live
        assert set(live.values()) <= {1}
        if q.time is not None and g.edge_ts is None:  # no edge has a ts: the static match refuses
            with pytest.raises(InputError, match="edges have no ts"):
                static_matcher(backend).match(g, q)
        else:
            assert static_rows(backend, g, q) == live == Counter(final[name]), (seed, name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("seed", range(12))
def test_each_match_carries_its_edges_smallest_and_largest_ts(tmp_path, seed, backend):
    """Matches.ts of the materialised matches: per row the (ts_min, ts_max) of its edges that
    have a ts (NO_TS twice where none has), as the model has them when the match forms or vanishes."""
    from csmd.jobs.replay import read_stream
    from csmd.model.time_constraints import NO_TS
    from csmd.pipeline.stages import Pipeline

    directed = seed % 2 == 1
    queries, _, spans, _, spec, _ = constrained_case(tmp_path, 1000 + seed, directed=directed)
    g0 = read_graph(tmp_path / "g0.graph", directed=directed)
    engine = continuous_engine(backend, g0, timed=True)
    seen = []
    submit = engine.submit

    def capture(batch, prepared, select=None):
        found = submit(batch, prepared, select).result()
        seen.append((batch, found))
        return Done(found)

    engine.submit = capture
    pipe = Pipeline(g0, engine=engine, threaded=False, batch_size=random.Random(seed).choice([1, 5, 64]),
                    event_time=spec)
    for name, q in queries.items():
        pipe.add_query(name, q)
    updates = [u for x in read_stream(tmp_path / "stream.txt", event_time=True) for u in
               (x.updates() if hasattr(x, "updates") else [x])]
    pipe.run(iter(updates), lambda r: None)
    ext = pipe.vertices.ext_ids
    got = {name: Counter() for name in queries}
    for batch, found in seen:
        sign = dict(zip(batch.edge_seq.tolist(), batch.edge_sign.tolist()))
        for name, m in found.items():
            assert m.ts is not None and m.ts.shape == (len(m.rows), 2), name
            for seq, row, (lo, hi) in zip(m.seq.tolist(), m.rows.tolist(), m.ts.tolist()):
                line = int(batch.record_of[seq].source.rsplit(":", 1)[1])
                match = tuple(int(ext[v]) for v in row)
                got[name][(line, sign[seq], match, (None, None) if hi == NO_TS else (lo, hi))] += 1
                assert (lo == NO_TS) == (hi == NO_TS)
    assert got == spans, seed


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_orders_of_a_reciprocal_pair_and_the_span_by_hand(tmp_path, backend):
    """A transfer back that must come after the one out, within 10: 1 -> 2 at 5 then 2 -> 1 at 8
    matches as (1, 2) only; 3 -> 4 at 5 and 4 -> 3 at 3 as (4, 3) only; 5 -> 6 at 5 and 6 -> 5 at
    20 are too far apart either way. Deleting 1 -> 2 takes its match."""
    (tmp_path / "g0.graph").write_text("v 1 0\nv 2 0\nv 3 0\nv 4 0\nv 5 0\nv 6 0\n")
    (tmp_path / "stream.txt").write_text("e 1 2 0 5\ne 2 1 0 8\ne 3 4 0 5\ne 4 3 0 3\ne 5 6 0 5\ne 6 5 0 20\n"
                                         "-e 1 2 0 21\n")
    q = parse_query_text("v 0 0\nv 1 0\ne 0 1\ne 1 0\no 0 1\nw 10\n", "back", TIMED, directed=True)
    table, results, _ = timed_replay(tmp_path, {"back": q}, EventTime(None, 0), 1, backend, directed=True)
    assert got_deltas(table, ["back"]) == {"back": Counter({(2, +1, (1, 2)): 1, (4, +1, (4, 3)): 1,
                                                                          (7, -1, (1, 2)): 1})}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_static_match_keeps_the_constraints_and_needs_a_graph_with_ts(tmp_path, backend):
    """A static match of a constrained query reads the graph file's ts (edges without one
    constrain nothing); on a graph without any it cannot judge them: refused, not ignored."""
    (tmp_path / "g.graph").write_text("v 1 0\nv 2 0\nv 3 0\nv 4 0\ne 1 2 0 10\ne 2 3 0 30\ne 3 4 0\n")
    g = read_graph(tmp_path / "g.graph", directed=True)
    path = parse_query_text("v 0 0\nv 1 0\nv 2 0\ne 0 1\ne 1 2\nw 15\n", "path", TIMED, directed=True)
    assert static_rows(backend, g, path) == Counter({(2, 3, 4): 1})
    path = parse_query_text("v 0 0\nv 1 0\nv 2 0\ne 0 1\ne 1 2\no 1 0\n", "path", TIMED, directed=True)
    assert static_rows(backend, g, path) == Counter({(2, 3, 4): 1})
    (tmp_path / "untimed.graph").write_text("v 1 0\nv 2 0\ne 1 2 0\n")
    with pytest.raises(InputError, match="edges have no ts"):
        static_matcher(backend).match(read_graph(tmp_path / "untimed.graph"), path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_deletion_without_a_ts_takes_the_edge_out_of_the_clock(backend):
    """An edge update without a ts under event time is applied untimed: a deletion must still
    forget the edge's ts, or its expiry would later delete an edge that is gone (the graph raised
    'deleting an edge that is not live')."""
    from csmd.model.formats import Update
    from csmd.pipeline.stages import Pipeline

    g0 = Graph.from_edges([0] * 4, [], [], ext_ids=[1, 2, 3, 4])
    pipe = Pipeline(g0, engine=continuous_engine(backend, g0, timed=True), batch_size=1, threaded=False,
                    event_time=EventTime(5))
    ups = [Update("e", 1, 2, 0, "s:1", ts=10), Update("-e", 1, 2, 0, "s:2"), Update("e", 3, 4, 0, "s:3", ts=100)]
    pipe.run(iter(ups), lambda r: None)
    assert pipe.sequencer.clock.expired == 0
    assert sorted(zip(*(x.tolist() for x in pipe.engine.live_edges()[:2]))) == [(2, 3)]


def test_distinct_with_an_order_is_refused_naming_the_query():
    """--distinct keeps one embedding of an instance by vertex ids; with an order on the edges,
    which one it keeps would decide whether the instance matches (a path 0-1-2 with o 0 1 gave 1
    on a graph and 0 on its mirror image)."""
    from csmd.pipeline.stages import Pipeline

    g0 = Graph.from_edges([0] * 3, [0, 1], [1, 2])
    pipe = Pipeline(g0, engine=continuous_engine("cpu", g0, timed=True), threaded=False, event_time=EventTime(None))
    q = parse_query_text("v 0 0\nv 1 0\nv 2 0\ne 0 1\ne 1 2\no 0 1\n", "chain", TIMED)
    with pytest.raises(InputError, match="^chain: --distinct cannot be combined with 'o' lines"):
        pipe.add_query("chain", q, distinct=True)
    pipe.add_query("chain", q)  # without --distinct it is a query like any other
    w = parse_query_text("v 0 0\nv 1 0\nv 2 0\ne 0 1\ne 1 2\nw 5\n", "span", TIMED)
    pipe.add_query("span", w, distinct=True)  # a span holds for every embedding of an instance alike
    with pytest.raises(InputError, match="--distinct cannot be combined"):
        static_matcher("cpu").match(g0, q, distinct=True)


@pytest.mark.parametrize("seed", range(4))
def test_a_restart_from_a_checkpoint_keeps_what_the_constraints_judge(tmp_path, seed):
    """A checkpoint halfway through a timed stream keeps every edge's ts: after a restore the
    constrained queries' deltas (ids and all, ts_min/ts_max with them) are those of a run without
    one; the restored graph's ts are what the span and order read."""
    directed = seed % 2 == 1
    queries, truth, _, _, spec, _ = constrained_case(tmp_path, 500 + seed, steps=80, directed=directed)
    assert any(q.time is not None and q.time.constrained for q in queries.values())
    whole, restarted, _ = restarted_halfway(tmp_path, queries, spec, directed)
    assert len(whole) == sum(sum(c.values()) for c in truth.values())
    assert restarted == whole, seed


def test_the_daemon_judges_the_constraints_across_a_kill_9(tmp_path, kafka_bootstrap):
    """A daemon under event time with constrained queries (a span, an order, both): its deltas
    through Kafka, across a kill -9 in the middle of expiries and a restart from a checkpoint, are
    csmd replay's after dedup by id."""
    from csmd.testing.kafka import rows_of

    queries, truth, _, _, spec, _ = constrained_case(tmp_path, 7, steps=400, directed=True)
    assert sum(q.time is not None and q.time.constrained for q in queries.values()) >= 2
    spec = EventTime(30, 5)
    table, results, _ = timed_replay(tmp_path, queries, spec, 64, "cpu", directed=True)
    assert results[0]["expired"] > 20 and len(table) > 20
    deduped, d, _, _ = daemon_killed_midway(tmp_path, kafka_bootstrap, queries,
                                            {"window": 30, "lateness": 5, "directed": True})
    assert rows_of(deduped) == rows_of(table)
    assert d.stop() == 0


@pytest.mark.parametrize("seed", range(3))
def test_cluster_shards_split_a_timed_stream_and_a_gained_shard_is_re_matched_exactly(tmp_path, seed):
    """A cluster instance under event time: three owners of disjoint shards of a timed stream
    with constrained queries publish together exactly one pipeline's deltas (ids included), expiries
    going with the record that moved the watermark; one owner that gains the other shards
    mid-stream re-matches them at their own timestamps and publishes them all."""
    from csmd.jobs.replay import read_stream
    from csmd.pipeline.deltas import DeltaEncoder
    from csmd.pipeline.shards import ShardChange, ShardWork
    from csmd.pipeline.stages import Pipeline

    directed = seed % 2 == 0
    queries, _, _, _, spec, _ = constrained_case(tmp_path, 900 + seed, steps=120, directed=directed)
    updates = [u for x in read_stream(tmp_path / "stream.txt", event_time=True) for u in
               (x.updates() if hasattr(x, "updates") else [x])]
    g0 = read_graph(tmp_path / "g0.graph", directed=directed)
    shards, bs = 5, random.Random(seed).choice([1, 3, 8])

    def run(plan=None) -> Counter:
        pipe = Pipeline(g0, engine=continuous_engine("cpu", g0, timed=True), batch_size=bs, executor_lag=2,
                        queue_depth=4, event_time=spec)
        for name, q in queries.items():
            pipe.add_query(name, q)
        if plan is not None:
            pipe.shards = ShardWork(shards, 0, 0)
        enc, rows = DeltaEncoder(pipe.vertices), Counter()

        def source():
            due = sorted(plan or [], key=lambda x: x[0])
            for u in updates:
                while due and u.origin[2] >= due[0][0]:
                    yield due.pop(0)[1]
                yield u

        def on_result(r):
            r = r.result if isinstance(r, ShardChange) else r
            if r is not None:
                for _, b, _ in enc.encode(r):
                    rows.update(tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in row.items())
                                for row in b.to_pylist())

        pipe.run(source(), on_result)
        return rows

    truth = run()
    assert truth and any("expired by" in dict(row)["source"] for row in truth)
    parts = [run([(0, ShardChange({s: 0 for s in range(shards) if s % 3 == i}))]) for i in range(3)]
    assert sum(parts, Counter()) == truth
    mid = len(updates) // 2
    assert run([(0, ShardChange({0: 0, 1: 0})), (mid, ShardChange({2: 0, 3: 0, 4: 0}))]) == truth


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_untimed_engine_in_a_timed_pipeline_gives_no_ts(tmp_path, backend):
    """An engine made without event time keeps no edge ts, so its matches carry none (it read
    the batch's ts where its graph has no room for them: garbage ts_max like 94502412410232)."""
    queries, _, _, _, spec, _ = constrained_case(tmp_path, 3, directed=False)
    g0 = read_graph(tmp_path / "g0.graph")
    engine = continuous_engine(backend, g0)
    found = []
    submit = engine.submit
    engine.submit = lambda batch, prepared, select=None: Done(found.append(submit(batch, prepared, select).result())
                                                              or found[-1])
    from csmd.jobs.replay import read_stream
    from csmd.pipeline.stages import Pipeline

    pipe = Pipeline(g0, engine=engine, threaded=False, batch_size=7, event_time=spec)
    q = parse_query_text("v 0 0\nv 1 0\ne 0 1\n", "edge")
    pipe.add_query("edge", q)
    pipe.run(iter([u for x in read_stream(tmp_path / "stream.txt", event_time=True) for u in
                   (x.updates() if hasattr(x, "updates") else [x])]), lambda r: None)
    rows = [m for f in found for m in f.values()]
    assert rows and all(m.ts is None for m in rows)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_static_query_of_the_live_graph_keeps_the_constraints(tmp_path, backend):
    """What csmd admin match searches (the pipeline's live graph as a static Graph) carries every
    live edge's ts: a constrained query counts there the live matches the deltas leave."""
    from csmd.jobs.replay import read_stream
    from csmd.pipeline.stages import Pipeline

    directed = backend != "numpy"
    queries, truth, _, initial, spec, model = constrained_case(tmp_path, 44, steps=80, directed=directed)
    g0 = read_graph(tmp_path / "g0.graph", directed=directed)
    pipe = Pipeline(g0, engine=continuous_engine(backend, g0, timed=True), threaded=False, batch_size=7,
                    event_time=spec)
    pipe.run(iter([u for x in read_stream(tmp_path / "stream.txt", event_time=True) for u in
                   (x.updates() if hasattr(x, "updates") else [x])]), lambda r: None)
    live = pipe.graph_state().live_graph()
    assert live.edge_ts is not None
    for name, q in queries.items():
        assert static_matcher(backend).match(live, q).count == len(model.matches(q)), name
