"""The compiled canonical order of a query's rows (pipeline/row_order.py) against np.lexsort."""

from __future__ import annotations

import numpy as np
import pytest

from csmd.pipeline.queries import _numpy_order
from csmd.pipeline.row_order import canonical_order


def lexsorted(rows, seq):
    """By seq, then by the ids column by column; stable."""
    return np.lexsort(tuple(rows[:, c] for c in range(rows.shape[1] - 1, -1, -1)) + (seq,))


@pytest.mark.parametrize("seed", range(6))
def test_the_order_is_lexsorts_for_rows_of_any_width_with_ties(seed):
    rng = np.random.default_rng(seed)
    for n, top in ((1, 3), (2, 1 << 31), (3, 1 << 31), (4, 5), (8, 3000), (16, 70_000), (32, 1 << 20)):
        for k in (1, 2, 700):
            rows = rng.integers(0, top, (k, n), dtype=np.int64).astype(np.int32)
            rows[: k // 3] = rows[0]  # whole rows equal: the stable order keeps their index order
            rows[k // 3: k // 2, : n // 2] = rows[k // 3, : n // 2]  # a shared prefix: later words decide
            seq = rng.integers(10, 14, k)
            sorted_runs = np.argsort(rng.integers(0, 4, k), kind="stable")  # rows partly in order already
            rows[sorted_runs] = rows[lexsorted(rows, seq)]
            for r in (rows, np.asfortranarray(rows)):
                assert canonical_order(r, seq).tolist() == lexsorted(rows, seq).tolist() \
                    == _numpy_order(rows, seq).tolist()


def test_no_rows_and_updates_far_apart():
    assert canonical_order(np.zeros((0, 3), np.int32), np.zeros(0, np.int64)).tolist() == []
    rng = np.random.default_rng(0)
    rows = rng.integers(0, 9, (500, 3)).astype(np.int32)
    seq = rng.choice([0, 1 << 40, 5, 1 << 20], 500)  # a span far wider than the rows: no counting sort
    assert canonical_order(rows, seq).tolist() == lexsorted(rows, seq).tolist()
