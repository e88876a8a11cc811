"""The GPU sampler: WanderJoin and Alley on the device, one sample per thread (gpu/sampler.cu).

Same interface as csmd.cpu.sampler.CpuSampler (draw(round, lanes) -> weights), so the
statistics and the stop rule of csmd.model.estimate.run_rounds serve both; the weights stay
on the device and only the block means travel. The kernel reproduces the numpy sampler's
random numbers and walks, so without sample inheritance both return the same weights
for the same seed and round.

The candidate graph is the host's CandidateGraph, uploaded: building it on the host takes
milliseconds on the benchmark graphs (bench/estimate.py prints it), less than the sampling
budget by orders of magnitude, and keeps one construction for both samplers.
Trawling stays on the CPU sampler (it needs the exact matcher per prefix).
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from csmd.errors import CsmdError
from csmd.model.estimate import CandidateGraph

from .launch import THREADS, flat_grid, i64, u64
from .layout import MAXQ, METHOD_ALLEY, METHOD_WJ, structs
from .module import kernel

METHODS = {"wj": METHOD_WJ, "alley": METHOD_ALLEY}
MASK64 = (1 << 64) - 1


class GpuSampler:
    """Draws rounds of WanderJoin or Alley samples of one query, on the device."""

    # rounds grow to 4M samples (16,384 blocks of 256): ~0.1 s at the target rate, so the
    # launch and the host's stop-rule check between rounds cost under 1%
    max_round_blocks = 1 << 14
    block_unit = 32  # with inheritance a warp's samples depend on each other: statistics blocks are whole warps

    def __init__(self, cg: CandidateGraph, method: str, seed: int, inherit: bool = True):
        """inherit: sample inheritance within each warp (sampler.cu): dead walks continue living ones,
        so more of the warp's lanes finish; off, the weights are the CPU sampler's, lane by lane."""
        if method not in METHODS:
            raise CsmdError(f"unknown method {method!r}")
        plan = cg.plan
        if plan.depth > MAXQ:  # then MAXE holds every backward edge too
            raise CsmdError(f"the GPU sampler takes queries of at most {MAXQ} vertices, not {plan.depth}")
        self.seed, self.depth = seed, plan.depth
        self.n = len(cg.row[0])
        s = structs("sampler")
        t = np.zeros(s.sample_plan // 4, np.int32)
        t[:4] = plan.depth, METHODS[method], len(cg.first), inherit
        ebeg, ej, same = s.sp_ebeg // 4, s.sp_ej // 4, s.sp_same // 4
        ipbase, indptr, local = [], [], []
        at = e = 0
        for i, lists in enumerate(cg.edges):
            t[ebeg + i] = e
            for j, _, ip, loc in lists:
                t[ej + e] = j
                ipbase.append(sum(len(x) for x in indptr))
                indptr.append(ip + at)  # into the concatenated local lists
                local.append(loc)
                at += len(loc)
                e += 1
            t[same + i] = sum(1 << j for j in plan.same_label[i])
        t[ebeg + plan.depth] = e
        self.plan = cp.asarray(t)
        self.first = cp.asarray(cg.first)
        self.rows = cp.asarray(np.stack([cg.row[u] for u in plan.order]))
        self.ipbase = cp.asarray(np.array(ipbase + [0], np.int64))
        self.indptr = cp.asarray(np.concatenate(indptr + [np.zeros(1, np.int64)]))
        self.local = cp.asarray(np.concatenate(local + [np.zeros(1, np.int32)]).astype(np.int32))

    def draw(self, rnd: int, lanes: int) -> cp.ndarray:
        """The weights of `lanes` samples of round `rnd` (float64 on the device, 0 for a failed walk)."""
        w = cp.empty(lanes, cp.float64)
        kernel("sampler", "sample")(flat_grid(lanes), (THREADS,), (
            self.plan, self.first, self.rows, i64(self.n), self.ipbase, self.indptr, self.local,
            u64(self.seed & MASK64), u64(self.seed >> 64), u64(rnd), i64(lanes), w))
        return w
