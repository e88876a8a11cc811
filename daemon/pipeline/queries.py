"""Registered queries above the engines: anchored orders, one-vertex queries, the canonical delta order.

Every engine gets the same anchored orders and returns its matches in any order;
the pipeline puts them in the canonical order (by update, then by the match
itself) and signs them, so deltas and their ids are identical whatever the engine
and the batching.
"""

from __future__ import annotations

import functools

import numpy as np

from csmd.engine import Anchor, ContinuousQuery, Matches, QueryDeltas, UpdateBatch
from csmd.model.graph import Graph
from csmd.model.plan import anchor_order, symmetry_constraints


def continuous_query(name: str, q: Graph, labels: np.ndarray, count_only: bool = False,
                     distinct: bool = False) -> ContinuousQuery:
    """One anchor per query edge, ordered by the data graph's label frequencies now; distinct:
    with the symmetry constraints of `csmd match --distinct`. Every embedding that contains an
    update's edge is found once, from the anchor its edge maps to, and the embeddings of one
    instance all contain it: the constraints keep one per instance, whichever anchor finds it."""
    label_sizes = np.bincount(labels) if len(labels) else np.zeros(1, np.int64)
    sizes = np.array([label_sizes[l] if l < len(label_sizes) else 0 for l in q.labels])
    qs, qd, qe = q.edge_list()
    return ContinuousQuery(name, q, count_only, [Anchor(x, y, el, anchor_order(q, sizes, x, y))
                                                 for x, y, el in zip(qs.tolist(), qd.tolist(), qe.tolist())],
                           symmetry_constraints(q)[0] if distinct else [])


def vertex_matches(cq: ContinuousQuery, batch: UpdateBatch, labels: np.ndarray,
                   select: np.ndarray | None = None) -> Matches | None:
    """A one-vertex query matches on vertex creation (+) and removal (-) (of the ops `select`
    marks, when given)."""
    hit = labels[batch.vertex_id] == cq.q.labels[0]
    if select is not None:
        hit &= select
    if not hit.any():
        return None
    seq = batch.vertex_seq[hit]
    if cq.count_only:
        return Matches(seq, counts=np.ones(len(seq), np.int64))
    return Matches(seq, rows=batch.vertex_id[hit].astype(np.int32)[:, None])


def _empty(shape, dtype) -> np.ndarray:
    a = np.zeros(shape, dtype)
    a.flags.writeable = False  # shared by every query and batch without matches
    return a


_NO_SEQ, _NO_SIGN, _NO_COUNT = _empty(0, np.int64), _empty(0, np.int8), _empty(0, np.int64)


@functools.cache
def _no_rows(n: int) -> np.ndarray:
    return _empty((0, n), np.int32)


def canonical(found: list[tuple[ContinuousQuery, Matches | None]], batch: UpdateBatch) -> list[QueryDeltas]:
    """Each query's deltas for the batch: sorted by update, then by the match; signed by the
    update; each match's ts (Matches.ts) kept with it. The count-only queries with matches are
    ordered and signed together (one sort for all of them: a batch has deltas for most of a
    hundred queries, and numpy's cost per call outweighed its work per query)."""
    out: list[QueryDeltas | None] = [None] * len(found)
    counted = [i for i, (cq, m) in enumerate(found) if m is not None and m.rows is None]
    for i, (cq, m) in enumerate(found):
        if m is None:  # most queries in most small batches: no array work
            out[i] = QueryDeltas(cq.name, _NO_SEQ, _NO_SIGN, None, 0, 0, _NO_COUNT) if cq.count_only else \
                QueryDeltas(cq.name, _NO_SEQ, _NO_SIGN, _no_rows(cq.q.n), 0, 0)
        elif m.rows is not None:
            rows, seq, ts = m.rows, np.asarray(m.seq, np.int64), m.ts
            if not m.ordered:
                order = _order(rows, seq)
                rows, seq, ts = rows[order], seq[order], None if ts is None else ts[order]
            sign = _signs(batch, seq)
            out[i] = QueryDeltas(cq.name, seq, sign, rows, int((sign > 0).sum()), int((sign < 0).sum()), ts=ts)
    if counted:
        ms = [found[i][1] for i in counted]
        seq = np.concatenate([np.asarray(m.seq, np.int64) for m in ms])
        counts = np.concatenate([np.asarray(m.counts, np.int64) for m in ms])
        which = np.repeat(np.arange(len(ms)), [len(m.seq) for m in ms])
        keep = counts != 0
        order = np.lexsort((seq[keep], which[keep]))  # by query, then update; stable
        seq, counts, which = seq[keep][order], counts[keep][order], which[keep][order]
        sign = _signs(batch, seq)
        bounds = np.searchsorted(which, np.arange(len(ms) + 1)).tolist()
        plus = np.concatenate(([0], np.cumsum(np.where(sign > 0, counts, 0))))
        minus = np.concatenate(([0], np.cumsum(np.where(sign < 0, counts, 0))))
        for k, i in enumerate(counted):
            lo, hi = bounds[k], bounds[k + 1]
            out[i] = QueryDeltas(found[i][0].name, seq[lo:hi], sign[lo:hi], None, int(plus[hi] - plus[lo]),
                                 int(minus[hi] - minus[lo]), counts[lo:hi])
    return out


def _numpy_order(rows: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """row_order.canonical_order without numba."""
    return np.lexsort(_packed(rows) + (seq,))


try:
    from csmd.pipeline.row_order import canonical_order as _order
except ImportError:  # no numba
    _order = _numpy_order


def _packed(rows: np.ndarray) -> tuple[np.ndarray, ...]:
    """lexsort's keys for rows (the last key first): their ids (internal, >= 0) packed into as
    few uint64 words as hold them in order, each a key where a column was one: lexsort's time
    goes with its keys (a 16-vertex query's 17 keys took 0.2 us a row on the yeast stream)."""
    k, n = rows.shape
    bits = max(int(rows.max(initial=0)).bit_length(), 1)
    per = 64 // bits
    words = []
    for lo in range(0, n, per):
        w = np.zeros(k, np.uint64)
        for c in range(lo, min(lo + per, n)):
            w <<= np.uint64(bits)
            w |= rows[:, c].astype(np.uint64)
        words.append(w)
    return tuple(words[::-1])


def _signs(batch: UpdateBatch, seq: np.ndarray) -> np.ndarray:
    """The sign of each delta's update (edge and vertex ops of the batch)."""
    if len(batch.vertex_seq):
        op_seq = np.concatenate([batch.edge_seq, batch.vertex_seq])
        op_sign = np.concatenate([batch.edge_sign, batch.vertex_sign]).astype(np.int8)
        order = np.argsort(op_seq, kind="stable")
        op_seq, op_sign = op_seq[order], op_sign[order]
    else:  # the edge ops alone are in update order already
        op_seq, op_sign = batch.edge_seq, batch.edge_sign.astype(np.int8)
    pos = np.searchsorted(op_seq, seq)
    # a vertex removal shares no number with its edge deletions; a creation may share its
    # number with the edge insertion that created it, with the same sign
    return op_sign[pos]
