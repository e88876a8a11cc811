"""Driver of the warp-parallel enumeration kernel (gpu/matcher.cu): shapes, memory, launches.

One search = a root pool (optionally widened by a breadth-first pre-pass to depth 1),
then launches of `match` until every warp is idle. A launch also ends when the output
buffer fills (the host drains it and relaunches with the saved warp stacks), when the
limit is reached or when the deadline passes (complete: false).

Device memory besides the graph and the candidate bits is bounded whatever the number
of matches: warp stacks (|V(q)| x 32 nodes a warp), the task queue, the root pool and
the output buffer, each of fixed capacity.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import cupy as cp
import numpy as np

from csmd.cpu_matcher import SearchResult
from csmd.plan import Plan

from .device_graph import DeviceGraph
from .launch import THREADS, flat_grid, i32, i64, or_dummy, u64
from .module import kernel

MAXQ = 32
QT_INTS = 4 + 6 * MAXQ + MAXQ * MAXQ  # struct QueryTable
QT_BYTES = 4 * QT_INTS
LEVEL_BYTES = 856  # struct Level
WARP_BYTES = 40  # struct WarpState
TASK_BYTES = 152  # struct Task
WARPS_PER_BLOCK = 4
COUNT_WORD, BATCHES_WORD = 3, 4  # WarpState.count and .batches, in u64 words

CTL_POOL, CTL_HEAD, CTL_TAIL, CTL_IDLE, CTL_STOP, CTL_OUTN, CTL_GCOUNT, CTL_STARTED = range(8)
STOP_FULL, STOP_LIMIT, STOP_TIME = 1, 2, 3


@dataclass
class Tuning:
    """Capacities and the offload threshold; the defaults keep the extra memory under ~1 GB."""

    out_rows: int = 1 << 18  # output buffer rows per drain (at least 32: one batch)
    queue_tasks: int = 1 << 18  # ring of offloaded tasks (152 bytes each)
    bfs_rows: int = 1 << 25  # pre-pass prefixes kept (8 bytes each); a larger pre-pass is abandoned
    offload_us: float = 200.0  # a warp busy this long hands work to idle warps
    max_blocks_per_sm: int = 4  # fewer leaves more of the SM's on-chip memory to the L1 cache
    prefix_entries: int = 1 << 26  # count_last's prefix sums (4 bytes an adjacency entry) up to this size


def query_table(plan: Plan, depths: int, outpos: list[int]) -> np.ndarray:
    """The kernel's QueryTable for the first `depths` depths of plan, rows laid out by outpos."""
    t = np.zeros(QT_INTS, np.uint32)
    q = plan.query
    t[0], t[1], t[2] = depths, len(outpos), plan.depth
    t[4:4 + len(outpos)] = outpos
    lab, back, same, less, greater = (4 + MAXQ * k for k in range(1, 6))
    el = 4 + 6 * MAXQ
    for d, u in enumerate(plan.order):
        t[lab + d] = q.labels[u]
        for j, e in plan.backward[d]:
            t[back + d] |= 1 << j
            t[el + d * MAXQ + j] = e
        t[same + d] = sum(1 << j for j in plan.same_label[d])
        t[less + d] = sum(1 << j for j in plan.less[d])
        t[greater + d] = sum(1 << j for j in plan.greater[d])
    return t.view(np.int32)


def _warp_words(depths: int) -> int:
    return (WARP_BYTES + (depths - 1) * LEVEL_BYTES) // 8


def _grid(fn, smem: int, max_blocks_per_sm: int) -> int:
    """Blocks that fit the device at once (termination does not depend on it being exact)."""
    dev = cp.cuda.Device()
    attrs = dev.attributes
    threads = WARPS_PER_BLOCK * 32
    regs = getattr(fn, "num_regs", 64) or 64
    by_regs = 65536 // (-(-regs * 32 // 256) * 256 * WARPS_PER_BLOCK)
    by_smem = attrs.get("MaxSharedMemoryPerMultiprocessor", 100 << 10) // (smem + 1024)
    by_threads = attrs.get("MaxThreadsPerMultiProcessor", 2048) // threads
    return attrs["MultiProcessorCount"] * max(1, min(by_regs, by_smem, by_threads, max_blocks_per_sm))


class WarpSearch:
    """One enumeration of `plan` over the candidates `cbits` (bits by depth) from `roots`."""

    def __init__(self, dg: DeviceGraph, plan: Plan, cbits: cp.ndarray, roots: cp.ndarray, tuning: Tuning):
        self.dg, self.plan, self.cbits, self.tuning = dg, plan, cbits, tuning
        self.fn = kernel("matcher", "match")
        depth = plan.depth
        self.smem = QT_BYTES + WARPS_PER_BLOCK * 8 * _warp_words(depth)
        self.fn.max_dynamic_shared_size_bytes = self.smem
        self.blocks = _grid(self.fn, self.smem, tuning.max_blocks_per_sm)
        self.nwarps = self.blocks * WARPS_PER_BLOCK
        self.ctl = cp.zeros(8, cp.uint64)
        self.state = cp.empty(self.nwarps * _warp_words(depth), cp.uint64)
        self.queue = cp.empty(tuning.queue_tasks * TASK_BYTES, cp.uint8)
        self.ready = cp.zeros(tuning.queue_tasks, cp.int32)
        self.pool, self.pool_m = roots, 1
        self.table = cp.asarray(query_table(plan, depth, plan.order))
        self.last_prefix = None

    def _count_last_by_prefix(self) -> None:
        """Counting, with one backward edge at the last depth: prefix sums of the adjacency
        entries that are candidates of the last depth over the right edge label, so the kernel
        counts a node's last-depth matches without checking its candidates one by one."""
        dg, plan = self.dg, self.plan
        m2 = len(dg.gadj)
        if len(plan.backward[-1]) != 1 or m2 + 1 > min(self.tuning.prefix_entries, 2**31 - 1):
            return
        el = plan.backward[-1][0][1]
        flags = cp.empty(m2, cp.int32)
        kernel("matcher", "last_flags")(flat_grid(m2), (THREADS,), (
            i64(m2), dg.gadj, or_dummy(dg.gadj_el), i32(dg.has_edge_labels), i32(el), self.cbits,
            i32(plan.depth - 1), flags))
        self.last_prefix = cp.zeros(m2 + 1, cp.int32)
        self.last_prefix[1:] = cp.cumsum(flags, dtype=cp.int32)

    def _launch(self, table, emit: bool, out, out_cap: int, limit_left: int, count_limit: int,
                budget_s: float | None, resume: bool) -> np.ndarray:
        self.ctl[CTL_IDLE:CTL_OUTN + 1] = 0
        self.ctl[CTL_STARTED] = 0
        dg = self.dg
        budget_ns = 0 if budget_s is None else max(1, int(budget_s * 1e9))
        self.fn((self.blocks,), (WARPS_PER_BLOCK * 32,), (
            dg.indptr, dg.adj, or_dummy(dg.adj_el), dg.gadj, or_dummy(dg.gadj_el), dg.labels, or_dummy(dg.hub_of),
            or_dummy(dg.hub_tab), i32(dg.num_labels), i32(dg.single_label), self.cbits, i32(dg.has_edge_labels),
            table, self.pool, i64(len(self.pool) // self.pool_m), i32(self.pool_m), self.ctl, self.queue, self.ready,
            i64(self.tuning.queue_tasks), self.state, i32(resume), i32(emit), out, i64(out_cap), i64(limit_left),
            u64(count_limit), i64(budget_ns), i64(int(self.tuning.offload_us * 1e3)), or_dummy(self.last_prefix),
            i32(self.last_prefix is not None and not emit)), shared_mem=self.smem)
        return self.ctl.get()

    def widen_pool(self, deadline: float | None) -> bool:
        """Breadth-first pre-pass: replace the roots by their valid depth-1 extensions when
        there are too few roots to occupy every warp and the extensions fit the pool cap.
        False if the deadline passed."""
        if self.plan.depth < 3 or len(self.pool) >= 4 * 32 * self.nwarps:
            return True
        cap = self.tuning.bfs_rows
        out = cp.empty(2 * cap, cp.int32)
        table = cp.asarray(query_table(self.plan, 2, [0, 1]))
        ctl = self._launch(table, True, out, cap, cap + 1, 0, _left(deadline), False)
        if ctl[CTL_STOP] == STOP_TIME:
            return False
        if ctl[CTL_STOP] == 0:  # otherwise (buffer full) the pre-pass is abandoned
            self.pool, self.pool_m = out[: 2 * int(ctl[CTL_OUTN])].copy(), 2
        self.ctl.fill(0)  # the pre-pass may have used the task queue
        self.ready.fill(0)
        return True

    def run(self, *, limit: int | None, deadline: float | None, sink) -> tuple[int, bool]:
        """(matches, complete); with `sink`, every match goes to sink(rows) as it is drained."""
        if limit is not None and limit <= 0:
            return 0, False
        width = self.plan.depth
        emit = sink is not None
        out_cap = max(32, self.tuning.out_rows) if emit else 0
        out = cp.empty(out_cap * width, cp.int32) if emit else or_dummy(None)
        count_limit = 0 if emit or limit is None else limit
        if not emit:
            self._count_last_by_prefix()
        drained, resume = 0, False
        while True:
            left = _left(deadline)
            if left is not None and left <= 0:
                return self._count(drained, emit, count_limit), False
            limit_left = (1 << 62) if limit is None else limit - drained
            ctl = self._launch(self.table, emit, out, out_cap, limit_left, count_limit, left, resume)
            if emit and ctl[CTL_OUTN]:
                k = int(ctl[CTL_OUTN])
                sink(out[: k * width].reshape(k, width).get())
                drained += k
            if ctl[CTL_STOP] != STOP_FULL:
                return self._count(drained, emit, count_limit), bool(ctl[CTL_STOP] == 0)
            if limit is not None and drained >= limit:
                return drained, False
            resume = True

    def balance(self) -> dict:
        """Batches checked per warp: total, mean and max (max / mean near 1 = balanced)."""
        b = self.state.reshape(self.nwarps, -1)[:, BATCHES_WORD].get().astype(np.int64)
        return {"warps": self.nwarps, "batches": int(b.sum()), "mean": float(b.mean()), "max": int(b.max())}

    def _count(self, drained: int, emit: bool, count_limit: int) -> int:
        if emit:
            return drained
        if count_limit:
            return min(int(self.ctl[CTL_GCOUNT].get()), count_limit)
        return int(self.state.reshape(self.nwarps, -1)[:, COUNT_WORD].sum().get())


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.monotonic()


def enumerate_matches(dg: DeviceGraph, plan: Plan, cbits: cp.ndarray, roots: cp.ndarray, *, limit=None,
                      time_limit=None, sink=None, tuning: Tuning | None = None, balance: dict | None = None
                      ) -> SearchResult:
    """Count (and with `sink` stream) the matches of plan; cbits hold candidate bits by depth.

    sink(rows) receives int32 arrays, one row per match, columns in query-vertex order.
    balance, if given, receives WarpSearch.balance() of the search.
    """
    t0 = time.monotonic()
    deadline = None if time_limit is None else t0 + time_limit
    if plan.depth == 1:
        return _single_vertex(plan, roots, limit, sink, t0)
    if not len(roots):
        return SearchResult(0, True, time.monotonic() - t0)
    search = WarpSearch(dg, plan, cbits, roots, tuning or Tuning())
    if not search.widen_pool(deadline):
        return SearchResult(0, False, time.monotonic() - t0)
    count, complete = search.run(limit=limit, deadline=deadline, sink=sink)
    if balance is not None:
        balance.update(search.balance())
    return SearchResult(count, complete, time.monotonic() - t0)


def _single_vertex(plan: Plan, roots: cp.ndarray, limit, sink, t0: float) -> SearchResult:
    """A one-vertex query: its matches are its candidates."""
    total = len(roots)
    count = total if limit is None else min(limit, total)
    if sink is not None and count:
        sink(cp.sort(roots)[:count].get().reshape(-1, 1))
    complete = limit is None or limit > total
    return SearchResult(count, complete, time.monotonic() - t0)
