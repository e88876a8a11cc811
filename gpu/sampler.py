"""The GPU sampler: WanderJoin and Alley on the device, one sample per thread (gpu/sampler.cu).

Same interface as csmd.cpu.sampler.CpuSampler (draw(round, lanes) -> weights), so the
statistics and the stop rule of csmd.model.estimate.run_rounds serve both; the weights stay
on the device and only the block means travel. The kernel reproduces the numpy sampler's
random numbers and walks, so without sample inheritance and warp streaming both return the
same weights for the same seed and round (trawling included: its completion counts are exact).

The candidate graph is built on the device (build) where that is faster than building the
host's CandidateGraph and uploading it (upload): wherever the data graph is on the device
already, and where the build scans many neighbour entries for the graph's size. Both give
the same arrays (tests/test_gpu_estimate.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import cupy as cp
import numpy as np

from csmd.errors import CsmdError
from csmd.model.estimate import CandidateGraph
from csmd.model.graph import Graph
from csmd.model.plan import Plan

from .device_graph import device_graph, uploaded
from .launch import THREADS, flat_grid, i32, i64, or_dummy, u64
from .layout import MAXQ, METHOD_ALLEY, METHOD_WJ, structs
from .module import kernel

METHODS = {"wj": METHOD_WJ, "alley": METHOD_ALLEY}
MASK64 = (1 << 64) - 1
# Alley refine sets of at least this many entries are scanned by the whole warp (warp streaming).
# bench/estimate.py's streaming tables, H100: on R-MAT 2^18 (hubs, long refine sets) Alley goes from
# 111M to 438M samples/s on 4-vertex queries at 64 (377M at 16, 395M at 256) and from 19M to 49M on
# 8-vertex ones (47-50M from 16 to 128); yeast, HPRD and github refine sets are short: within -8%..+6%
# of off at any threshold, noise-sized
STREAM_MIN = 64
# The device builds the candidate graph faster than the host wherever measured, given the graph on the
# device (bench/estimate.py, H100: 1.1-1.2 ms against 1.5-1.7 ms on yeast, HPRD and github, 2.2-3.9 ms
# against 84-206 ms on R-MAT 2^18). Uploading the graph first costs ~19 ns an edge (R-MAT: 74 ms for
# 3.8M edges), the host's build ~15 ns a scanned entry (scan_volume): so the device builds it where
# the graph is there already or the scan volume is at least 1.25 times the graph's edges.
DEVICE_BUILD_SHARE = 1.25


@dataclass
class Candidates:
    """The candidate graph in device memory, as the kernel reads it (sampler.cu's Cand): the
    depth-0 candidates, each depth's row of every vertex (-1: not a candidate), each backward
    edge's first row in indptr, one indptr for all edges' rows, and the local lists."""

    first: cp.ndarray  # int32
    rows: cp.ndarray  # (depth, n) int32
    ipbase: cp.ndarray  # int64, one per backward edge (and one past the last)
    indptr: cp.ndarray  # int64
    local: cp.ndarray  # int32

    def arrays(self) -> tuple:
        return self.first, self.rows, self.ipbase, self.indptr, self.local


def backward_edges(plan: Plan) -> list[tuple[int, int, int]]:
    """(depth i, earlier depth j, edge label) of every backward edge, in the kernel's order."""
    return [(i, j, el) for i in range(plan.depth) for j, el in plan.backward[i]]


def upload(cg: CandidateGraph) -> Candidates:
    """The host's candidate graph, copied to the device."""
    lists = [(ip, loc) for edges in cg.edges for _, _, ip, loc in edges]
    rows = np.cumsum([0] + [len(ip) - 1 for ip, _ in lists])
    at = np.cumsum([0] + [len(loc) for _, loc in lists])
    indptr = np.concatenate([ip[:-1] + a for (ip, _), a in zip(lists, at)] + [at[-1:]])
    local = np.concatenate([loc for _, loc in lists] + [np.zeros(0, np.int32)]).astype(np.int32)
    return Candidates(cp.asarray(cg.first), cp.asarray(np.stack([cg.row[u] for u in cg.plan.order])),
                      cp.asarray(rows), cp.asarray(indptr.astype(np.int64)), cp.asarray(local))


def build(g: Graph, plan: Plan) -> Candidates:
    """The candidate graph built on the device from the filtered candidates (plan.cand) and the
    device copy of g: a scan of each row's neighbours by sampler.cu's candidate_lists."""
    dg = device_graph(g)
    cand = cp.asarray(np.stack([plan.cand[u] for u in plan.order]))
    rank = cp.cumsum(cand, axis=1, dtype=cp.int32) - 1
    rows = cp.where(cand, rank, -1).astype(cp.int32)
    verts = cp.flatnonzero(cand)  # j * n + v, by depth, then by id
    sizes = rank[:, -1].get().astype(np.int64) + 1
    edges = np.array(backward_edges(plan), np.int32).reshape(-1, 3)
    ei, ej, eel = (np.ascontiguousarray(c) for c in edges.T)
    ebase = np.concatenate([[0], np.cumsum(sizes[ej])]).astype(np.int64)
    R = int(ebase[-1])
    indptr = cp.zeros(R + 1, cp.int64)
    local = cp.empty(0, cp.int32)
    ebase = cp.asarray(ebase)
    if R:
        vbase = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        args = [i64(R), i32(len(edges)), ebase, *map(cp.asarray, (ei, ej, eel, vbase)), verts, rows, i64(g.n),
                dg.indptr, dg.adj, or_dummy(dg.adj_el), i32(dg.has_edge_labels)]
        grid = flat_grid(R * 32)  # a warp a row
        kernel("sampler", "candidate_lists")(grid, (THREADS,), (*args, i32(0), indptr, local))
        indptr = cp.cumsum(indptr)
        local = cp.empty(int(indptr[-1].get()), cp.int32)
        kernel("sampler", "candidate_lists")(grid, (THREADS,), (*args, i32(1), indptr, local))
    first = (verts[:int(sizes[0])]).astype(cp.int32)  # depth 0's flat indices are the vertices
    return Candidates(first, rows, ebase, indptr, local)


def scan_volume(g: Graph, plan: Plan) -> int:
    """Neighbour entries the candidate graph's construction looks at: the degrees of the
    candidates of each backward edge's earlier vertex."""
    deg = g.degrees
    vol = [int(deg[plan.cand[u]].sum()) for u in plan.order]
    return sum(vol[j] for _, j, _ in backward_edges(plan))


def candidates(g: Graph, plan: Plan, on_device: bool | None = None) -> Candidates:
    """The candidate graph on the device, built there where that is faster (on_device None: see
    DEVICE_BUILD_SHARE), else on the host and uploaded."""
    if on_device is None:
        on_device = uploaded(g) or scan_volume(g, plan) >= DEVICE_BUILD_SHARE * g.num_edges
    return build(g, plan) if on_device else upload(CandidateGraph(g, plan))


class GpuSampler:
    """Draws rounds of WanderJoin or Alley samples of one query, on the device."""

    # rounds grow to 4M samples (16,384 blocks of 256): ~0.1 s at the target rate, so the
    # launch and the host's stop-rule check between rounds cost under 1%
    max_round_blocks = 1 << 14
    block_unit = 32  # with inheritance a warp's samples depend on each other: statistics blocks are whole warps

    def __init__(self, plan: Plan, cands: Candidates, method: str, seed: int, inherit: bool = True, trawl: int = 0,
                 stream: int | None = None):
        """inherit: sample inheritance within each warp (sampler.cu): dead walks continue living ones,
        so more of the warp's lanes finish; off, the weights are the CPU sampler's, lane by lane.
        trawl: the last `trawl` query vertices are counted exactly per sampled prefix (trawling).
        stream: Alley's warp-streaming threshold (None: STREAM_MIN, read now; 0: never)."""
        if method not in METHODS:
            raise CsmdError(f"unknown method {method!r}")
        if plan.depth > MAXQ:  # then MAXE holds every backward edge too
            raise CsmdError(f"the GPU sampler takes queries of at most {MAXQ} vertices, not {plan.depth}")
        self.seed, self.cands = seed, cands
        self.n = cands.rows.shape[1]
        stream = STREAM_MIN if stream is None else stream
        walk = max(1, plan.depth - trawl)
        s = structs("sampler")
        t = np.zeros(s.sample_plan // 4, np.int32)
        for field, value in (("depth", plan.depth), ("method", METHODS[method]), ("nfirst", len(cands.first)),
                             ("inherit", inherit), ("walk", walk), ("stream", stream)):
            t[getattr(s, "sp_" + field) // 4] = value
        ebeg, ej, same = s.sp_ebeg // 4, s.sp_ej // 4, s.sp_same // 4
        t[ebeg:ebeg + plan.depth + 1] = np.cumsum([0] + [len(b) for b in plan.backward])
        edges = backward_edges(plan)
        t[ej:ej + len(edges)] = [j for _, j, _ in edges]
        t.view(np.uint32)[same:same + plan.depth] = [sum(1 << j for j in js) for js in plan.same_label]
        self.plan = cp.asarray(t)
        self.kernel = kernel("sampler", "sample_trawl" if walk < plan.depth else
                             "sample_stream" if stream and method == "alley" else "sample")

    def draw(self, rnd: int, lanes: int) -> cp.ndarray:
        """The weights of `lanes` samples of round `rnd` (float64 on the device, 0 for a failed walk)."""
        w = cp.empty(lanes, cp.float64)
        c = self.cands
        self.kernel(flat_grid(lanes), (THREADS,), (
            self.plan, c.first, c.rows, i64(self.n), c.ipbase, c.indptr, c.local,
            u64(self.seed & MASK64), u64(self.seed >> 64), u64(rnd), i64(lanes), w))
        return w
