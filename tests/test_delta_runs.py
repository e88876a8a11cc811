"""The compiled fills of the delta columns (pipeline/gather.py) against their numpy fallbacks."""

from __future__ import annotations

import numpy as np
import pytest

from csmd.pipeline.deltas import _numpy_copy, _numpy_repeat
from csmd.pipeline.gather import copy_runs, repeat_runs


def random_runs(rng, runs: int, size: int):
    """runs slices lo:hi of range(size), some empty."""
    lo = rng.integers(0, size, runs)
    return lo, np.minimum(size, lo + rng.integers(0, 6, runs))


@pytest.mark.parametrize("seed", range(4))
def test_copy_runs_places_each_slice_at_its_position_mapped_or_not(seed):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 50, 200).astype(np.int32)
    table = rng.integers(-(1 << 40), 1 << 40, 50)
    for runs in (0, 1, 30):
        lo, hi = random_runs(rng, runs, len(src))
        at = np.cumsum(hi - lo) - (hi - lo)
        perm = rng.permutation(runs)  # runs placed in any order
        for tab, dtype in ((table, np.int64), (np.zeros(0, np.int64), np.int32)):
            got, want = (np.full(int((hi - lo).sum()), -1, dtype) for _ in range(2))
            copy_runs(src, lo[perm], hi[perm], at[perm], tab, got)
            _numpy_copy(src, lo[perm], hi[perm], at[perm], tab, want)
            ref = np.concatenate([src[a:b] for a, b in zip(lo, hi)] or [np.zeros(0, np.int32)])
            assert got.tolist() == want.tolist() == (tab[ref] if len(tab) else ref).tolist()


@pytest.mark.parametrize("seed", range(4))
def test_repeat_runs_repeats_each_slice_in_turn(seed):
    rng = np.random.default_rng(seed)
    src = rng.integers(0, 256, 100).astype(np.uint8)
    for runs in (0, 1, 30):
        lo, hi = random_runs(rng, runs, len(src))
        times = rng.integers(0, 40, runs)
        want = b"".join(src[a:b].tobytes() * t for a, b, t in zip(lo, hi, times))
        for fill in (repeat_runs, _numpy_repeat):
            out = np.empty(len(want), np.uint8)
            fill(src, lo, hi, times, out)
            assert out.tobytes() == want
