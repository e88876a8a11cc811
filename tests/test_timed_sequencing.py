"""The sequencer's compiled pass over timed edge batches (pipeline/timed_edges.py) gives exactly
what its one-record-at-a-time path gives: on seeded random timed streams (undirected and
directed; in order and out of order; late records, replacements with the same and another ts,
deletions of missing edges, self-loops, duplicate insertions; windows with and without
lateness, and none), batch by batch, every array of the UpdateBatch, every record of record_of,
the ignored counts and the clock's state, at batch sizes 1, 7, 64 and 4096."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from csmd.cpu.numpy_engine import CpuEngine
from csmd.model.direction import MAX_DIRECTED_LABEL
from csmd.model.formats import Update
from csmd.model.graph import Graph
from csmd.model.time_constraints import NO_TS
from csmd.pipeline.event_time import EMPTY, Clock, EventTime, ts_get, ts_holds, ts_pop, ts_put, ts_take
from csmd.pipeline.sequencer import Sequencer, Vertices

ARRAYS = ("edge_seq", "edge_a", "edge_b", "edge_label", "edge_sign", "vertex_seq", "vertex_id", "vertex_sign",
          "new_labels", "edge_ts", "stored_ts")


def initial_graph(rng: random.Random, n: int, directed: bool) -> Graph:
    """n vertices (external ids from -20, some negative, in another order than the internal ids:
    the order of expiries with one ts) and random edges, most of them with a ts."""
    src = [rng.randrange(n) for _ in range(3 * n)]
    dst = [rng.randrange(n) for _ in range(3 * n)]
    ext = np.array(rng.sample(range(-20, 3 * n), n))
    g = Graph.from_edges([rng.randrange(2) for _ in range(n)], src, dst, [rng.randrange(2) for _ in src],
                         ext_ids=ext, directed=directed)
    timed = [i for i in range(len(src)) if rng.random() < 0.8]  # with self-loops and repeats: the clock drops them
    g.edge_ts = (ext[[src[i] for i in timed]], ext[[dst[i] for i in timed]],
                 np.array([rng.randrange(-30, 30) for _ in timed], np.int64))
    return g


def timed_stream(rng: random.Random, g: Graph, k: int, out_of_order: bool, vertex_records: bool) -> list[Update]:
    """k random timed records over g's vertices: mostly insertions and deletions, some of them
    replacements (a live edge again, with its ts or another), missing deletions (a pair without an
    edge, an unknown vertex), self-loops, late ones; with vertex_records also vertex additions,
    relabels and deletions and insertions that create a vertex (batches that _general takes)."""
    ids = [int(x) for x in g.ext_ids]
    written: list[tuple[int, int, int]] = []
    records = []
    for i in range(k):
        ts = 2 * i + (rng.randrange(-15, 5) if out_of_order else 0)
        if rng.random() < 0.05:
            ts -= rng.randrange(40, 400)  # late under most windows
        u, v = rng.sample(ids, 2)
        r = rng.random()
        if r < 0.45:
            label = 20000 if rng.random() < 0.03 else rng.randrange(3)  # past a directed graph's labels
            records.append(Update("e", u, v, label, ts=ts))
            written.append((u, v, ts))
        elif r < 0.55 and written:  # a live edge (maybe) again: its own ts (a duplicate) or another
            u, v, was = rng.choice(written[-30:])
            records.append(Update("e", *((u, v) if rng.random() < 0.7 else (v, u)), rng.randrange(3),
                                  ts=was if rng.random() < 0.4 else ts))
        elif r < 0.8:
            if written and rng.random() < 0.7:
                u, v, _ = rng.choice(written[-40:])
            records.append(Update("-e", *((u, v) if rng.random() < 0.7 else (v, u)), 0, ts=ts))
        elif r < 0.85:
            records.append(Update(rng.choice(["e", "-e"]), u, u, 0, ts=ts))
        elif r < 0.88:
            records.append(Update("-e", u, 10**9, 0, ts=ts))  # an unknown vertex: a missing deletion
        elif vertex_records and i % 200 < 50 and r < 0.95:
            kind = rng.random()
            if kind < 0.3:
                new = max(ids) + 5
                ids.append(new)
                records.append(Update("v", new, rng.randrange(2)))
            elif kind < 0.7:
                records.append(Update("v", u, rng.randrange(2)))  # a relabel, or the same label
            elif kind < 0.85:
                records.append(Update("-v", u))
            else:
                new = max(ids) + 3
                ids.append(new)
                records.append(Update("e", u, new, 0, ts=ts))  # creates its vertex
        else:
            records.append(Update("e", u, v, rng.randrange(3), ts=ts))
    return [replace(r, source=f"s:{i}", origin=("s", 0, i)) for i, r in enumerate(records)]  # an expiry names its record


def edges_ts(table: np.ndarray) -> np.ndarray:
    """The clock table's (key, ts) rows, by key."""
    rows = table[table[:, 0] != EMPTY]
    return rows[np.argsort(rows[:, 0])]


def assert_same(got, want, fast: Sequencer, slow: Sequencer) -> None:
    for name in ARRAYS:
        x, y = getattr(got, name), getattr(want, name)
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), name
    assert (got.first_seq, got.end_seq, got.first_vertex, got.records) == \
        (want.first_seq, want.end_seq, want.first_vertex, want.records)
    assert (got.stored is None) == (want.stored is None)
    if got.stored is not None:
        assert [x.tolist() for x in got.stored] == [x.tolist() for x in want.stored]
    assert dict(got.record_of) == dict(want.record_of)
    assert (fast.ignored, fast.next_seq) == (slow.ignored, slow.next_seq)
    a, b = fast.clock, slow.clock
    assert (a.high, a.expired, a.size, a.heap_n) == (b.high, b.expired, b.size, b.heap_n)
    assert np.array_equal(*(edges_ts(c.table) for c in (a, b)))  # (tables of other sizes: the batch reserves room at once)
    assert np.array_equal(a.heap_ts[: a.heap_n], b.heap_ts[: b.heap_n])
    assert np.array_equal(a.heap_key[: a.heap_n], b.heap_key[: b.heap_n])


CASES = [(directed, window, lateness, out_of_order, vertex_records)
         for directed in (False, True)
         for window, lateness, out_of_order in ((None, 0, True), (30, 0, False), (30, 0, True), (100, 7, True),
                                                (4, 3, True))
         for vertex_records in (False, True)]


@pytest.mark.parametrize("batch", [1, 7, 64, 4096])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_timed_edge_batches_take_the_compiled_pass_with_the_general_paths_result(case, batch):
    directed, window, lateness, out_of_order, vertex_records = CASES[case]
    rng = random.Random(case)
    g0 = initial_graph(rng, rng.randrange(8, 20), directed)
    records = timed_stream(rng, g0, 600, out_of_order, vertex_records)
    spec = EventTime(window, lateness)
    fast, slow = (Sequencer(Vertices(g0), CpuEngine(g0, timed=True), directed=directed, event_time=spec, g0=g0)
                  for _ in range(2))
    compiled = replaced = 0
    for lo in range(0, len(records), batch):
        part = records[lo: lo + batch]
        arrived = np.zeros(len(part))
        got = fast._timed_edges(part, arrived)
        eligible = all(r.op in ("e", "-e") for r in part) and not any(
            r.op == "e" and r.u != r.v and not (directed and r.label > MAX_DIRECTED_LABEL)
            and (r.u not in fast.vertices.index or r.v not in fast.vertices.index) for r in part)
        assert (got is not None) == eligible
        compiled += got is not None
        got = got if got is not None else fast._general(part, arrived)
        want = slow._general(part, arrived)
        assert_same(got, want, fast, slow)
        replaced += sum(want.record_of[q].op == "e" for q in want.edge_seq[want.edge_sign < 0].tolist())
        fast.engine.apply(got)
        slow.engine.apply(want)
    assert compiled or vertex_records and batch >= len(records), "no batch took the compiled pass"
    if window is not None:
        assert slow.clock.expired and slow.ignored["late"]
    assert slow.ignored["missing_delete"] and slow.ignored["self_loop"]
    if window is None or window > 10:  # (a tiny window expires an edge before it is named again)
        assert replaced and slow.ignored["duplicate_insert"]


def test_the_clock_table_keeps_what_a_dict_keeps():
    """The clock's hash table (open addressing, deletions shifting rows back) against a dict: a
    few hundred keys written, forgotten and taken again and again, through its growth."""
    rng = random.Random(5)
    clock, model = Clock(EventTime(None)), {}
    keys = [(rng.randrange(40) << 32) | rng.randrange(40) for _ in range(300)]
    for step in range(20000):
        key, ts = rng.choice(keys), rng.randrange(-5, 5)
        r = rng.random()
        if r < 0.4:
            clock.reserve(1)
            clock.size = ts_put(clock.table, clock.size, key, ts)
            model[key] = ts
        elif r < 0.6:
            got, clock.size = ts_pop(clock.table, clock.size, key)
            assert got == model.pop(key, NO_TS)
        elif r < 0.8:
            taken, clock.size = ts_take(clock.table, clock.size, key, ts)
            assert taken == (model.get(key) == ts)
            if taken:
                del model[key]
        else:
            assert ts_holds(clock.table, key, ts) == (model.get(key) == ts)
        assert clock.size == len(model)
        if step % 1000 == 0:
            assert all(ts_get(clock.table, k) == model.get(k, NO_TS) for k in keys)
    assert len(clock.table) > 64  # it grew


@pytest.mark.parametrize("ext", [[-5, 3, 7], [3, 7, 10**6]])
def test_a_vertex_table_made_later_holds_the_ids_before_it(ext):
    """A graph whose ids kept it from an id table (a negative one, one too sparse) gets one when
    a vertex with a small id comes: it must hold the ids already there (an id read as unknown
    sends a batch down the record-by-record path, or reads as a missing edge in a deletion)."""
    vx = Vertices(Graph.from_edges([0, 0, 0], [], [], ext_ids=np.array(ext)))
    vx.add(1, 0)
    assert vx.lookup(np.array([3, 7, 1])).tolist() == [1 if ext[0] < 0 else 0, 2 if ext[0] < 0 else 1, 3]
