"""by_query (the CPU and GPU engines' split of a search's rows by query) against numpy."""

from __future__ import annotations

import numpy as np
import pytest

from csmd.engine import Matches
from csmd.pipeline.query_rows import by_query, merged


@pytest.mark.parametrize("seed", range(8))
def test_rows_split_by_query_keep_their_order_width_seq_and_ts(seed):
    rng = np.random.default_rng(seed)
    nq = int(rng.integers(1, 6))
    widths = rng.integers(2, 9, nq).astype(np.int64)
    timed = bool(seed % 2)
    chunks = []
    for _ in range(int(rng.integers(0, 4))):
        k = int(rng.integers(0, 40))
        seq = rng.integers(0, 1 << 40, int(rng.integers(1, 10)))  # each chunk its own ops' seq
        rows = rng.integers(0, 1000, (k, int(widths.max()) + int(rng.integers(0, 3)))).astype(np.int32)  # padded
        ts = rng.integers(-5, 5, (k, 2)) if timed else np.zeros((0, 2), np.int64)
        chunks.append((rows, rng.integers(0, nq, k), rng.integers(0, len(seq), k), ts, seq))
    names = [f"q{i}" for i in range(nq)]
    got = by_query(chunks, names, widths)
    for q in range(nq):
        parts = [(rows[row_q == q, : widths[q]], seq[op[row_q == q]], ts[row_q == q] if timed else None)
                 for rows, row_q, op, ts, seq in chunks]
        n = sum(len(p[0]) for p in parts)
        if not n:
            assert names[q] not in got
            continue
        m = got[names[q]]
        assert np.array_equal(m.rows, np.concatenate([p[0] for p in parts]))
        assert np.array_equal(m.seq, np.concatenate([p[1] for p in parts]))
        if timed:
            assert np.array_equal(m.ts, np.concatenate([p[2] for p in parts]))
        else:
            assert m.ts is None


def test_merged_pieces_keep_their_rows_and_lose_their_order():
    """merged: a query in one piece keeps its Matches (ordered or not); a query in several gets their
    rows, updates and ts concatenated in piece order, and canonical must sort them (ordered False)."""
    def piece(rows, seq, ordered):
        return Matches(np.array(seq, np.int64), rows=np.array(rows, np.int32), ts=np.zeros((len(seq), 2), np.int64),
                       ordered=ordered)

    a, b, c = piece([[1, 2]], [5], True), piece([[0, 1], [3, 4]], [4, 6], True), piece([[7, 8, 9]], [5], True)
    got = merged([{"q": a, "r": c}, {"q": b}])
    assert got["r"] is c
    assert not got["q"].ordered
    assert got["q"].rows.tolist() == [[1, 2], [0, 1], [3, 4]] and got["q"].seq.tolist() == [5, 4, 6]
    assert got["q"].ts.shape == (3, 2)
    only = {"q": a}
    assert merged([only]) is only
