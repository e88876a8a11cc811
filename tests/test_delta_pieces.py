"""Materialised deltas as Arrow: the encoder's bytes against a row-by-row reference, pieces under
forced limits (rows per record batch, ids per list array), and bounded Arrow memory (CPU engine)."""

from __future__ import annotations

import itertools
from collections import Counter

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from csmd.connectors.files import FileSink
from csmd.cpu.numpy_engine import CpuEngine
from csmd.jobs.replay import read_stream, replay
from csmd.model.formats import read_graph, read_query
import csmd.pipeline.deltas as deltas
from csmd.pipeline.deltas import DeltaEncoder
from csmd.pipeline.stages import Pipeline

from continuous_cases import assert_brute_force, make_case


def reference_batch(result, ext_ids, names: list[str], numbered: Counter, schema: pa.Schema) -> pa.RecordBatch:
    """One pipeline batch's deltas as the file holds them, built a Python dict per row: by update,
    then by query (registration order), then in the query's own order; `index` counts the
    query's earlier deltas of the same input record (numbered: across batches)."""
    rows = []
    for d in result.deltas:
        for j, s in enumerate(d.seq.tolist()):
            rec = result.batch.record_of[s]
            rows.append({"query": d.name, "sign": int(d.sign[j]), "seq": s, "source": rec.source,
                         "vertices": [ext_ids[int(v)] for v in d.rows[j]], "count": 1, "input": rec.origin[0],
                         "partition": rec.origin[1], "offset": rec.origin[2],
                         "index": numbered[(d.name, rec.origin)], "key": None, "headers": [], "fields": []})
            numbered[(d.name, rec.origin)] += 1
    rows.sort(key=lambda r: (r["seq"], names.index(r["query"])))  # stable: each query's order kept
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def written(path, batches) -> bytes:
    sink = FileSink(path, batches[0].schema)
    sink.write((None, b, []) for b in batches)
    sink.close()
    return path.read_bytes()


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("batch_size", [1, 7, 64])
def test_the_file_is_the_bytes_of_a_row_by_row_encoding(tmp_path, seed, batch_size):
    """The encoder's pieces, written as replay writes them, against the same deltas encoded a
    Python object per row; the reference itself checked against brute force."""
    check_the_bytes(tmp_path, seed, batch_size)


@pytest.mark.parametrize("seed", range(2))
def test_columns_built_on_threads_give_the_same_bytes(tmp_path, monkeypatch, seed):
    monkeypatch.setattr(deltas, "PARALLEL_ROWS", 0)
    check_the_bytes(tmp_path, seed, 7)


@pytest.mark.parametrize("seed", range(2))
def test_without_numba_the_file_is_the_same_bytes(tmp_path, monkeypatch, seed):
    monkeypatch.setattr(deltas, "_copy", deltas._numpy_copy)
    monkeypatch.setattr(deltas, "_repeat", deltas._numpy_repeat)
    check_the_bytes(tmp_path, seed, 7)


def check_the_bytes(tmp_path, seed, batch_size):
    qpaths, truth = make_case(tmp_path, seed, steps=60)
    names = [p.stem for p in qpaths]
    g0 = read_graph(tmp_path / "g0.graph")
    pipe = Pipeline(g0, engine=CpuEngine(g0), batch_size=batch_size, threaded=False)
    for p in qpaths:
        pipe.add_query(p.stem, read_query(p), False)
    encoder, numbered = DeltaEncoder(pipe.vertices), Counter()
    new, ref = [], []

    def on_result(result):
        new.extend(b for _q, b, _o in encoder.encode(result, by_update=True))
        if any(len(d.seq) for d in result.deltas):
            ref.append(reference_batch(result, pipe.vertices.ext_ids, names, numbered, encoder.schema))

    pipe.run(iter(read_stream(tmp_path / "stream.txt")), on_result)
    pipe.engine.close()
    if not ref:
        pytest.skip("no deltas")
    assert_brute_force(pa.Table.from_batches(ref), [], truth, seed)
    assert written(tmp_path / "new.arrow", new) == written(tmp_path / "ref.arrow", ref)


def k_clique_case(tmp_path, n: int = 40, deleted: int = 8):
    """K_n of one label, a 4-clique query, and a stream deleting `deleted` edges of vertex 0: each
    deletion takes some 20,000 embeddings away, all in one batch."""
    g0 = tmp_path / "g0.graph"
    g0.write_text("".join(f"v {i} 0\n" for i in range(n))
                  + "".join(f"e {a} {b} 0\n" for a, b in itertools.combinations(range(n), 2)))
    (tmp_path / "q.graph").write_text("".join(f"v {i} 0\n" for i in range(4))
                                      + "".join(f"e {a} {b} 0\n" for a, b in itertools.combinations(range(4), 2)))
    (tmp_path / "stream.txt").write_text("".join(f"-e 0 {b}\n" for b in range(1, deleted + 1)))
    return read_graph(g0), [("k4", read_query(tmp_path / "q.graph"))]


def run(tmp_path, name, g0, queries, batch_size=64):
    out = tmp_path / name
    res, _ = replay(g0, tmp_path / "stream.txt", queries, batch_size=batch_size, count_only=False, output=out,
                    show_progress=False)
    return ipc.open_file(out), res


def test_a_batch_whose_ids_outgrow_one_list_array_is_split_not_a_crash(tmp_path, monkeypatch):
    """With a list array's reach forced down to 1000 ids, a batch of over 100,000 matches (four
    ids each) is written in pieces of 250 rows, equal row for row to the unsplit file; the output
    topic's per-query pieces too, each naming the input records of its rows."""
    g0, queries = k_clique_case(tmp_path)
    whole, res = run(tmp_path, "whole.arrow", g0, queries)
    assert whole.num_record_batches == 1 and res[0]["negative"] == whole.get_batch(0).num_rows > 100_000
    monkeypatch.setattr(deltas, "MAX_VALUES", 1000)
    split, _ = run(tmp_path, "split.arrow", g0, queries)
    batches = [split.get_batch(i) for i in range(split.num_record_batches)]
    assert [b.num_rows for b in batches[:-1]] == [250] * (len(batches) - 1) and 0 < batches[-1].num_rows <= 250
    assert split.read_all().equals(whole.read_all())

    pipe = Pipeline(g0, engine=CpuEngine(g0), batch_size=64, threaded=False)  # the output topic's items: per query
    pipe.add_query(*queries[0], False)
    encoder, items = DeltaEncoder(pipe.vertices), []
    pipe.run(iter(read_stream(tmp_path / "stream.txt")), lambda r: items.extend(encoder.encode(r)))
    pipe.engine.close()
    assert all(q == "k4" and len(b.column("vertices").values) <= 1000 for q, b, _o in items)
    assert pa.Table.from_batches([b for _q, b, _o in items]).equals(whole.read_all())
    for _q, b, origins in items:
        assert origins == [(str(tmp_path / "stream.txt"), 0, x) for x in sorted(set(b.column("offset").to_pylist()))]


def test_a_stream_with_more_deltas_than_the_bound_is_written_in_bounded_arrow_memory(tmp_path, monkeypatch):
    """Pieces of 2,000 rows: while the file is written, the Arrow memory held stays within a few
    pieces (each about 250 bytes a row), though the batch's deltas take some 50 times that; the
    file holds every delta."""
    g0, queries = k_clique_case(tmp_path, n=40, deleted=8)
    monkeypatch.setattr(deltas, "MAX_ROWS", 2000)
    held, write = [], FileSink.write

    def watched(self, items, on_ack=None, on_send=None):
        def watch():
            for item in items:
                held.append(pa.total_allocated_bytes())  # the piece is built, not yet dropped
                yield item
        return write(self, watch(), on_ack, on_send)

    monkeypatch.setattr(FileSink, "write", watched)
    base = pa.total_allocated_bytes()
    f, res = run(tmp_path, "out.arrow", g0, queries)
    batches = [f.get_batch(i) for i in range(f.num_record_batches)]
    total = sum(b.nbytes for b in batches)
    assert sum(b.num_rows for b in batches) == res[0]["negative"] > 100_000
    assert all(b.num_rows <= 2000 for b in batches)
    piece = max(b.nbytes for b in batches)
    assert max(held) - base < 4 * piece < total / 10, (max(held) - base, piece, total)


@pytest.mark.parametrize("seed", range(4))
def test_the_canonical_order_sorts_by_update_then_by_the_match_whatever_the_ids_widths(seed):
    """canonical sorts rows by packed words of their ids: against Python's sort of (update, row),
    for ids of a few bits to 31 bits, rows of 1 to 32 ids, rows equal in their first words."""
    import numpy as np

    from csmd.engine import ContinuousQuery, Matches, UpdateBatch
    from csmd.model.graph import Graph
    from csmd.pipeline.queries import canonical

    rng = np.random.default_rng(seed)
    for n, top in ((1, 5), (3, 1 << 31), (8, 3000), (16, 70_000), (32, 1 << 20)):
        k = 3000
        rows = rng.integers(0, top, (k, n), dtype=np.int64).astype(np.int32)
        rows[: k // 2, : n // 2] = rows[0, : n // 2]  # a shared prefix: the later words decide
        seq = rng.integers(10, 14, k)
        z = np.zeros(0, np.int64)
        batch = UpdateBatch(10, 14, np.arange(10, 14), z[:0], z[:0], z[:0], np.ones(4, np.int8), z, z, z,
                            np.zeros(0, np.int32), 0)
        q = Graph.from_edges([0] * n, [], [])
        (d,) = canonical([(ContinuousQuery("q", q, False, [], []), Matches(seq, rows=rows))], batch)
        want = sorted(zip(seq.tolist(), map(tuple, rows.tolist())))
        assert list(zip(d.seq.tolist(), map(tuple, d.rows.tolist()))) == want
