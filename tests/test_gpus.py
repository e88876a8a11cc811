"""Several GPUs behind one engine (gpu/replicas.py): the same delta bytes as the CPU engine's and one
GPU's, on seeded random streams (undirected, directed, under event time) and the human stream.

Every GPU engine these tests make is `n` replicas (the `replicas` fixture): on a machine with fewer
GPUs the replicas share them (device 0 named twice), which runs the same replicated apply, split
and merge. Unless a test says otherwise every search is split, however few its seeds, so that
the small random cases exercise what large searches do. Truth: the CPU engine's delta file (the
random cases, brute-force checked in their own modules) and the expected-count file (human).
"""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

from csmd.backends import gpu_unavailable_reason

from continuous_cases import delta_file, make_case, run_replay
from helpers import dataset, read_expected

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason()))]


def devices_here() -> int:
    import cupy

    return cupy.cuda.runtime.getDeviceCount()


@pytest.fixture(params=[2, 3])
def replicas(request, monkeypatch):
    """Every GPU engine replay makes in the test is n replicas, device ids 0, 1, ... wrapped round
    the devices there are; every search of one seed or more is split over them, and warps hand
    their nodes to the task queue at once, so that nodes travel as tasks with their dealt bit
    (matcher.cu deal_at). With 2, a prefix deals out its range for the last depth it enumerates
    (tasks of nodes dealt and not yet dealt side by side); with 3, its first range, at depth 2
    (DEAL_RANGE 1)."""
    from csmd.backends import continuous_engine
    import csmd.jobs.replay as replay_module
    from csmd.gpu import executor, matcher, replicas as mod

    n, have = request.param, devices_here()
    monkeypatch.setitem(executor.EX_TUNING, "offload_us", 0.001)
    if n == 3:
        monkeypatch.setattr(matcher, "DEAL_RANGE", 1)

    def engine(backend, g0, *args, timed=False, **kwargs):
        if backend == "gpu":
            return mod.MultiGpuEngine(g0, [i % have for i in range(n)], timed)
        return continuous_engine(backend, g0, *args, timed=timed, **kwargs)

    monkeypatch.setattr(replay_module, "continuous_engine", engine)
    monkeypatch.setattr(mod, "SPLIT_SEEDS", 1)
    return n


@pytest.mark.parametrize("seed", range(400, 410))
def test_replicas_give_the_cpu_engines_delta_file(tmp_path, seed, replicas):
    """Materialised at batches of 1, 7, 64 and 1024, inline and with the executor held 4 batches
    behind the updater (each replica applies ahead of its searches); count-only (each update's
    count, in the delta file) at batches of 1 and 64 against the CPU engine's at the same size."""
    from csmd.gpu.replicas import MultiGpuEngine
    from csmd.model.formats import read_graph, read_query

    qpaths, _ = make_case(tmp_path, seed, steps=80)
    reference, ref_results, _ = run_replay(tmp_path, qpaths, batch_size=7, threaded=False, name="ref.arrow")
    for b, lag in ((1, 0), (7, 0), (64, 0), (1024, 0), (3, 4)):
        table, results, pipe = run_replay(tmp_path, qpaths, batch_size=b, backend="gpu", executor_lag=lag,
                                          name=f"g{b}-{lag}.arrow")
        assert isinstance(pipe.engine, MultiGpuEngine) and len(pipe.engine.replicas) == replicas
        assert table.equals(reference), (b, lag)
        assert [(r["positive"], r["negative"]) for r in results] == [(r["positive"], r["negative"])
                                                                     for r in ref_results]
    g0, queries = read_graph(tmp_path / "g0.graph"), [(p.stem, read_query(p)) for p in qpaths]
    for b in (1, 64):  # a count-only file holds a record batch per batch: the CPU engine's at the same size
        assert delta_file(tmp_path, g0, queries, b, True, "gpu", f"c{b}")[0] == \
            delta_file(tmp_path, g0, queries, b, True, "cpu", f"c{b}")[0], b


@pytest.mark.parametrize("seed", range(410, 414))
def test_replicas_with_rows_sorted_on_each_device(tmp_path, seed, replicas, monkeypatch):
    """Every share's rows sorted on its device (drains.py): a query's rows of one batch in pieces
    from several devices, merged on the host into the CPU engine's order."""
    from csmd.gpu import executor

    qpaths, _ = make_case(tmp_path, seed, steps=80)
    reference, _, _ = run_replay(tmp_path, qpaths, batch_size=7, threaded=False, name="ref.arrow")
    monkeypatch.setattr(executor, "DEVICE_SORT_ROWS", 1)
    for b in (1, 64):
        table, _, _ = run_replay(tmp_path, qpaths, batch_size=b, backend="gpu", name=f"s{b}.arrow")
        assert table.equals(reference), b


def test_a_failure_on_one_device_stops_the_replay_and_a_fresh_one_is_exact(tmp_path, replicas, monkeypatch):
    """The last device's part of the third split search fails (as a device's out-of-memory error
    would): the replay raises that error, with no device left searching, and a fresh replay (a
    restart) gives the CPU engine's deltas. (The daemon exits 1 on an engine's error:
    test_gpu_daemon.)"""
    from csmd.gpu import replicas as mod

    qpaths, _ = make_case(tmp_path, 420, steps=80)
    reference, _, _ = run_replay(tmp_path, qpaths, batch_size=7, threaded=False, name="ref.arrow")
    part, calls = mod.MultiGpuEngine._part, []

    def failing(self, split, *args):
        if split[1] > 1 and split[0] == split[1] - 1:  # the last device's part of a split search
            calls.append(split)
            if len(calls) == 3:
                raise RuntimeError("device failure")
        return part(self, split, *args)

    monkeypatch.setattr(mod.MultiGpuEngine, "_part", failing)
    with pytest.raises(RuntimeError, match="device failure"):
        run_replay(tmp_path, qpaths, batch_size=7, backend="gpu", name="failed.arrow")
    assert len(calls) == 3 and calls[0] == (replicas - 1, replicas)
    monkeypatch.setattr(mod.MultiGpuEngine, "_part", part)
    table, _, _ = run_replay(tmp_path, qpaths, batch_size=7, backend="gpu", name="again.arrow")
    assert table.equals(reference)


@pytest.mark.parametrize("seed", range(100, 103))
def test_replicas_on_a_directed_stream(tmp_path, seed, replicas):
    from test_directed import _case, _replay

    qpaths, _ = _case(tmp_path, seed, steps=80)
    reference, _ = _replay(tmp_path, qpaths, 7, "cpu", "ref.arrow")
    for b in (1, 64):
        assert _replay(tmp_path, qpaths, b, "gpu", f"b{b}.arrow")[0].equals(reference), b


@pytest.mark.parametrize("seed", range(6))
def test_replicas_under_event_time_keep_the_constraints(tmp_path, seed, replicas):
    """Timed graphs on every replica, the queries' spans and orders judged on each: the deltas the
    model gives (test_time_constraints' cases)."""
    from test_event_time import got_deltas, timed_replay
    from test_time_constraints import constrained_case

    directed = seed % 2 == 1
    queries, truth, _, _, spec, _ = constrained_case(tmp_path, seed, directed=directed)
    table, _, _ = timed_replay(tmp_path, queries, spec, random.Random(seed).choice([1, 7, 64]), "gpu",
                               directed=directed)
    assert got_deltas(table, queries) == truth, seed


@pytest.mark.parametrize("gpus", [2, 4])
def test_the_human_stream_on_several_gpus(tmp_path, gpus, monkeypatch):
    """Q_1..Q_40 count-only with the split as it runs (searches of SPLIT_SEEDS or more) on the
    first `gpus` devices (replicas sharing a device where there are fewer): the reference totals;
    Q_2 and Q_26 materialised at batch 1024, every search split: one GPU's delta file, byte for byte."""
    from csmd.gpu import replicas as mod
    from csmd.jobs.replay import replay
    from csmd.model.formats import read_graph, read_query

    root = dataset("human")
    expected = read_expected(root / "expected_insert_counts.txt")
    have = devices_here()
    monkeypatch.setattr(mod, "device_ids", lambda n, setting="--gpus": [i % have for i in range(n)])
    g0 = read_graph(root / "data.graph")
    queries = [(name, read_query(root / "queries" / f"{name}.graph")) for name in expected]
    results, pipe = replay(g0, root / "insertion.graph", queries, batch_size=4096, count_only=True,
                           show_progress=False, backend="gpu", gpus=gpus)
    assert len(pipe.engine.replicas) == gpus
    assert {r["query"]: (r["positive"], r["negative"]) for r in results} == {n: (c, 0) for n, c in expected.items()}
    for dev, r in zip(pipe.engine.devices, pipe.engine.replicas):  # drained on every replica alike
        with dev:
            assert r.stats().live_versions == pipe.vertices.n
    some = [q for q in queries if q[0] in ("Q_2", "Q_26")]
    monkeypatch.setattr(mod, "SPLIT_SEEDS", 1)  # their few seeds a batch split too
    files = []
    for n in (1, gpus):
        replay(g0, root / "insertion.graph", some, batch_size=1024, count_only=False,
               output=tmp_path / f"{n}.arrow", show_progress=False, backend="gpu", gpus=n)
        files.append((tmp_path / f"{n}.arrow").read_bytes())
    assert files[0] == files[1]


# ---- static matching split over several devices (gpu/engine.py on_devices) ------------------
@pytest.fixture(params=[2, 3])
def split(request, monkeypatch):
    """n device ids for a static search, wrapped round the devices there are; every count is split
    (not first tried on one device: SPECULATE_S). With 3, every partial match deals out its first
    range (DEAL_RANGE 1: a root's, or a widened prefix's), not the one for the last depth
    enumerated (matcher.cu deal_at)."""
    from csmd.gpu import engine, matcher

    monkeypatch.setattr(engine, "SPECULATE_S", 0)
    if request.param == 3:
        monkeypatch.setattr(matcher, "DEAL_RANGE", 1)
    return [i % devices_here() for i in range(request.param)]


def split_rows(g, q, devices, **kw):
    from csmd.gpu.engine import match

    rows = []
    res = match(g, q, sink=lambda r: rows.append(np.array(r)), devices=devices, **kw)
    return res, [tuple(x) for r in rows for x in r.tolist()]


@pytest.mark.parametrize("seed", range(60))
def test_a_split_static_search_equals_brute_force(seed, split):
    """Counts, rows and --distinct of a search split over the devices (small graphs: a share
    often has no matches at all; queries of 2 and 3 vertices deal out whole roots), and limits
    (searched on the first device): the brute-force matcher's matches."""
    from csmd.gpu.engine import match
    from csmd.gpu.matcher import Tuning
    from static_cases import make_case, to_graph
    from brute import adjacency, brute_force

    kind, glabels, gedges, qlabels, qedges, truth = make_case(seed)
    g, q = to_graph(glabels, gedges, random.Random(seed * 7919 + 1)), to_graph(qlabels, qedges)
    total, ctx = len(truth), f"seed={seed} kind={kind}"
    res = match(g, q, devices=split)
    assert (res.count, res.complete) == (total, True), ctx
    res, rows = split_rows(g, q, split, tuning=Tuning(out_rows=32, offload_us=0.001))
    assert res.complete and res.count == len(rows) == total and set(rows) == truth, ctx
    qadj = adjacency(len(qlabels), qedges)
    autos = brute_force(qadj, qlabels, qadj, qlabels)
    res, rows = split_rows(g, q, split, distinct=True)
    expanded = {tuple(m[a[u]] for u in range(len(qlabels))) for m in rows for a in autos}
    assert res.complete and res.count * len(autos) == total and expanded == truth, ctx
    for limit in sorted({1, total // 2, max(total - 1, 1), total, total + 1}):
        r = match(g, q, limit=limit, devices=split)
        assert r.count == min(limit, total) and r.complete is (limit > total), (limit, ctx)
        r, got = split_rows(g, q, split, limit=limit, tuning=Tuning(out_rows=32))
        assert r.count == len(got) == len(set(got)) == min(limit, total) and set(got) <= truth, (limit, ctx)
        assert r.complete is (limit > total), (limit, ctx)


@pytest.mark.parametrize("seed", range(0, 40, 8))
def test_a_split_batch_on_a_hub_graph_equals_one_device(seed, split):
    """Many queries in one search on a graph with hubs of thousands of neighbours (whose ranges
    are dealt out), a one-vertex query (counted once) and one with no candidates among them:
    one device's counts, --distinct too."""
    import cupy

    from csmd.gpu.device_graph import device_graph
    from csmd.gpu.engine import match_many
    from csmd.gpu.filtering import QueryBatch, filter_candidates
    from static_cases import random_connected_query, to_graph
    from test_gpu_static import hub_case

    g, q, total = hub_case(seed)
    rng = random.Random(seed + 7)
    nlabels = int(g.labels.max()) + 1
    drawn = [to_graph(*random_connected_query(rng, rng.randint(2, 6), nlabels, 2)) for _ in range(16)]
    queries = [q] + [x for x, r in zip(drawn, match_many(g, drawn, time_limit=5.0)) if r.complete]
    queries += [to_graph([1], []), to_graph([nlabels, 0], [(0, 1, 0)])]
    assert len(queries) >= 6, f"seed={seed}: only {len(queries) - 3} random queries end within 5 s"
    # what the split rests on: refined to the fixpoint, every device (and every run) has the same candidates
    batch = QueryBatch.pack(queries)
    runs = []
    for device in dict.fromkeys(split):
        with cupy.cuda.Device(device):
            runs += [filter_candidates(device_graph(g), batch, converge=True)[0].get() for _ in range(2)]
    assert all(np.array_equal(runs[0], r) for r in runs[1:]), seed
    for distinct in (False, True):
        one = match_many(g, queries, distinct=distinct)
        got = match_many(g, queries, distinct=distinct, devices=split)
        assert [(r.count, r.complete) for r in got] == [(r.count, r.complete) for r in one], (seed, distinct)
        assert all(r.complete for r in got), (seed, distinct)
    assert match_many(g, queries, devices=split)[0].count == total
    assert got[-2].count == int((g.labels == 1).sum()) and got[-1].count == 0  # one vertex: no automorphism


def test_hprd_in_one_split_search(split, monkeypatch):
    """All 200 queries in one search, split; and each query alone, first tried on one device
    (SPECULATE_S as it is set; the larger ones split after it): the expected counts."""
    from csmd.gpu import engine
    from csmd.model.formats import read_graph, read_query

    root = dataset("hprd")
    g, expected = read_graph(root / "data.graph"), read_expected(root / "expected_counts.txt")
    queries = [read_query(root / "queries" / f"{name}.graph") for name in expected]
    res = engine.match_many(g, queries, devices=split)
    assert {n: (r.count, r.complete) for n, r in zip(expected, res)} == {n: (c, True) for n, c in expected.items()}
    monkeypatch.setattr(engine, "SPECULATE_S", 0.001)
    res = [engine.match(g, q, devices=split) for q in queries]
    assert {n: (r.count, r.complete) for n, r in zip(expected, res)} == {n: (c, True) for n, c in expected.items()}


def test_a_split_search_stops_at_its_limits(split):
    """A 7-vertex star on a hub of 3000 leaves (~3000^6 matches): a limit (searched on one device)
    gives its rows; the time limit stops every share; a sink that fails stops every share at its
    next drain, and the sink's own error is the one raised."""
    from csmd.gpu.engine import match
    from csmd.gpu.matcher import Tuning
    from test_gpu_static import star_graph

    g, q = star_graph()
    res, rows = split_rows(g, q, split, limit=100_000, tuning=Tuning(out_rows=1000))
    assert res.count == len(rows) == len(set(rows)) == 100_000 and not res.complete
    res = match(g, q, time_limit=0.3, devices=split)
    assert not res.complete and res.count > 0 and res.seconds < 3.0
    calls = []

    def full_disk(rows):
        calls.append(len(rows))
        if len(calls) == 3:
            raise OSError(28, "No space left on device")

    t = time.monotonic()
    with pytest.raises(OSError, match="No space left"):
        match(g, q, sink=full_disk, tuning=Tuning(out_rows=1000), time_limit=60, devices=split)
    assert time.monotonic() - t < 10 and len(calls) == 3


@pytest.mark.parametrize("seed", range(8))
def test_a_split_static_match_of_a_directed_or_timed_query(tmp_path, seed, split):
    """The timed static search (its seeds dealt out) and directed graphs: the matches the event-time
    model holds after its stream."""
    from collections import Counter

    from csmd.gpu.engine import GpuMatcher
    from csmd.model.formats import read_graph
    from test_time_constraints import constrained_case

    directed = seed % 2 == 1
    queries, _, _, _, _, model = constrained_case(tmp_path, seed, directed=directed)
    (tmp_path / "final.graph").write_text(model.text())
    g = read_graph(tmp_path / "final.graph", directed=directed)
    if g.edge_ts is None:
        pytest.skip("no edge has a ts")
    for name, q in queries.items():
        got = Counter()

        def sink(rows):
            for r in rows.tolist():
                got[tuple(g.ext_ids[x].item() for x in r)] += 1

        res = GpuMatcher(split).match(g, q, sink=sink)
        want = Counter(model.matches(q))
        assert res.complete and res.count == sum(got.values()) and got == want, (seed, name)
        assert GpuMatcher(split).match(g, q).count == len(want), (seed, name)


def test_csmd_match_with_several_gpus(tmp_path, capsys, monkeypatch):
    """`csmd match --gpus N` (devices wrapped round those there are): the counts of --gpus 1, one
    batch of queries and each query alone with --output (whose rows, sorted, are the same)."""
    import pyarrow.ipc as ipc

    from csmd.gpu import engine, replicas as mod
    from static_cases import run_cli

    have = devices_here()
    monkeypatch.setattr(mod, "device_ids", lambda n, setting="--gpus": [i % have for i in range(n)])
    root = dataset("hprd")
    some = [str(root / "queries" / f"{name}.graph") for name in list(read_expected(root / "expected_counts.txt"))[:12]]
    argv = ["match", "--json", "--backend", "gpu", "--data", str(root / "data.graph"), "--query", *some]
    monkeypatch.setattr(engine, "SPECULATE_S", 0)  # the batch split, not ended on one device
    one, two = run_cli(capsys, argv), run_cli(capsys, argv + ["--gpus", "3"])
    assert [(r["query"], r["matches"], r["complete"]) for r in two] == \
        [(r["query"], r["matches"], r["complete"]) for r in one]
    tables = []
    for n in ("1", "3"):
        out = tmp_path / f"{n}.arrow"
        run_cli(capsys, argv[:-len(some)] + some[:4] + ["--gpus", n, "--output", str(out)])  # asserts exit 0
        t = ipc.open_file(out).read_all().drop_columns(["index"])  # a match's number: the order it came in
        tables.append(sorted(map(str, t.to_pylist())))
    assert tables[0] == tables[1] and len(tables[0]) > 0
