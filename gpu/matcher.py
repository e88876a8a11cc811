"""Driver of the warp-parallel enumeration kernel (gpu/matcher.cu): shapes, memory, launches.

One search covers a batch of planned queries: a root pool in chunks of one query each
(for a batch of one, optionally widened by a breadth-first pre-pass to depth 1), then
launches of `match` until every warp is idle. A launch also ends when the output
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

from .device_graph import DeviceGraph
from .filtering import QueryBatch, bitmask, pool_chunks
from .launch import THREADS, flat_grid, i32, i64, or_dummy, u64
from .layout import (CTL_GCOUNT, CTL_HEAD, CTL_IDLE, CTL_OUTN, CTL_POOL, CTL_STARTED, CTL_STOP, CTL_TAIL, MAXQ,
                     STOP_LIMIT, STOP_TIME, structs)
from .module import kernel

WARPS_PER_BLOCK = 4
SPLIT_WIDEN_ROOTS = 1 << 17  # a search split over devices widens fewer roots (one H200: 4 x 32 x 1056 warps)
# A search split over devices deals out each prefix's candidate range for the last depth it
# enumerates, or an earlier range of at least DEAL_RANGE entries (None: none; matcher.cu deal_at).
# The LJ-sized workload's tree_6 (12,288 updates, 4 H200s): 3.47x one GPU dealing at the last depth,
# 1.18x dealing ranges of 64 (a hub in such a range takes its whole subtree to one device)
DEAL_RANGE: int | None = None


def split_args(share: tuple[int, int]) -> tuple:
    """The search kernels' last three arguments for part i of a search split over n devices."""
    i, n = share
    return i32(n if n > 1 else 0), i32(i), i32(0x7FFFFFFF if DEAL_RANGE is None else DEAL_RANGE)


@dataclass
class Tuning:
    """Capacities and the offload threshold; the defaults keep the extra memory under ~1 GB."""

    out_rows: int = 1 << 18  # output buffer rows per drain (at least 32: one batch)
    queue_tasks: int = 1 << 18  # ring of offloaded tasks (160 bytes each)
    bfs_rows: int = 1 << 25  # pre-pass prefixes kept (8 bytes each); a larger pre-pass is abandoned
    offload_us: float = 200.0  # a warp busy this long hands work to idle warps
    # fewer blocks leave more of the SM's on-chip memory to the L1 cache: on github (H200)
    # 2 took 10.4 s for Q_0..Q_21, 3 took 10.6 and 4 took 13.0 (Q_13: 0.19 / 0.31 / 0.63 s)
    max_blocks_per_sm: int = 2
    prefix_entries: int = 1 << 26  # count_last's prefix sums (4 bytes an adjacency entry), all queries together


def query_tables(batch: QueryBatch, orders: np.ndarray, sym: list | None = None
                 ) -> tuple[np.ndarray, np.ndarray | None]:
    """The kernel's QueryTable of every query of the batch (rows of int32) and, with
    edge labels, its edge labels by depth ([d][j] flattened, as depth j sees the edge). orders (Q, MAXQ) as
    greedy_orders gives them; sym[i] lists query i's (x, y) with f(x) < f(y)."""
    nb = len(batch)
    n = batch.nq.astype(np.int64)
    valid = np.arange(MAXQ) < n[:, None]
    order = np.where(valid, orders, 0)
    r = np.arange(nb)[:, None, None]
    adj = batch.adj[r, order[:, :, None], order[:, None, :]]  # by depth
    lab = np.take_along_axis(batch.labels, order, 1)
    earlier = np.tril(np.ones((MAXQ, MAXQ), bool), -1) & valid[:, None, :]
    s = structs()  # column of each QueryTable field, as the device laid them out
    outpos, label, back, same, less, greater = (x // 4 for x in (s.qt_outpos, s.qt_label, s.qt_back, s.qt_same,
                                                                  s.qt_less, s.qt_greater))
    t = np.zeros((nb, s.query_table // 4), np.uint32)
    t[:, 0] = t[:, 1] = n  # n, width
    t[:, outpos:outpos + MAXQ] = order
    t[:, label:label + MAXQ] = lab
    t[:, back:back + MAXQ] = bitmask(adj & earlier)
    t[:, same:same + MAXQ] = bitmask(~adj & earlier & (lab[:, :, None] == lab[:, None, :]))
    for i, pairs in enumerate(sym or []):
        pos = {int(u): d for d, u in enumerate(orders[i, :n[i]])}
        for x, y in pairs:  # f(x) < f(y): checked at the later of the two depths
            dx, dy = pos[x], pos[y]
            if dx < dy:
                t[i, less + dy] |= 1 << dx
            else:
                t[i, greater + dx] |= 1 << dy
    # el[d][j] tests the entry of depth j's image for depth d's (the searches look a candidate up
    # in the adjacency of its backward neighbours' images): the query's el[order[j], order[d]]
    el = None if batch.el is None else batch.el[r, order[:, None, :], order[:, :, None]].reshape(nb, -1)
    return t.view(np.int32), el


def _warp_words(depths: int) -> int:
    """u64 words of a warp's block: its QueryTable, WarpState and levels."""
    s = structs()
    return (s.query_table + s.warp + (depths - 1) * s.level) // 8


def _warp_word(field: str) -> int:
    """The u64 word of a WarpState field in a warp's saved block (which starts with its QueryTable)."""
    s = structs()
    return (s.query_table + getattr(s, field)) // 8


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
    """One enumeration of a batch of planned queries (tables) over their candidates
    (cbits, bits by depth) from a root pool with the query of each chunk (chunk_q)."""

    def __init__(self, dg: DeviceGraph, tables: np.ndarray, el: np.ndarray | None, cbits: cp.ndarray,
                 pool: cp.ndarray, chunk_q: cp.ndarray, tuning: Tuning, share: tuple[int, int] = (0, 1)):
        """share (i, n): this device's part of a search split over n (matcher.cu deal_at: every
        device takes the whole pool)."""
        self.dg, self.cbits, self.tuning = dg, cbits, tuning
        self.tables = tables
        self.nb = len(tables)
        self.fn = kernel("matcher", "match")
        self.nmax = int(tables[:, 0].max())
        self.smem = WARPS_PER_BLOCK * 8 * _warp_words(self.nmax)
        self.fn.max_dynamic_shared_size_bytes = self.smem
        self.blocks = _grid(self.fn, self.smem, tuning.max_blocks_per_sm)
        self.nwarps = self.blocks * WARPS_PER_BLOCK
        self.ctl = cp.zeros(8, cp.uint64)
        self.state = cp.zeros(self.nwarps * _warp_words(self.nmax), cp.uint64)
        self.queue = cp.empty(tuning.queue_tasks * structs().task, cp.uint8)
        self.ready = cp.zeros(tuning.queue_tasks, cp.int32)
        self.counts = cp.zeros(self.nb, cp.uint64)
        self.pool, self.pool_m, self.chunk_q = pool, 1, chunk_q
        self.share = share
        if dg.has_edge_labels and el is None:  # the kernel compares every edge's label: 0 in these queries
            el = np.zeros((self.nb, MAXQ * MAXQ), np.int32)
        self.el_host = el if dg.has_edge_labels else None
        self.el = or_dummy(None if self.el_host is None else cp.asarray(el))
        self.prefix, self.prefix_at = or_dummy(None), cp.full(self.nb, -1, cp.int64)
        self.dev_tables = cp.asarray(tables)

    def _count_last_by_prefix(self) -> None:
        """Counting, for the queries whose last depth has one backward edge: prefix sums of
        the adjacency entries that are candidates of the last depth over the right edge
        label, so the kernel counts a node's last-depth matches without checking its
        candidates one by one. Queries get them while the total fits tuning.prefix_entries."""
        dg, t = self.dg, self.tables
        m2 = len(dg.gadj)
        last = t[:, 0] - 1
        back = t[np.arange(self.nb), 4 + 2 * MAXQ + last].view(np.uint32)
        one = np.flatnonzero((last > 0) & (np.bitwise_count(back) == 1))
        one = one[: min(self.tuning.prefix_entries, 2**31 - 1) // (m2 + 1)]
        if not len(one) or m2 + 1 > 2**31 - 1:
            return
        j = np.log2(back[one]).astype(np.int64)  # the one backward depth
        els = np.zeros(len(one), np.int32)
        if self.el_host is not None:
            els = self.el_host[one, last[one] * MAXQ + j].astype(np.int32)
        flags = cp.empty((len(one), m2), cp.int32)
        kernel("matcher", "last_flags")((flat_grid(m2)[0], len(one)), (THREADS,), (
            i64(dg.n), i64(m2), dg.gadj, or_dummy(dg.gadj_el), i32(dg.has_edge_labels),
            cp.asarray(one.astype(np.int32)), cp.asarray(els), cp.asarray(last[one].astype(np.int32)), self.cbits,
            flags))
        self.prefix = cp.zeros((len(one), m2 + 1), cp.int32)
        cp.cumsum(flags, axis=1, dtype=cp.int32, out=self.prefix[:, 1:])
        del flags
        self.prefix_at[cp.asarray(one)] = cp.arange(len(one), dtype=cp.int64) * (m2 + 1)
        fast = t.copy()
        fast[one, 2] = 1
        self.dev_tables = cp.asarray(fast)

    def _launch(self, tables, emit: bool, out, out_cap: int, limit_left: int, count_limit: int,
                budget_s: float | None, resume: bool, share: tuple[int, int] = (0, 1)) -> np.ndarray:
        self.ctl[CTL_IDLE:CTL_OUTN + 1] = 0
        self.ctl[CTL_STARTED] = 0
        dg = self.dg
        budget_ns = 0 if budget_s is None else max(1, int(budget_s * 1e9))
        self.fn((self.blocks,), (WARPS_PER_BLOCK * 32,), (
            dg.indptr, dg.adj, or_dummy(dg.adj_el), dg.gadj, or_dummy(dg.gadj_el), dg.labels, or_dummy(dg.hub_of),
            or_dummy(dg.hub_tab), i32(dg.num_labels), i32(dg.single_label), i64(dg.n), i32(dg.has_edge_labels),
            i32(self.nmax), tables, self.cbits, self.el, self.prefix, self.prefix_at, self.pool, self.chunk_q,
            i64(len(self.pool) // self.pool_m), i32(self.pool_m), self.ctl, self.queue, self.ready,
            i64(self.tuning.queue_tasks), self.state, self.counts, i32(resume), i32(emit), out, i64(out_cap),
            i64(limit_left), u64(count_limit), i64(budget_ns), i64(int(self.tuning.offload_us * 1e3)),
            *split_args(share)), shared_mem=self.smem)
        return self.ctl.get()

    def widen_pool(self, deadline: float | None) -> bool:
        """Breadth-first pre-pass for a batch of one query: replace the roots by their valid
        depth-1 extensions when there are too few roots to occupy every warp and the
        extensions fit the pool cap (run unsplit: every device of a split widens alike). False
        if the deadline passed."""
        # a split's devices must all widen or all not (a root row dealt out whole goes by its
        # vertices, matcher.cu mine_whole): a bound of their own warps could differ
        few = 4 * 32 * self.nwarps if self.share[1] == 1 else SPLIT_WIDEN_ROOTS
        if self.nb == 1 and self.nmax >= 3 and len(self.pool) < few:
            cap = self.tuning.bfs_rows
            out = cp.empty(2 * cap, cp.int32)
            t = self.tables.copy()
            t[:, 0] = t[:, 1] = 2
            t[:, 4:6] = [0, 1]
            ctl = self._launch(cp.asarray(t), True, out, cap, cap + 1, 0, _left(deadline), False)
            if ctl[CTL_STOP] == STOP_TIME:
                return False
            if ctl[CTL_STOP] == 0:  # otherwise (buffer full) the pre-pass is abandoned
                k = int(ctl[CTL_OUTN])
                _, chunk_q = pool_chunks([k])
                self.pool = cp.full(64 * len(chunk_q), -1, cp.int32)
                self.pool[: 2 * k] = out[: 2 * k]
                self.pool_m, self.chunk_q = 2, cp.asarray(chunk_q)
            self.ctl.fill(0)  # the pre-pass may have used the task queue
            self.ready.fill(0)
            self.counts.fill(0)
        return True

    def run(self, *, limit: int | None, deadline: float | None, sink) -> tuple[np.ndarray, np.ndarray]:
        """(matches, complete) per query; with `sink` (a batch of one), every match goes to
        sink(rows) as it is drained; a limit also needs a batch of one."""
        if self.nb > 1 and (limit is not None or sink is not None):  # counts and rows are per search
            raise ValueError("a limit or a sink needs a search of one query")
        width = self.nmax
        if limit is not None and limit <= 0:
            return np.zeros(1, np.int64), np.zeros(1, bool)
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
                return self._counts(drained, emit, count_limit), self._finished()
            limit_left = (1 << 62) if limit is None else limit - drained
            ctl = self._launch(self.dev_tables, emit, out, out_cap, limit_left, count_limit, left, resume, self.share)
            if emit and ctl[CTL_OUTN]:
                k = int(ctl[CTL_OUTN])
                sink(out[: k * width].reshape(k, width).get())
                drained += k
            if ctl[CTL_STOP] == 0:
                return self._counts(drained, emit, count_limit), np.ones(self.nb, bool)
            if ctl[CTL_STOP] == STOP_TIME:
                return self._counts(drained, emit, count_limit), self._finished()
            if ctl[CTL_STOP] == STOP_LIMIT or (limit is not None and drained >= limit):
                return self._counts(drained, emit, count_limit), np.zeros(1, bool)
            resume = True

    def _finished(self) -> np.ndarray:
        """Per query: no work of it is left (after a stop at the deadline): no untaken root
        chunk, no queued task and no warp still on it."""
        ctl = self.ctl.get()
        left = set(self.chunk_q[min(int(ctl[CTL_POOL]), len(self.pool) // self.pool_m) // 32:].get().tolist())
        head, tail = int(ctl[CTL_HEAD]), int(ctl[CTL_TAIL])
        if tail > head:
            slots = cp.asarray(np.arange(head, tail) % self.tuning.queue_tasks)
            s = structs()
            left |= set(self.queue.view(cp.int32).reshape(-1, s.task // 4)[slots, s.task_q // 4].get().tolist())
        words = self.state.reshape(self.nwarps, -1)[:, _warp_word("warp_active")].get()
        active, q = words & 0xFFFFFFFF, (words >> 32).astype(np.int64)
        left |= set(q[(active != 0) & (q < self.nb)].tolist())
        done = np.ones(self.nb, bool)
        done[list(left)] = False
        return done

    def balance(self) -> dict:
        """Batches checked per warp: total, mean and max (max / mean near 1 = balanced)."""
        b = self.state.reshape(self.nwarps, -1)[:, _warp_word("warp_batches")].get().astype(np.int64)
        return {"warps": self.nwarps, "batches": int(b.sum()), "mean": float(b.mean()), "max": int(b.max())}

    def _counts(self, drained: int, emit: bool, count_limit: int) -> np.ndarray:
        if emit:
            return np.array([drained], np.int64)
        if count_limit:
            return np.array([min(int(self.ctl[CTL_GCOUNT].get()), count_limit)], np.int64)
        return self.counts.get().astype(np.int64)


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else deadline - time.monotonic()


