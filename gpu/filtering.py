"""Candidate filtering on the device for a batch of queries (docs/design.md section 5): LDF + NLF, then
arc-consistency rounds, all queries of the batch in the same launches.

cbits holds one row of n uint32 per query, one bit per query vertex; only the
per-query-vertex counts come back to the host (to choose the matching orders).
"""

from __future__ import annotations

from dataclasses import dataclass

import cupy as cp
import numpy as np

from csmd.errors import InputError
from csmd.model.direction import device_label
from csmd.model.graph import Graph

from .device_graph import DeviceGraph
from .launch import THREADS, flat_grid, i32, i64, or_dummy
from .module import kernel

from .layout import MAXQ  # query vertices: one bit each in a uint32
REFINE_ROUNDS = 3  # as the CPU planner: later rounds rarely remove anything


@dataclass
class QueryBatch:
    """Queries packed for the device, padded to MAXQ vertices: vertex labels, adjacency
    matrices and (when some query has them) edge labels, all in query-vertex space."""

    nq: np.ndarray  # (Q,) vertices per query
    labels: np.ndarray  # (Q, MAXQ) int32, -1 past nq
    adj: np.ndarray  # (Q, MAXQ, MAXQ) bool
    el: np.ndarray | None  # (Q, MAXQ, MAXQ) int32: el[q, u, w] tests the label of u's image's entry for w's
                           # (a directed pair's code: direction.py device_label)

    def __len__(self) -> int:
        return len(self.nq)

    @classmethod
    def pack(cls, queries: list[Graph]) -> "QueryBatch":
        big = [q.n for q in queries if q.n > MAXQ]
        if big:
            raise InputError(f"the GPU engine matches queries of at most {MAXQ} vertices, not {max(big)}")
        nb = len(queries)
        labels = np.full((nb, MAXQ), -1, np.int32)
        adj = np.zeros((nb, MAXQ, MAXQ), bool)
        el = np.zeros((nb, MAXQ, MAXQ), np.int32) if any(q.elabels.any() for q in queries) else None
        for i, q in enumerate(queries):
            labels[i, :q.n] = q.labels
            rows = np.repeat(np.arange(q.n), np.diff(q.indptr))
            adj[i, rows, q.indices] = True
            if el is not None:
                el[i, rows, q.indices] = device_label(q.elabels, q.directed)
        return cls(np.array([q.n for q in queries], np.int32), labels, adj, el)

    def take(self, which: np.ndarray) -> "QueryBatch":
        return QueryBatch(self.nq[which], self.labels[which], self.adj[which],
                          None if self.el is None else self.el[which])

    @property
    def masks(self) -> np.ndarray:
        """(Q, MAXQ) uint32: bit w of row u <=> query edge u-w."""
        return bitmask(self.adj)


def bitmask(m: np.ndarray) -> np.ndarray:
    """Rows of MAXQ bools (last axis) as uint32 words, bit j = m[..., j]."""
    return np.packbits(m, axis=-1, bitorder="little").view("<u4")[..., 0]


def _grid(dg: DeviceGraph, queries: int) -> tuple[int, int]:
    return flat_grid(dg.n)[0], queries


def filter_candidates(dg: DeviceGraph, batch: QueryBatch, converge: bool = False
                      ) -> tuple[cp.ndarray, np.ndarray, np.ndarray]:
    """(cbits, sizes, volume): cbits[i, v] bit u <=> v is a candidate of vertex u of query i
    (shape (Q, n)); sizes[i, u] = |C(u)| of query i and volume[i, u] the sum of the degrees
    of those candidates (shape (Q, MAXQ)).

    A refine round updates cbits in place while its other threads read them, so what
    REFINE_ROUNDS rounds leave depends on the threads' timing (a superset of the matches'
    vertices all the same). `converge` refines until a round changes nothing: the one
    arc-consistent fixpoint, the same on every run and device, which a search split over
    devices needs (they must take the same roots, planned in the same order)."""
    nb = len(batch)
    cbits = cp.empty((nb, dg.n), cp.uint32)
    grid, n = _grid(dg, nb), i64(dg.n)
    index = (or_dummy(dg.hub_of), or_dummy(dg.hub_tab), i32(dg.num_labels), i32(dg.single_label))
    query = (cp.asarray(batch.nq), cp.asarray(batch.labels), cp.asarray(batch.masks))
    kernel("filtering", "ldf_nlf")(grid, (THREADS,), (n, dg.indptr, dg.gadj, dg.labels, *index, *query, cbits))
    qel = or_dummy(None)
    if dg.has_edge_labels:  # a query without edge labels asks for label 0 on every edge
        qel = cp.zeros((nb, MAXQ, MAXQ), cp.int32) if batch.el is None else cp.asarray(batch.el)
    changed = cp.zeros(1, cp.int32)
    rounds = 0
    while converge or rounds < REFINE_ROUNDS:
        rounds += 1
        changed.fill(0)
        kernel("filtering", "refine")(grid, (THREADS,), (n, dg.indptr, dg.gadj, or_dummy(dg.gadj_el), dg.labels, *index,
                                                       i32(dg.has_edge_labels), *query, qel, cbits, changed))
        if not int(changed.get()[0]):
            break
    sizes = cp.zeros((2, nb, MAXQ), cp.uint64)
    kernel("filtering", "count_bits")(grid, (THREADS,), (n, dg.indptr, cbits, sizes[0], sizes[1]))
    sizes, volume = sizes.get().astype(np.int64)
    return cbits, sizes, volume


def root_pool(dg: DeviceGraph, cbits: cp.ndarray, batch: QueryBatch, orders: np.ndarray, roots: np.ndarray
              ) -> tuple[cp.ndarray, cp.ndarray]:
    """Renumber cbits in place to matching depths and gather each query's depth-0
    candidates (roots[i] of them) into one pool: (pool, chunk_q). Each query's segment is
    padded with -1 to whole chunks of 32, and chunk_q names the query of every chunk."""
    at, chunk_q = pool_chunks(roots)
    pool = cp.full(len(chunk_q) * 32, -1, cp.int32)
    filled = cp.zeros(len(roots), cp.uint64)
    kernel("filtering", "by_depth")(_grid(dg, len(roots)), (THREADS,), (
        i64(dg.n), cbits, cp.asarray(orders.astype(np.int32)), cp.asarray(batch.nq), cp.asarray(at), pool, filled))
    return pool, cp.asarray(chunk_q)


def pool_chunks(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A root pool's layout for rows[i] rows of query i: where each query's segment starts (in
    rows; each padded to whole chunks of 32) and the query of every chunk (chunk_q)."""
    chunks = -(-np.asarray(rows, np.int64) // 32)
    at = np.zeros(len(chunks), np.int64)
    at[1:] = np.cumsum(chunks[:-1]) * 32
    return at, np.repeat(np.arange(len(chunks), dtype=np.int32), chunks)
