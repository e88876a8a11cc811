"""The numpy sampler: WanderJoin and Alley walks, one sample per array lane, all lanes a depth at a time.

A round holds `lanes` samples: M[lane, i] is the data vertex of plan.order[i] and
w[lane] the sample's weight. At each depth every living lane picks the next vertex
uniformly from a choice set and multiplies its weight by the set's size:

- WanderJoin: the set is the local candidate list of one placed neighbour (the one
  with the shortest list, so the variance is lower); the pick is then checked
  against the other placed neighbours' edges and injectivity, and dies if it fails.
- Alley: the set is the intersection of the local candidate lists of every placed
  neighbour, less the vertices already used; it fails only when the set is empty.

The choice sets depend only on the sample's prefix, so each embedding is drawn with
probability 1 / (its weight) and the mean weight is unbiased (Horvitz-Thompson).
With trawling the walk stops short of the last vertices and its weight is
multiplied by the exact number of completions of its prefix (the static matcher's
count), which is unbiased for the same reason.

Randomness: numpy's Philox, keyed by the seed, with the round number in the upper
counter words; depth i of lane l uses the (i * lanes + l)-th uniform of its round,
drawn whether or not the lane is alive, so every number is a function of (seed,
round, depth, lane) alone, as a counter-based RNG on a GPU would compute it.
"""

from __future__ import annotations

import numpy as np

from csmd.cpu.matcher import search
from csmd.model.estimate import MAX_ROUND_BLOCKS, CandidateGraph
from csmd.model.direction import label_test, passes
from csmd.model.graph import Graph, gather_ranges

METHODS = ("wj", "alley")
CHUNK = 1 << 22  # Alley gathers at most this many list entries at once (memory stays bounded)


class CpuSampler:
    """Draws rounds of WanderJoin or Alley samples of one query in one graph."""

    max_round_blocks = MAX_ROUND_BLOCKS  # run_rounds' default: rounds of up to 65,536 samples
    block_unit = 1  # the samples are independent: any block size

    def __init__(self, g: Graph, cg: CandidateGraph, method: str, seed: int, trawl: int = 0):
        """trawl: the number of query vertices, at the end of the order, whose matches are counted
        exactly for each sampled prefix instead of being sampled (trawling)."""
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}")
        self.g, self.cg, self.plan = g, cg, cg.plan
        self.step = self._wanderjoin if method == "wj" else self._alley
        self.seed = seed
        self.walk = max(1, self.plan.depth - trawl)

    def draw(self, rnd: int, lanes: int) -> np.ndarray:
        """The weights of `lanes` samples of round `rnd` (float64, 0 for a failed walk)."""
        rng = np.random.Generator(np.random.Philox(counter=[0, 0, rnd, 0], key=self.seed))
        first = self.cg.first
        if not len(first):
            return np.zeros(lanes)
        M = np.empty((lanes, self.plan.depth), np.int32)
        w = np.full(lanes, float(len(first)))
        M[:, 0] = first[_pick(rng.random(lanes), len(first))]
        alive = np.arange(lanes)
        for i in range(1, self.walk):
            r = rng.random(lanes)
            if len(alive):
                alive = self.step(i, M, w, alive, r[alive])
        w[np.setdiff1d(np.arange(lanes), alive, assume_unique=True)] = 0.0
        if self.walk < self.plan.depth and len(alive):
            w[alive] *= self._completions(M[alive, :self.walk], alive)
        return w

    def _completions(self, prefixes: np.ndarray, lanes: np.ndarray) -> np.ndarray:
        """Trawling: the exact number of completions of each prefix, from the static matcher.
        Each prefix is tagged with its lane as its timestamp: a static graph ignores timestamps
        when it is read, and the matcher's per-timestamp tally then counts each lane's matches."""
        res = search(self.g, self.plan, seeds=prefixes, ts=lanes.astype(np.int64))
        return res.per_ts[lanes - res.ts_base]

    def _shortest(self, i: int, M: np.ndarray, alive: np.ndarray):
        """Per living lane: the backward list with the fewest local candidates, its start and size."""
        starts, sizes = zip(*(self.cg.local(i, k, M[alive, j]) for k, (j, *_) in enumerate(self.cg.edges[i])))
        if len(sizes) == 1:
            return np.zeros(len(alive), np.intp), starts[0], sizes[0]
        piv = np.argmin(np.stack(sizes), axis=0)
        cols = np.arange(len(alive))
        return piv, np.stack(starts)[piv, cols], np.stack(sizes)[piv, cols]

    def _entries(self, i: int, piv: np.ndarray, offs: np.ndarray) -> np.ndarray:
        """Entry offs[t] of backward list piv[t] of depth i."""
        x = np.empty(len(offs), np.int32)
        for k, (*_, local) in enumerate(self.cg.edges[i]):
            sel = piv == k
            x[sel] = local[offs[sel]]
        return x

    def _fits(self, i: int, M: np.ndarray, lanes: np.ndarray, x: np.ndarray, piv: np.ndarray) -> np.ndarray:
        """Whether x may be the image at depth i of each lane: every backward edge other than
        the pivot's holds with its label, and x is not the image of an earlier vertex."""
        ok = np.ones(len(x), bool)
        for k, (j, el, _, _) in enumerate(self.cg.edges[i]):
            test = np.flatnonzero(piv != k)
            if len(test):
                lab = self.g.edge_label_between(M[lanes[test], j], x[test])
                ok[test] &= (lab >= 0) & passes(lab, label_test(el, self.plan.query.directed))
        for j in self.plan.same_label[i]:
            ok &= M[lanes, j] != x
        return ok

    def _wanderjoin(self, i, M, w, alive, r):
        """Depth i of the WanderJoin walks of the lanes `alive`; returns the lanes still alive."""
        piv, start, size = self._shortest(i, M, alive)
        w[alive] *= size
        has = size > 0
        alive, piv, r, start, size = alive[has], piv[has], r[has], start[has], size[has]
        x = self._entries(i, piv, start + _pick(r, size))
        ok = self._fits(i, M, alive, x, piv)
        M[alive[ok], i] = x[ok]
        return alive[ok]

    def _alley(self, i, M, w, alive, r):
        """Depth i of the Alley walks of the lanes `alive`; returns the lanes still alive."""
        piv, start, size = self._shortest(i, M, alive)
        count = np.zeros(len(alive), np.int64)
        chosen = np.empty(len(alive), np.int32)
        for lo, hi in _chunks(size, CHUNK):
            offs = gather_ranges(start[lo:hi], size[lo:hi])
            owner = np.repeat(np.arange(lo, hi), size[lo:hi])
            x = self._entries(i, piv[owner], offs)
            keep = np.flatnonzero(self._fits(i, M, alive[owner], x, piv[owner]))
            cnt = np.bincount(owner[keep] - lo, minlength=hi - lo)
            count[lo:hi] = cnt
            has = np.flatnonzero(cnt)
            first = np.cumsum(cnt) - cnt
            chosen[lo + has] = x[keep[first[has] + _pick(r[lo + has], cnt[has])]]
        w[alive] *= count
        has = count > 0
        M[alive[has], i] = chosen[has]
        return alive[has]


def _pick(r: np.ndarray, size: np.ndarray) -> np.ndarray:
    """floor(r * size), kept below size where rounding would reach it."""
    return np.minimum((r * size).astype(np.int64), np.asarray(size) - 1)


def _chunks(size: np.ndarray, cap: int):
    """Consecutive lane ranges [lo, hi) holding about `cap` list entries each (a longer list alone)."""
    ends = np.cumsum(size)
    lo = 0
    while lo < len(size):
        base = ends[lo - 1] if lo else 0
        hi = max(lo + 1, int(np.searchsorted(ends, base + cap, "right")))
        yield lo, hi
        lo = hi
