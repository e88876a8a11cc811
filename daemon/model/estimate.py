"""Approximate counting, the engine-neutral half: the candidate graph, the statistics and the stop rule.

A sampler (numpy in csmd.cpu.sampler, CUDA in csmd.gpu.sampler) draws
rounds of independent samples. Each sample walks the query's matching order and
returns a Horvitz-Thompson weight: the product of the sizes of the sets it chose
from, 0 when the walk failed. Every embedding is reached with probability the
inverse of its weight, so the mean weight is an unbiased estimate of the number
of embeddings (automorphic ones counted separately, docs/design.md section 1).

Samples are grouped into equal blocks; the blocks are independent, so the spread
of the block means gives the variance of the estimate, and the confidence
interval is the normal approximation mean +- z * sd(block means) / sqrt(blocks).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import numpy as np

from csmd.model.direction import label_test, passes
from csmd.model.graph import Graph, gather_ranges
from csmd.model.plan import Plan

CONFIDENCE = 0.95
Z = 1.959963984540054  # the two-sided 95% normal quantile
BLOCK = 256  # samples per block (on the GPU, one thread block's samples)
FIRST_ROUND_BLOCKS = 32  # a short first round answers easy queries fast ...
MAX_ROUND_BLOCKS = 256  # ... later rounds double up to this, for throughput
# the rel-error stop waits for this many blocks and valid samples: fewer make the
# normal approximation (z rather than Student's t) and the spread itself unreliable
MIN_BLOCKS_FOR_REL_ERROR = 32
MIN_VALID_FOR_REL_ERROR = 30


class CandidateGraph:
    """For each query edge (w -> u) with w matched before u: every candidate v of w -> the
    candidates of u adjacent to v over an edge with the query edge's label (its local
    candidates), sorted by id. A three-level CSR: edge -> row of v in C(w) -> local list.

    edges[i] lists, for depth i, one (depth j, edge label, indptr, local) per backward
    neighbour; row[u][v] is v's row in C(u), -1 when v is not a candidate.
    """

    def __init__(self, g: Graph, plan: Plan):
        self.plan = plan
        self.first = np.flatnonzero(plan.cand[plan.order[0]]).astype(np.int32)
        self.row = []
        for c in plan.cand:
            r = np.full(g.n, -1, np.int32)
            r[c] = np.arange(int(c.sum()), dtype=np.int32)
            self.row.append(r)
        self.edges = []
        for i, u in enumerate(plan.order):
            lists = []
            for j, el in plan.backward[i]:
                vs = np.flatnonzero(plan.cand[plan.order[j]])
                start, end = g.ranges(vs, int(plan.query.labels[u]))
                idx = gather_ranges(start, end - start)
                keep = plan.cand[u][g.nbrs[idx]] & passes(g.nels[idx], label_test(el, plan.query.directed))
                owner = np.repeat(np.arange(len(vs)), end - start)
                indptr = np.zeros(len(vs) + 1, np.int64)
                np.cumsum(np.bincount(owner[keep], minlength=len(vs)), out=indptr[1:])
                lists.append((j, el, indptr, g.nbrs[idx[keep]]))
            self.edges.append(lists)

    def local(self, i: int, k: int, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Start (into the k-th backward list of depth i) and size of the local lists of `images`."""
        j, _, indptr, _ = self.edges[i][k]
        r = self.row[self.plan.order[j]][images]
        return indptr[r], indptr[r + 1] - indptr[r]


def no_candidates(plan: Plan) -> bool:
    """Whether filtering alone proves there is no match (some query vertex has no candidate)."""
    return not all(c.any() for c in plan.cand)


@dataclass
class Estimate:
    """The outcome of one estimation, JSON-ready through asdict().

    estimate, ci_low and ci_high are None when no sample was valid: no information,
    which is not the same as a count of 0. exact is True when the candidate filter
    proved there is no match (estimate 0 with an interval of width 0, no sampling).
    """

    estimate: float | None
    ci_low: float | None
    ci_high: float | None
    confidence: float
    samples: int
    valid_samples: int
    blocks: int
    seconds: float
    exact: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


class BlockStats:
    """Running totals of equal-size blocks of weights."""

    def __init__(self, block: int):
        self.block = block
        self.means: list[np.ndarray] = []
        self.samples = 0
        self.valid = 0

    def add(self, weights) -> None:
        """weights: a numpy array, or a CuPy one (reduced where it lies; only the block means travel)."""
        means = weights.reshape(-1, self.block).mean(1)
        self.means.append(means.get() if hasattr(means, "get") else means)
        self.samples += len(weights)
        self.valid += int((weights != 0).sum())

    @property
    def blocks(self) -> int:
        return self.samples // self.block

    def interval(self) -> tuple[float | None, float | None, float | None]:
        """(estimate, low, high); all None without a valid sample. The low end is cut at 0."""
        if not self.valid:
            return None, None, None
        m = np.concatenate(self.means)
        est = float(m.mean())
        half = Z * float(m.std(ddof=1)) / math.sqrt(len(m)) if len(m) > 1 else math.inf
        return est, max(0.0, est - half), est + half

    def rel_error(self) -> float:
        est, low, high = self.interval()
        if est is None or self.valid < MIN_VALID_FOR_REL_ERROR or self.blocks < MIN_BLOCKS_FOR_REL_ERROR:
            return math.inf
        return (high - est) / est


def block_size(samples: int | None, unit: int = 1) -> int:
    """BLOCK, or smaller for a small --samples so that it still makes at least 32 blocks; a multiple
    of `unit`, the sampler's group of dependent samples (a warp on the GPU)."""
    return BLOCK if samples is None else max(unit, min(BLOCK, samples // 32) // unit * unit)


def run_rounds(draw, *, samples: int | None = None, rel_error: float | None = None,
               time_limit: float | None = None, block: int = BLOCK,
               max_round_blocks: int = MAX_ROUND_BLOCKS) -> Estimate:
    """Draw rounds until a stop rule holds and return the estimate.

    draw(round, lanes) -> float64 weights of `lanes` fresh samples; round numbers the
    counter-based random streams, so a round's samples depend on the seed and its number
    only. Stops after `samples` samples (rounded up to whole blocks), once the interval's
    half-width relative to the estimate is at most `rel_error`, or after `time_limit`
    seconds, whichever comes first; the rules are checked between rounds. Rounds double
    up to max_round_blocks blocks (a GPU wants millions of lanes a launch), but not once
    a round takes a tenth of the time limit, so the limit is not overrun by much.
    """
    if samples is None and time_limit is None:
        raise ValueError("a relative error alone may never be reached: give samples or a time limit too")
    t0 = time.monotonic()
    stats = BlockStats(block)
    nblocks, rnd = FIRST_ROUND_BLOCKS, 0
    while True:
        if samples is not None:
            nblocks = min(nblocks, -(-(samples - stats.samples) // block))
        t1 = time.monotonic()
        stats.add(draw(rnd, nblocks * block))
        rnd += 1
        if time_limit is None or time.monotonic() - t1 < time_limit / 10:
            nblocks = min(2 * nblocks, max_round_blocks)
        if samples is not None and stats.samples >= samples:
            break
        if rel_error is not None and stats.rel_error() <= rel_error:
            break
        if time_limit is not None and time.monotonic() - t0 >= time_limit:
            break
    est, low, high = stats.interval()
    return Estimate(est, low, high, CONFIDENCE, stats.samples, stats.valid, stats.blocks,
                    time.monotonic() - t0)
