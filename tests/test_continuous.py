"""The continuous pipeline against brute force: every update's delta, any batching, GC, bad streams."""

from __future__ import annotations

import gc
import random
import subprocess
import threading
import time
import sys

import numpy as np
import pyarrow.ipc as ipc
import pytest

from csmd.cpu import compiled
from csmd.backends import continuous_engine
import csmd.jobs.replay as replay_module
from csmd.jobs.replay import decoded_updates, replay
from csmd.model.formats import read_graph, read_query
import csmd.pipeline.stages as stages
from csmd.pipeline.stages import Pipeline, _Frozen, heap_frozen

from continuous_cases import Model, assert_brute_force, delta_file, make_case, run_replay
from helpers import ENGINES


@pytest.mark.parametrize("seed", range(60))
def test_every_delta_equals_brute_force(tmp_path, seed, backend):
    qpaths, truth = make_case(tmp_path, seed)
    table, results, _ = run_replay(tmp_path, qpaths, batch_size=random.Random(seed).choice([1, 3, 64]),
                                   backend=backend)
    assert_brute_force(table, results, truth, seed)


@pytest.mark.parametrize("seed", range(200, 220))
def test_updater_runs_ahead_of_the_executor_and_deltas_stay_exact(tmp_path, seed, backend):
    """The executor is held back until 4 more batches were applied: it reads every update at
    its own timestamp from a graph that already holds later batches."""
    qpaths, truth = make_case(tmp_path, seed, steps=60)
    table, results, pipe = run_replay(tmp_path, qpaths, batch_size=random.Random(seed).choice([1, 2, 5]),
                                      backend=backend, executor_lag=4)
    assert pipe.stats.max_ahead >= 4
    assert_brute_force(table, results, truth, seed)


@pytest.mark.parametrize("seed", range(100, 112))
def test_deltas_do_not_depend_on_batching_or_scheduling(tmp_path, seed, backend, monkeypatch):
    """Batches of 1, 7, 64 and 100 records on the stage threads and inline (small fixed batches run on
    the updater's thread, with the next batch submitted before a batch's output, unless
    INLINE_RECORDS is 0), and with the executor held behind."""
    qpaths, _ = make_case(tmp_path, seed, steps=80)
    reference, _, _ = run_replay(tmp_path, qpaths, batch_size=1, threaded=False, name="ref.arrow")  # the CPU engine
    for b, threaded, lag, small in ((1, True, 0, 64), (7, True, 0, 64), (64, True, 0, 64), (100, True, 0, 64),
                                    (1, True, 0, 0), (7, True, 0, 0), (7, False, 0, 64), (64, False, 0, 64),
                                    (3, True, 5, 64)):
        monkeypatch.setattr(stages, "INLINE_RECORDS", small)
        table, _, pipe = run_replay(tmp_path, qpaths, batch_size=b, threaded=threaded,
                                    name=f"b{b}{threaded}{lag}{small}.arrow", backend=backend, executor_lag=lag)
        assert table.equals(reference), (b, threaded, lag, small)
        if threaded:  # which batches ran inline: the small ones, without a lag
            assert pipe.stats.inline == (pipe.stats.batches if b <= small and not lag else 0), (b, lag, small)


@pytest.mark.parametrize("seed", range(300, 308))
@pytest.mark.parametrize("backend", ENGINES[-1:])
def test_drains_sorted_on_the_device_give_the_same_deltas(tmp_path, seed, backend, monkeypatch):
    """The GPU executor with every search's rows put in canonical order on the device: in one drain;
    with an output buffer of 32 rows, its drains held on the device for one sort; and sorted in
    pieces of 64 rows or more (a query's rows of a batch in several sorted pieces, merged on the
    host). The CPU engine's delta file, at batch sizes 1, 7 and 64."""
    from csmd.gpu import executor

    qpaths, _ = make_case(tmp_path, seed, steps=80)
    reference, _, _ = run_replay(tmp_path, qpaths, batch_size=7, threaded=False, name="ref.arrow")
    monkeypatch.setattr(executor, "DEVICE_SORT_ROWS", 1)
    for out_rows, hold in ((1 << 18, 1 << 22), (32, 1 << 22), (32, 64)):
        monkeypatch.setattr(executor, "EX_TUNING", dict(executor.EX_TUNING, out_rows=out_rows))
        monkeypatch.setattr(executor, "DEVICE_HOLD_ROWS", hold)
        for b in (1, 7, 64):
            table, _, _ = run_replay(tmp_path, qpaths, batch_size=b, name=f"d{out_rows}-{hold}-{b}.arrow",
                                     backend=backend)
            assert table.equals(reference), (out_rows, hold, b)


def test_an_inline_batch_is_output_when_the_source_goes_idle(tmp_path):
    """Small fixed batches run inline, each output after the next batch's submission; when the source
    has nothing more for now, the batch held back is output at once, not when the next record comes."""
    qpaths, _ = make_case(tmp_path, 3, steps=20)
    g0 = read_graph(tmp_path / "g0.graph")
    updates = list(decoded_updates(tmp_path / "stream.txt"))
    pipe = Pipeline(g0, engine=continuous_engine("cpu", g0), batch_size=1, batch_wait=10.0)
    for p in qpaths:
        pipe.add_query(p.stem, read_query(p))
    seen, last = [], threading.Event()

    def source():
        yield from updates
        deadline = time.monotonic() + 30
        while not last.is_set() and time.monotonic() < deadline:  # idle until the last record's deltas come
            time.sleep(0.001)
            yield None

    def on_result(result):
        seen.append(result.batch.records)
        if len(seen) == len(updates):
            last.set()

    t0 = time.monotonic()
    pipe.run(source(), on_result)
    assert last.is_set() and time.monotonic() - t0 < 20
    assert pipe.stats.inline == len(updates)


@pytest.mark.parametrize("seed", range(120, 126))
def test_batches_grow_while_the_executor_is_behind_and_deltas_stay_the_same(tmp_path, seed, backend):
    """The executor held back: the batches formed meanwhile grow past batch_size up to max_batch;
    the delta file (ids included) is the one of batches of one."""
    qpaths, _ = make_case(tmp_path, seed, steps=80)
    reference, _, _ = run_replay(tmp_path, qpaths, batch_size=1, threaded=False, name="ref.arrow")
    table, _, pipe = run_replay(tmp_path, qpaths, batch_size=2, name="grown.arrow", backend=backend, executor_lag=3,
                                max_batch=9)
    assert table.equals(reference)
    assert pipe.stats.largest == 9 and pipe.stats.batches < pipe.stats.records / 2


@pytest.mark.parametrize("seed", range(130, 136))
def test_batches_of_a_quiet_source_run_inline_and_deltas_stay_the_same(tmp_path, seed, backend, monkeypatch):
    """A polling source that is idle (None) before some records: those batches run all their
    stages on the updater's thread when nothing is in flight, the others on the stage
    threads (small batches are not inlined as such here); the delta file is the one of
    batches of one run inline."""
    monkeypatch.setattr(stages, "INLINE_RECORDS", 0)
    qpaths, _ = make_case(tmp_path, seed, steps=80)
    reference, _, _ = run_replay(tmp_path, qpaths, batch_size=1, threaded=False, name="ref.arrow")
    rng = random.Random(seed)
    polled = [None]  # idle first: the first batch always runs inline
    for u in decoded_updates(tmp_path / "stream.txt"):
        polled += [None, u] if rng.random() < 0.5 else [u]
    for b in (1, 7):
        table, _, pipe = run_replay(tmp_path, qpaths, batch_size=b, name=f"quiet{b}.arrow", backend=backend,
                                    stream=polled)
        assert table.equals(reference), b
        assert pipe.threaded and 1 <= pipe.stats.inline < pipe.stats.batches


def test_each_update_keeps_its_arrival_time_across_batch_cuts(monkeypatch):
    """Records and blocks arriving at known times, cut into batches of 4 updates: each batch's
    arrival times are its updates', in order, one per update (the latency histogram's input)."""
    from types import SimpleNamespace

    from csmd.model.formats import Update, UpdateBlock
    from csmd.model.graph import Graph
    import csmd.pipeline.stages as stages

    clock = iter(range(1, 100))  # the batcher's clock only (other threads keep the real one)
    monkeypatch.setattr(stages, "time", SimpleNamespace(monotonic=lambda: float(next(clock))))
    z = np.zeros(6, np.int64)
    block = UpdateBlock("s.txt", np.arange(6), z.astype(np.int8), z, z + 1, z)
    one = Update("e", 0, 1, 0, "s.txt:9", ("s.txt", 0, 9))
    g0 = Graph.from_edges([0, 0], [], [])
    pipe = Pipeline(g0, engine=continuous_engine("numpy", g0), batch_size=4)
    got = [(len(batch), times.tolist()) for batch, times, _ in pipe._batches([one, block, one, one, block])]
    # arrivals: the record at 1, the block at 2, the records at 3 and 4, the block at 5
    want = [2.0] * 6 + [5.0] * 6
    want = [1.0] + want[:6] + [3.0, 4.0] + want[6:]
    assert got == [(len(want[i:i + 4]), want[i:i + 4]) for i in range(0, len(want), 4)]


@pytest.mark.parametrize("threaded", [False, True])
def test_the_heap_is_frozen_while_a_stream_runs_and_unfrozen_after(tmp_path, threaded, backend):
    """What exists at a stream's start (the engine among it) is out of the cyclic collector's
    sight while the stream runs, so that a full collection does not walk it (one stalled every
    record in flight for 70-85 ms on the device host), and back in it afterwards."""
    qpaths, _ = make_case(tmp_path, 140, steps=40)
    g0 = read_graph(tmp_path / "g0.graph")
    pipe = Pipeline(g0, engine=continuous_engine(backend, g0), batch_size=3, threaded=threaded)
    for p in qpaths:
        pipe.add_query(p.stem, read_query(p))
    seen = []

    def on_result(result):
        seen.append(any(o is pipe.engine for o in gc.get_objects()))

    try:
        pipe.run(decoded_updates(tmp_path / "stream.txt"), on_result)
    finally:
        pipe.engine.close()
    assert seen and not any(seen)
    if not _Frozen.runs:  # no other stream of this process (a test's daemon thread) holds it frozen
        assert gc.get_freeze_count() == 0 and any(o is pipe.engine for o in gc.get_objects())


def test_overlapping_streams_keep_the_heap_frozen_until_the_last_ends():
    """Pipelines in several threads: the first stream to end leaves the heap frozen for the others."""
    if _Frozen.runs:
        pytest.skip("a stream of this process is running")
    made_before = Model(random.Random(0), 2, 1, 1, 0.5)
    first, second = heap_frozen(), heap_frozen()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not any(o is made_before for o in gc.get_objects())
    second.__exit__(None, None, None)
    assert gc.get_freeze_count() == 0 and any(o is made_before for o in gc.get_objects())


@pytest.mark.parametrize("seed", range(300, 316))
def test_compiled_deltas_are_byte_identical_to_numpy(tmp_path, seed):
    """The compiled engine's delta file (materialized and count-only) is the numpy engine's, byte for byte."""
    qpaths, _ = make_case(tmp_path, seed, steps=120)
    g0 = read_graph(tmp_path / "g0.graph")
    queries = [(p.stem, read_query(p)) for p in qpaths]
    batch_size = random.Random(seed).choice([1, 4, 64])
    for count_only in (False, True):
        files = {}
        for backend in ("cpu", "numpy"):
            files[backend], pipe = delta_file(tmp_path, g0, queries, batch_size, count_only, backend)
            assert pipe.engine.name == backend
        assert files["cpu"] == files["numpy"], (seed, count_only)


@pytest.mark.parametrize("seed", range(320, 324))
def test_compiled_batches_split_over_threads_overlap_and_give_the_same_deltas(tmp_path, seed, monkeypatch):
    """Every batch split over two threads, each chunk slowed down: the executor submits the next
    batches while earlier ones are still searched (several in flight), compactions forced
    every few releases wait for them, and the delta file is the one of batches of one."""
    qpaths, _ = make_case(tmp_path, seed, steps=80)
    reference, _, _ = run_replay(tmp_path, qpaths, batch_size=1, threaded=False, name="ref.arrow")
    monkeypatch.setattr(compiled, "SPLIT_SECONDS", -1.0)
    engines, in_flight = [], [0]
    match = compiled.CompiledEngine._match

    def slow_match(self, *args):
        in_flight[0] = max(in_flight[0], self._searches)
        time.sleep(0.002)
        return match(self, *args)

    def engine(backend, g0, timed=False, gpus=1):
        e = compiled.CompiledEngine(g0, threads=2, timed=timed)
        free, releases = e.mvg.free, iter(range(1 << 30))
        e.mvg.free = lambda versions: free(versions) or next(releases) % 3 == 2
        engines.append(e)
        return e

    monkeypatch.setattr(compiled.CompiledEngine, "_match", slow_match)
    monkeypatch.setattr(replay_module, "continuous_engine", engine)
    table, _, pipe = run_replay(tmp_path, qpaths, batch_size=2, name="split.arrow", threaded=True)
    assert table.equals(reference)
    assert in_flight[0] >= 2 and engines[0].mvg.compactions > 0 and engines[0]._searches == 0


@pytest.mark.parametrize("seed", range(400, 406))
def test_lines_left_to_the_line_parser_give_the_same_deltas(tmp_path, seed):
    """Some lines spelled with a '+' sign, which the compiled reader leaves to the line parser:
    batches then mix block rows with Updates, and the delta file is the plain stream's."""
    qpaths, _ = make_case(tmp_path, seed, steps=80)
    plain, _, _ = run_replay(tmp_path, qpaths, batch_size=7, name="plain.arrow")
    rng = random.Random(seed)
    stream = tmp_path / "stream.txt"
    lines = [line.replace(" ", " +", 1) if rng.random() < 0.3 else line for line in stream.read_text().splitlines()]
    stream.write_text("\n".join(lines) + "\n")
    signed, _, _ = run_replay(tmp_path, qpaths, batch_size=7, name="signed.arrow")
    assert signed.equals(plain) and signed.num_rows


@pytest.mark.parametrize("seed", range(410, 414))
def test_a_graph_keyed_by_strings_reads_its_streams_ids_as_strings(tmp_path, seed):
    """The same case with every id spelled as a string ("n" + id) in a Parquet graph and its text
    stream: the same deltas, vertex for vertex. The stream's ids were read as integers before, and
    made new vertices beside the graph's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    qpaths, truth = make_case(tmp_path, seed, steps=60)
    plain, _, _ = run_replay(tmp_path, qpaths, batch_size=7, name="plain.arrow")
    g = read_graph(tmp_path / "g0.graph")
    name = np.array([f"n{x}" for x in g.ext_ids], dtype=object)
    s, d, e = g.edge_list()
    pq.write_table(pa.table({"src": name[s], "dst": name[d], "label": e}), tmp_path / "g0.parquet")
    pq.write_table(pa.table({"id": name, "label": g.labels}), tmp_path / "g0.vertices.parquet")
    lines = []
    for line in (tmp_path / "stream.txt").read_text().splitlines():
        op, *f = line.split()
        ids = 1 if op in ("v", "-v") else 2
        lines.append(" ".join([op, *(f"n{x}" for x in f[:ids]), *f[ids:]]))
    (tmp_path / "named.txt").write_text("\n".join(lines) + "\n")
    out = tmp_path / "named.arrow"
    results, _ = replay(read_graph(tmp_path / "g0.parquet"), tmp_path / "named.txt",
                        [(p.stem, read_query(p)) for p in qpaths], batch_size=7, count_only=False, output=out,
                        show_progress=False)
    named = ipc.open_file(out).read_all()
    assert named.column("vertices").to_pylist() == [[f"n{x}" for x in v] for v in plain.column("vertices").to_pylist()]
    assert named.column("seq").equals(plain.column("seq")) and named.column("sign").equals(plain.column("sign"))
    assert [r["positive"] for r in results] == [sum(c for (_, s, _), c in truth[p.stem].items() if s > 0)
                                                for p in qpaths]


def test_ops_no_anchor_edge_can_take_skip_the_search_and_no_delta_is_lost(tmp_path, monkeypatch):
    """With 5 vertex labels most edge ops match the end labels of no anchor edge of either query:
    the compiled engine hands only the others to its kernel, and every delta still equals brute force."""
    from csmd.cpu import compiled

    submitted, handed = [0], {}
    submit, match_units = compiled.CompiledEngine.submit, compiled.match_units

    def count_submitted(self, batch, queries, select=None):
        submitted[0] += len(batch.edge_seq)
        return submit(self, batch, queries, select)

    def count_handed(view, ps, unit_e, unit_p, seq, *rest):
        handed[id(seq)] = seq  # each thread of a search gets the same ops (kept: an id is not reused)
        return match_units(view, ps, unit_e, unit_p, seq, *rest)

    monkeypatch.setattr(compiled.CompiledEngine, "submit", count_submitted)
    monkeypatch.setattr(compiled, "match_units", count_handed)
    deltas = 0
    for seed in range(500, 510):
        qpaths, truth = make_case(tmp_path, seed, steps=80, labels=5)
        table, results, _ = run_replay(tmp_path, qpaths, batch_size=random.Random(seed).choice([1, 3, 64]),
                                       name=f"{seed}.arrow")
        assert_brute_force(table, results, truth, seed)
        deltas += table.num_rows
    assert deltas and 0 < sum(map(len, handed.values())) < submitted[0] / 2


def test_count_only_equals_materialized(tmp_path):
    qpaths, truth = make_case(tmp_path, 7, steps=80)
    g0 = read_graph(tmp_path / "g0.graph")
    queries = [(p.stem, read_query(p)) for p in qpaths]
    counted, pipe = replay(g0, tmp_path / "stream.txt", queries, batch_size=5, count_only=True, show_progress=False)
    assert pipe.threaded and pipe.stats.inline == pipe.stats.batches  # small fixed batches: all on the updater's thread
    for res in counted:
        assert res["positive"] == sum(c for (_, s, _), c in truth[res["query"]].items() if s > 0)
        assert res["negative"] == sum(c for (_, s, _), c in truth[res["query"]].items() if s < 0)


def test_gc_keeps_versions_and_memory_bounded(tmp_path):
    rng = random.Random(5)
    n = 300
    (tmp_path / "g0.graph").write_text("".join(f"v {i} {i % 3}\n" for i in range(n)))
    live: set = set()
    lines = []
    for _ in range(20000):
        if live and (len(live) > 1500 or rng.random() < 0.45):
            a, b = live.pop()
            lines.append(f"-e {a} {b}")
        else:
            a, b = sorted(rng.sample(range(n), 2))
            if (a, b) not in live:
                live.add((a, b))
                lines.append(f"e {a} {b}")
    (tmp_path / "stream.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "q.graph").write_text("v 0 0\nv 1 1\nv 2 2\ne 0 1\ne 1 2\n")
    g0 = read_graph(tmp_path / "g0.graph")
    _, pipe = replay(g0, tmp_path / "stream.txt", [("q", read_query(tmp_path / "q.graph"))], batch_size=16,
                     count_only=True, show_progress=False)
    mvg = pipe.engine.mvg  # the CPU engine's arena
    assert mvg.live_versions <= n  # one current version per vertex once drained
    assert pipe.gc.released > 1000
    assert mvg.compactions > 0
    # the arena holds the live edges (twice, one entry per endpoint) plus bounded garbage
    assert mvg.e_nbr.n <= 2 * 2 * len(live) + (1 << 16) + 4 * n


def test_bad_stream_line_stops_replay_with_file_line_reason(tmp_path):
    (tmp_path / "g0.graph").write_text("v 1 0\nv 2 0\nv 3 0\ne 1 2 0\n")
    (tmp_path / "q.graph").write_text("v 0 0\nv 1 0\ne 0 1\n")
    cases = {
        "e 1 3\nx 1 2\n": "stream.txt:2: unknown op 'x'",
        "e 1 3\n-e 1 zz\n": "stream.txt:2: bad integer 'zz' for vertex id",
        "# c\n\ne 1 3 0 9 8\n": "stream.txt:3: wrong field count: 'e' takes u v [label [ts]], got 5 fields",
        "v 7\n": "stream.txt:1: wrong field count: 'v' takes id label, got 1 fields",
    }
    for text, message in cases.items():
        (tmp_path / "stream.txt").write_text(text)
        proc = subprocess.run([sys.executable, "-m", "csmd", "replay", "--data", str(tmp_path / "g0.graph"),
                               "--stream", str(tmp_path / "stream.txt"), "--query", str(tmp_path / "q.graph")],
                              capture_output=True, text=True)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_ignored_updates_are_counted_not_fatal(tmp_path):
    (tmp_path / "g0.graph").write_text("v 1 0\nv 2 0\nv 3 0\ne 1 2 0\n")
    (tmp_path / "q.graph").write_text("v 0 0\nv 1 0\ne 0 1\n")
    (tmp_path / "stream.txt").write_text("e 1 2\n-e 2 3\nv 1 0\n-v 9\ne 3 3\ne 2 3\n")
    g0 = read_graph(tmp_path / "g0.graph")
    res, pipe = replay(g0, tmp_path / "stream.txt", [("q", read_query(tmp_path / "q.graph"))], batch_size=4,
                       count_only=True, show_progress=False)
    assert dict(pipe.ignored) == {"duplicate_insert": 1, "missing_delete": 1, "duplicate_vertex": 1,
                                          "missing_vertex": 1, "self_loop": 1}
    assert res[0]["positive"] == 2 and res[0]["negative"] == 0 and res[0]["updates"] == 6
