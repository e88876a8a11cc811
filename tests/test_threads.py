"""The compiled engine gives the same results on 1 thread and on several: delta files byte for
byte (and the numpy engine's), static counts (and the brute-force truth); the settings that
choose the count."""

from __future__ import annotations

import random

import pytest

from csmd.cpu import compiled
from csmd.cpu.workers import chunks, thread_count
from csmd.backends import continuous_engine
from csmd.errors import CsmdError
from csmd.model.formats import read_graph, read_query
from csmd.model.plan import plan_query
from csmd.service.config import load_config

from continuous_cases import delta_file, make_case
from static_cases import make_case as static_case
from static_cases import to_graph


@pytest.mark.parametrize("seed", range(400, 408))
def test_delta_files_do_not_depend_on_the_thread_count(tmp_path, seed, monkeypatch):
    qpaths, _ = make_case(tmp_path, seed, steps=300)
    g0 = read_graph(tmp_path / "g0.graph")
    queries = [(p.stem, read_query(p)) for p in qpaths]
    batch_size = random.Random(seed).choice([16, 64, 200])
    monkeypatch.setattr(compiled, "SPLIT_SECONDS", -1.0)  # split every batch, however light
    for count_only in (False, True):
        files = {}
        for backend, threads in (("numpy", 1), ("cpu", 1), ("cpu", 3)):
            monkeypatch.setenv("CSMD_THREADS", str(threads))
            files[backend, threads], pipe = delta_file(tmp_path, g0, queries, batch_size, count_only, backend,
                                                       str(threads))
            assert getattr(pipe.engine, "threads", 1) == threads
        assert files["cpu", 1] == files["cpu", 3] == files["numpy", 1], (seed, count_only)


def test_pipeline_threads_setting_sets_the_daemons_engine_threads(tmp_path, monkeypatch):
    """[pipeline] threads (file or CSMD_PIPELINE__THREADS) reaches the compiled engine the daemon
    builds; 0 leaves the count to CSMD_THREADS."""
    g0 = to_graph([0, 1], [(0, 1, 0)])
    monkeypatch.setenv("CSMD_THREADS", "5")
    conf = tmp_path / "c.toml"
    conf.write_text("[pipeline]\nthreads = 3\n")
    for env, want in (({}, 3), ({"CSMD_PIPELINE__THREADS": "2"}, 2), ({"CSMD_PIPELINE__THREADS": "0"}, 5)):
        threads = load_config(conf, env=env).pipeline.threads
        assert continuous_engine("cpu", g0, threads=threads or None).threads == want


@pytest.mark.parametrize("seed", range(40))
def test_static_counts_do_not_depend_on_the_thread_count(seed):
    _, glabels, gedges, qlabels, qedges, truth = static_case(seed)
    g, q = to_graph(glabels, gedges), to_graph(qlabels, qedges)
    for distinct in (False, True):
        plan = plan_query(g, q, distinct=distinct)
        counts = {t: compiled.search(g, plan, threads=t) for t in (1, 2, 5)}
        assert all(r.complete for r in counts.values())
        assert len({r.count for r in counts.values()}) == 1, (seed, distinct)
        if not distinct:
            assert counts[1].count == len(truth)


def test_chunks_cover_the_range_in_order_and_the_setting_is_checked(monkeypatch):
    assert chunks(10, 1) == [(0, 10)]
    parts = chunks(100, 3)
    assert len(parts) == 12 and parts[0][0] == 0 and parts[-1][1] == 100
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    assert chunks(2, 4) == [(0, 1), (1, 2)] and chunks(0, 4) == [(0, 0)]
    monkeypatch.setenv("CSMD_THREADS", "3")
    assert thread_count() == 3
    monkeypatch.setenv("CSMD_THREADS", "0")
    with pytest.raises(CsmdError, match="CSMD_THREADS"):
        thread_count()
