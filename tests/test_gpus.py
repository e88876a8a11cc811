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
    the devices there are; every search of one seed or more is split over them."""
    from csmd.backends import continuous_engine
    import csmd.jobs.replay as replay_module
    from csmd.gpu import replicas as mod

    n, have = request.param, devices_here()

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
