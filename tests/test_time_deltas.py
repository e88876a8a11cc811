"""ts_min and ts_max in the deltas (csmd.deltas/3): canonical() keeps each match's ts with it, the
encoder writes them (null where time is off, for count-only rows, where the engine gave none and
where a match has no ts), in every piece and in both orders; a timed replay's file against the
ts of each match's edges."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

import csmd.pipeline.deltas as deltas
from csmd.engine import ContinuousQuery, Matches, QueryDeltas, UpdateBatch
from csmd.jobs.replay import replay
from csmd.model.formats import Update, read_graph, read_query
from csmd.model.graph import Graph
from csmd.model.time_constraints import NO_TS
from csmd.pipeline.deltas import DeltaEncoder
from csmd.pipeline.event_time import EventTime
from csmd.pipeline.queries import canonical
from csmd.pipeline.sequencer import Vertices
from csmd.pipeline.stages import BatchResult
from csmd.schemas import DELTAS_VERSION, deltas_schema
from helpers import ENGINES


def test_the_schema_is_v3_with_ts_min_and_ts_max_last():
    schema = deltas_schema()
    assert DELTAS_VERSION == "csmd.deltas/3"
    assert schema.names[-2:] == ["ts_min", "ts_max"] and schema.names[:3] == ["query", "sign", "seq"]
    assert all(schema.field(c).type == pa.int64() and schema.field(c).nullable for c in ("ts_min", "ts_max"))


def _batch(first: int, end: int, record_of=None) -> UpdateBatch:
    z = np.zeros(0, np.int64)
    return UpdateBatch(first, end, np.arange(first, end), np.zeros(end - first, np.int64),
                       np.ones(end - first, np.int64), np.zeros(end - first, np.int64),
                       np.where(np.arange(first, end) % 3, 1, -1).astype(np.int8), z, z, z, np.zeros(0, np.int32), 0,
                       record_of or {})


@pytest.mark.parametrize("seed", range(4))
def test_canonical_keeps_each_matchs_ts_with_its_row(seed):
    rng = np.random.default_rng(seed)
    k, n = 500, 3
    rows = np.unique(rng.integers(0, 40, (k, n)), axis=0).astype(np.int32)
    rows = rows[rng.permutation(len(rows))]
    seq = rng.integers(10, 14, len(rows))
    ts = np.sort(rng.integers(-50, 50, (len(rows), 2)), axis=1)
    ts[rng.random(len(rows)) < 0.2] = NO_TS  # matches without a ts
    q = Graph.from_edges([0] * n, [0, 1], [1, 2])
    want = {(s, tuple(r)): tuple(t) for s, r, t in zip(seq.tolist(), rows.tolist(), ts.tolist())}
    (d,) = canonical([(ContinuousQuery("q", q, False, [], []), Matches(seq, rows=rows, ts=ts))], _batch(10, 14))
    assert d.ts.shape == (len(rows), 2) and d.ts.dtype == np.int64
    assert [want[(s, tuple(r))] for s, r in zip(d.seq.tolist(), d.rows.tolist())] == [tuple(t) for t in d.ts.tolist()]
    (d,) = canonical([(ContinuousQuery("q", q, False, [], []), Matches(seq, rows=rows))], _batch(10, 14))
    assert d.ts is None  # an untimed engine, or the GPU's: no ts
    (d,) = canonical([(ContinuousQuery("q", q, True, [], []), Matches(seq[:3], counts=np.ones(3, np.int64)))],
                     _batch(10, 14))
    assert d.ts is None  # count-only


@pytest.mark.parametrize("by_update", [False, True])
@pytest.mark.parametrize("max_rows", [1 << 20, 3])
def test_the_encoder_writes_each_rows_ts_and_nulls_where_there_is_none(monkeypatch, by_update, max_rows):
    """Three queries of one batch: one whose engine gave ts (some matches without one), one whose
    gave none (the GPU's under event time), one count-only; cut in pieces of max_rows rows."""
    monkeypatch.setattr(deltas, "MAX_ROWS", max_rows)
    rng = random.Random(max_rows + by_update)
    record_of = {s: Update("e", 0, 1, 0, f"r{s}", ("in", 0, s)) for s in range(20, 30)}
    batch = _batch(20, 30, record_of)
    enc = DeltaEncoder(Vertices(Graph.from_edges([0] * 6, [0], [1], ext_ids=[-5, 7, 9, 11, 13, 15])))

    def part(name, k, timed):
        seq = np.array(sorted(rng.choices(range(20, 30), k=k)), np.int64)
        rows = np.array([rng.sample(range(6), 3) for _ in range(k)], np.int32).reshape(k, 3)
        ts = None
        if timed:
            ts = np.sort(np.array([[rng.randrange(-9, 9), rng.randrange(-9, 9)] for _ in range(k)], np.int64)
                         .reshape(k, 2), 1)
            ts[::4] = NO_TS
        return QueryDeltas(name, seq, batch.edge_sign[seq - 20], rows, 0, 0, ts=ts)

    counted = np.array([21, 24, 29], np.int64)
    parts = [part("timed", 11, True), part("untimed", 5, False),
             QueryDeltas("counted", counted, batch.edge_sign[counted - 20], None, 0, 0, np.array([2, 1, 4])),
             part("empty", 0, True)]
    table = pa.Table.from_batches([b for _q, b, _o in enc.encode(BatchResult(batch, parts, 0.0), by_update)])
    assert table.schema == deltas_schema()
    want = []
    for d in parts:
        for j, s in enumerate(d.seq.tolist()):
            ts = (None, None) if d.ts is None or d.ts[j, 0] == NO_TS else tuple(d.ts[j].tolist())
            want.append((d.name, s, j, ts))
    if by_update:
        want.sort(key=lambda w: w[1])  # stable: by query, then in the query's order, within an update
    got = list(zip(table.column("query").to_pylist(), table.column("seq").to_pylist(),
                   table.column("ts_min").to_pylist(), table.column("ts_max").to_pylist()))
    assert got == [(name, s, *ts) for name, s, _j, ts in want]


def test_without_ts_the_columns_are_null_and_the_rest_is_as_before(tmp_path):
    """An untimed replay's file: ts_min and ts_max null on every row; the other columns are the
    deltas as csmd.deltas/2 had them (the same file without the two columns)."""
    (tmp_path / "g.graph").write_text("v 1 0\nv 2 0\nv 3 0\nv 4 0\ne 1 2 0\ne 2 3 0\n")
    (tmp_path / "s.txt").write_text("e 3 1 0\ne 3 4 0\n-e 1 2 0\n")
    (tmp_path / "tri.graph").write_text("v 0 0\nv 1 0\nv 2 0\ne 0 1\ne 1 2\ne 2 0\n")
    res, _ = replay(read_graph(tmp_path / "g.graph"), tmp_path / "s.txt", [("tri", read_query(tmp_path / "tri.graph"))],
                    batch_size=1, count_only=False, output=tmp_path / "d.arrow", show_progress=False, backend="cpu")
    table = ipc.open_file(tmp_path / "d.arrow").read_all()
    assert table.num_rows == res[0]["positive"] + res[0]["negative"] == 12
    assert table.column("ts_min").null_count == table.column("ts_max").null_count == 12
    assert table.schema.names == deltas_schema().names


class TimedStream:
    """A random timed graph and an insert/delete stream over it (no pair inserted twice: each
    edge keeps one ts while it lives), with every edge's ts by definition."""

    def __init__(self, rng: random.Random, directed: bool):
        self.directed = directed
        self.ts = {}  # edge -> ts or None, every edge that ever lived (none is inserted twice)
        ids = list(range(1, 9))
        pairs = [(a, b) for a in ids for b in ids if a != b and (directed or a < b)]
        rng.shuffle(pairs)
        start, later = pairs[:10], pairs[10:24]
        for e in start:
            self.ts[self.key(*e)] = None if rng.random() < 0.3 else rng.randrange(0, 50)
        self.g0 = "".join(f"v {v} 0\n" for v in ids) + "".join(
            f"e {a} {b} 0{'' if self.ts[self.key(a, b)] is None else f' {self.ts[self.key(a, b)]}'}\n" for a, b in start)
        lines, live = [], list(start)
        for e in later:
            if live and rng.random() < 0.25:
                gone = live.pop(rng.randrange(len(live)))
                lines.append(f"-e {gone[0]} {gone[1]} 0 {rng.randrange(0, 50)}")
            self.ts[self.key(*e)] = rng.randrange(0, 50)
            lines.append(f"e {e[0]} {e[1]} 0 {self.ts[self.key(*e)]}")
            live.append(e)
        self.stream = "".join(line + "\n" for line in lines)

    def key(self, a, b):
        return (a, b) if self.directed else frozenset((a, b))

    def span(self, q: Graph, vertices: list) -> tuple:
        """(ts_min, ts_max) over the match's edges that have a ts; (None, None) where none has."""
        s, d, _ = q.arcs()
        have = [self.ts[self.key(vertices[a], vertices[b])] for a, b in zip(s.tolist(), d.tolist())]
        have = [t for t in have if t is not None]
        return (min(have), max(have)) if have else (None, None)


@pytest.mark.parametrize("backend", ENGINES + [pytest.param("gpu-sorted", marks=ENGINES[-1].marks)])
@pytest.mark.parametrize("directed", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_a_timed_replays_rows_carry_the_first_and_last_ts_of_their_matchs_edges(tmp_path, seed, directed, backend,
                                                                              monkeypatch):
    """gpu-sorted: the GPU engine with every search's rows sorted on the device, in pieces of 32 rows
    or more (its output buffer's drains)."""
    if backend == "gpu-sorted":
        from csmd.gpu import executor

        monkeypatch.setattr(executor, "DEVICE_SORT_ROWS", 1)
        monkeypatch.setattr(executor, "DEVICE_HOLD_ROWS", 32)
        monkeypatch.setattr(executor, "EX_TUNING", dict(executor.EX_TUNING, out_rows=32))
        backend = "gpu"
    case = TimedStream(random.Random(seed), directed)
    (tmp_path / "g.graph").write_text(case.g0)
    (tmp_path / "s.txt").write_text(case.stream)
    queries = {"path": "v 0 0\nv 1 0\nv 2 0\ne 0 1\ne 1 2\n", "cycle": "v 0 0\nv 1 0\nv 2 0\ne 0 1\ne 1 2\ne 2 0\n"}
    qs = []
    for name, text in queries.items():
        (tmp_path / f"{name}.graph").write_text(text)
        qs.append((name, read_query(tmp_path / f"{name}.graph", directed=directed)))
    res, _ = replay(read_graph(tmp_path / "g.graph", directed=directed), tmp_path / "s.txt", qs, batch_size=3,
                    count_only=False, output=tmp_path / "d.arrow", show_progress=False, backend=backend,
                    event_time=EventTime(None))
    rows = ipc.open_file(tmp_path / "d.arrow").read_all().to_pylist()
    assert len(rows) == sum(r["positive"] + r["negative"] for r in res) > 0
    q = dict(qs)
    for r in rows:
        assert (r["ts_min"], r["ts_max"]) == case.span(q[r["query"]], r["vertices"]), r
