"""The GC releases a version exactly when every update up to the one that replaced it has finished."""

import numpy as np

from csmd.pipeline.gc import GarbageCollector


def test_release_matches_the_finished_prefix():
    rng = np.random.default_rng(7)
    bounds = np.r_[0, np.cumsum(rng.integers(1, 9, 60))]  # batches [bounds[i], bounds[i+1])
    gc, held, freed = GarbageCollector(), {}, []
    for i in range(len(bounds) - 1):  # each batch replaces versions at its own updates, in any order
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        versions = [(f"v{i}.{j}", int(rng.integers(lo, hi))) for j in range(int(rng.integers(0, 6)))]
        gc.replaced(versions)
        held.update(versions)
    finished = np.zeros(bounds[-1], bool)
    for i in rng.permutation(len(bounds) - 1):  # batches finish out of order
        lo, hi = int(bounds[i]), int(bounds[i + 1])
        freed += gc.finished(lo, hi)
        finished[lo:hi] = True
        pointer = int(np.argmin(finished)) if not finished.all() else len(finished)
        assert gc.pointer == pointer
        assert sorted(freed) == sorted(t for t, at in held.items() if at < pointer)
    assert gc.released == len(held)
