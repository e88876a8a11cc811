"""The sequencer's numpy path for edge-only batches gives exactly what its one-record-at-a-time
path gives (ops, labels, sequence numbers, ignored counts), on seeded random batches that mix
valid and invalid inserts and deletes, self-loops and edge labels."""

from __future__ import annotations

import numpy as np
import pytest

from csmd.cpu.numpy_engine import CpuEngine
from csmd.model.formats import DELETE_EDGE, INSERT_EDGE, OPS, Update, UpdateBlock
from csmd.model.graph import Graph
from csmd.pipeline import sequencer
from csmd.pipeline.sequencer import Sequencer, Vertices

FIELDS = ("first_seq", "end_seq", "edge_seq", "edge_a", "edge_b", "edge_label", "edge_sign", "vertex_seq",
          "vertex_id", "new_labels", "first_vertex", "records")


def two_sequencers(rng, n: int = 30, first: int = -50):
    """A random graph of n vertices (external ids 7i + first) and two sequencers over it, each with its engine."""
    src, dst = rng.integers(0, n, (2, 60))
    g0 = Graph.from_edges(rng.integers(0, 3, n), src, dst, rng.integers(0, 2, 60), ext_ids=np.arange(n) * 7 + first)
    return g0, Sequencer(Vertices(g0), CpuEngine(g0)), Sequencer(Vertices(g0), CpuEngine(g0))


def assert_same(got, want, fast, slow):
    for f in FIELDS:
        assert np.array_equal(np.asarray(getattr(got, f)), np.asarray(getattr(want, f))), f
    assert got.record_of == want.record_of
    assert fast.ignored == slow.ignored and fast.next_seq == slow.next_seq
    fast.engine.apply(got)
    slow.engine.apply(want)


@pytest.mark.parametrize("seed", range(8))
def test_edge_only_batches_take_the_numpy_path_with_the_general_paths_result(seed):
    rng = np.random.default_rng(seed)
    g0, fast, slow = two_sequencers(rng)
    n = g0.n
    for _ in range(40):
        k = int(rng.integers(1, 12))
        u, v = (g0.ext_ids[rng.integers(0, n, k)] for _ in range(2))
        ops = rng.choice([INSERT_EDGE, DELETE_EDGE], k)
        recs = [Update(str(op), int(x), int(y), int(rng.integers(0, 2))) for op, x, y in zip(ops, u, v)]
        got = fast._edges_only(recs, [0.0] * k)
        want = slow._general(recs, [0.0] * k)
        assert got is not None  # edge records between known vertices, pairs named twice too
        assert_same(got, want, fast, slow)
    assert sum(slow.ignored.values()) > 10


# external ids from -50 (some negative: the index's look-ups) or from 0 (Vertices.table), and the id
# of a vertex that the stream creates: past the table's span, or inside it
IDS = [(-50, 10**6), (0, 1), (0, 10**12)]


@pytest.mark.parametrize("first, new", IDS)
@pytest.mark.parametrize("seed", range(6))
def test_edge_only_block_batches_are_sequenced_as_their_updates(seed, first, new):
    """A batch cut from an UpdateBlock (the compiled stream reader's) is sequenced as its Updates
    are; some name an unknown vertex, which the general path takes."""
    rng = np.random.default_rng(seed)
    g0, fast, slow = two_sequencers(rng, first=first)
    ext = np.append(g0.ext_ids, new)
    took_block = 0
    for i in range(40):
        k = int(rng.integers(1, 12))
        u, v = (ext[rng.integers(0, g0.n + (i % 5 == 0), k)] for _ in range(2))
        op = rng.choice([OPS.index(INSERT_EDGE), OPS.index(DELETE_EDGE)], k).astype(np.int8)
        block = UpdateBlock("s.txt", np.arange(k) + 10 * i, op, u, v, rng.integers(0, 2, k))
        got, want = fast.sequence(block, [0.0] * k), slow.sequence(block.updates(), [0.0] * k)
        took_block += not isinstance(got.record_of, dict)  # the block's own path, not _general
        assert_same(got, want, fast, slow)
    assert took_block > 10


@pytest.mark.parametrize("first, new", IDS)
@pytest.mark.parametrize("seed", range(6))
def test_batches_cut_from_one_block_are_sequenced_as_their_updates(seed, first, new, monkeypatch):
    """A long block of edge records (some naming a pair again, an unknown vertex, a vertex twice,
    a deleted or present edge), cut into batches as the pipeline cuts it: the rows checked ahead
    with one batch serve the next ones, and every batch is what the general path makes of it."""
    rng = np.random.default_rng(seed)
    g0, fast, slow = two_sequencers(rng, first=first)
    monkeypatch.setattr(sequencer, "FIRST_WINDOW", int(rng.integers(1, 40)))
    fast._window = sequencer.FIRST_WINDOW
    n = 600
    ext = np.append(g0.ext_ids, new)
    u, v = (ext[rng.choice(g0.n + 1, n, p=[0.998 / g0.n] * g0.n + [0.002])] for _ in range(2))
    op = rng.choice([OPS.index(INSERT_EDGE), OPS.index(DELETE_EDGE)], n).astype(np.int8)
    block = UpdateBlock("s.txt", np.arange(n), op, u, v, rng.integers(0, 2, n))
    checks, check = [0], fast._check

    def counted(*args):
        checks[0] += 1
        return check(*args)

    monkeypatch.setattr(fast, "_check", counted)
    lo, from_block = 0, 0
    while lo < n:
        hi = min(n, lo + int(rng.integers(1, 9)))
        piece = block.rows(lo, hi)
        got, want = fast.sequence(piece, [0.0] * (hi - lo)), slow.sequence(piece.updates(), [0.0] * (hi - lo))
        from_block += not isinstance(got.record_of, dict)  # not the general path
        assert_same(got, want, fast, slow)
        lo = hi
    assert sum(slow.ignored.values()) > 20
    assert 0 < checks[0] < from_block / 2  # most batches took their ops from rows checked before them


@pytest.mark.parametrize("seed", range(6))
def test_block_batches_that_name_pairs_again_take_the_numpy_path_with_the_general_paths_result(seed):
    """Batches of a block over few vertices, so that most name some pair twice or more (an edge
    inserted, deleted and inserted again in one batch, an insertion of a present edge before its
    deletion): each record checked against what the records before it on its pair leave, they are
    what the general path makes of them, without it."""
    rng = np.random.default_rng(seed)
    g0, fast, slow = two_sequencers(rng, n=8)
    repeats = 0
    for i in range(40):
        k = int(rng.integers(2, 64))
        u, v = (g0.ext_ids[rng.integers(0, g0.n, k)] for _ in range(2))
        op = rng.choice([OPS.index(INSERT_EDGE), OPS.index(DELETE_EDGE)], k).astype(np.int8)
        block = UpdateBlock("s.txt", np.arange(k) + 100 * i, op, u, v, rng.integers(0, 2, k))
        pairs = {frozenset(p) for p in zip(u.tolist(), v.tolist())}
        repeats += len(pairs) < k
        got, want = fast.sequence(block, [0.0] * k), slow.sequence(block.updates(), [0.0] * k)
        assert not isinstance(got.record_of, dict)  # the block's own path
        assert_same(got, want, fast, slow)
    assert repeats > 30


@pytest.mark.parametrize("seed", range(4))
def test_the_vertex_table_looks_up_what_the_index_holds(seed):
    """Vertices.lookup gives index.get(x, -1) for any int64 x, while vertices are added (ids inside
    the table, past it, negative, numpy ints) and retired, from a graph with retired vertices."""
    rng = np.random.default_rng(seed)
    n = 50
    ext = rng.choice(4 * n, n, replace=False)
    g0 = Graph.from_edges(np.zeros(n, np.int64), np.array([0]), np.array([1]), ext_ids=ext)
    vx = Vertices(g0, retired=rng.random(n) < 0.2)
    for _ in range(300):
        r = rng.random()
        if r < 0.4:
            new = [int(rng.integers(0, 8 * n)), -int(rng.integers(1, 9)), 10**12 + int(rng.integers(0, 3)),
                   np.int64(rng.integers(0, 8 * n))][int(rng.integers(0, 4))]
            if new not in vx.index:
                vx.add(new, 0)
        elif r < 0.7 and vx.index:
            vx.retire(vx.index[list(vx.index)[int(rng.integers(0, len(vx.index)))]])
        probe = np.concatenate([rng.integers(-10, 10 * n, 40), list(vx.index)[:5], [10**12, 10**12 + 1]]).astype(np.int64)
        want = np.array([vx.index.get(int(x), -1) for x in probe], np.int64)
        assert np.array_equal(vx.lookup(probe), want)
        inside = probe[(probe >= 0) & (probe < len(vx.table))]
        assert np.array_equal(vx.lookup(inside), np.array([vx.index.get(int(x), -1) for x in inside], np.int64))
    assert len(vx.table) > 0


def test_string_ids_have_no_vertex_table():
    g0 = Graph.from_edges(np.zeros(3, np.int64), np.array([0]), np.array([1]), ext_ids=np.array(["a", "b", "1"], object))
    vx = Vertices(g0)
    assert len(vx.table) == 0
    assert vx.lookup(np.array([0, 1, 2], np.int64)).tolist() == [-1, -1, -1]


def test_a_relabel_is_its_edges_deleted_the_vertex_again_and_its_edges_inserted():
    """`v id label` on a live vertex with another label: each step its own update of the record; the
    same label again changes nothing (duplicate_vertex). An edge that created a vertex gave it label
    0, and this is how it gets its real one."""
    g0 = Graph.from_edges(np.array([0, 0, 0]), np.array([0, 0]), np.array([1, 2]), np.array([3, 4]),
                          ext_ids=np.array([10, 11, 12]))
    seqr = Sequencer(Vertices(g0), CpuEngine(g0))
    batch = seqr._general([Update("v", 10, -1, 0), Update("v", 10, -1, 5), Update("e", 11, 12, 1)], [0.0] * 3)
    assert seqr.ignored == {sequencer.DUPLICATE_VERTEX: 1}
    # seq 0: ignored; 1, 2: the edges 10-11, 10-12 deleted; 3: 10's old vertex; 4: its new one; 5, 6: edges back
    assert batch.edge_seq.tolist() == [1, 2, 5, 6, 7]
    assert batch.edge_sign.tolist() == [-1, -1, 1, 1, 1]
    assert batch.edge_label.tolist() == [3, 4, 3, 4, 1]
    assert batch.vertex_seq.tolist() == [3, 4] and batch.vertex_id.tolist() == [0, 3]
    assert batch.new_labels.tolist() == [5] and seqr.vertices.index[10] == 3 and seqr.next_seq == 8
    assert [batch.record_of[s].label for s in range(1, 7)] == [5] * 6
