"""The executor (EX): incremental matching of every update at its own timestamp.

For a query edge (x, y) the matches that contain an updated edge {a, b} are the
static search seeded with x -> a, y -> b and with x -> b, y -> a, in the order
that starts from that edge (one plan per query edge). Each seed row carries its
update's timestamp, so the rows of a whole batch (and of every update in it)
are searched together while each reads exactly the graph G_k of its update.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from csmd.cpu.matcher import search
from csmd.model.graph import Graph
from csmd.cpu.mvg import MultiVersionGraph
from csmd.model.plan import Plan, anchor_order, make_plan
from csmd.pipeline.sequencer import Batch


@dataclass
class QueryDeltas:
    """One query's deltas for one batch. rows is None for count-only queries."""

    name: str
    seq: np.ndarray  # per delta (or per update with a non-zero count when count-only)
    sign: np.ndarray
    rows: np.ndarray | None  # matches (internal ids, query-vertex order)
    positive: int
    negative: int
    counts: np.ndarray | None = None  # count-only: matches per entry of seq


class RegisteredQuery:
    """A query ready for incremental matching: one anchored plan per query edge."""

    def __init__(self, name: str, q: Graph, label_sizes: np.ndarray, count_only: bool = False):
        self.name, self.q, self.count_only = name, q, count_only
        sizes = np.array([label_sizes[l] if l < len(label_sizes) else 0 for l in q.labels])
        qs, qd, qe = q.edge_list()
        self.anchors: list[tuple[int, int, int, Plan]] = [
            (x, y, el, make_plan(q, None, anchor_order(q, sizes, x, y)))
            for x, y, el in zip(qs.tolist(), qd.tolist(), qe.tolist())
        ]


class Executor:
    def __init__(self, queries: list[RegisteredQuery]):
        self.queries = list(queries)

    def run(self, mvg: MultiVersionGraph, batch: Batch) -> list[QueryDeltas]:
        sign_of = dict(zip(batch.edge_seq.tolist(), batch.edge_sign.tolist()))
        return [self._query(mvg, batch, rq, sign_of) for rq in self.queries]

    def _query(self, mvg: MultiVersionGraph, batch: Batch, rq: RegisteredQuery, sign_of: dict) -> QueryDeltas:
        labels = mvg.labels.a
        parts_rows, parts_seq, counts = [], [], {}

        def collect(rows, ts):
            parts_rows.append(rows.copy())
            parts_seq.append(ts.copy())

        if rq.q.n == 1:  # a single vertex matches on vertex creation and removal
            hit = labels[batch.vertex_id] == rq.q.labels[0]
            seqs, signs = batch.vertex_seq[hit], batch.vertex_sign[hit]
            rows = batch.vertex_id[hit].astype(np.int32)[:, None]
            return self._finish(rq, seqs, signs, None if rq.count_only else rows)
        la, lb = labels[batch.edge_a], labels[batch.edge_b]
        for x, y, el, plan in rq.anchors:
            lx, ly = rq.q.labels[x], rq.q.labels[y]
            fwd = (la == lx) & (lb == ly) & (batch.edge_label == el)
            rev = (lb == lx) & (la == ly) & (batch.edge_label == el)
            seeds = np.concatenate([np.stack([batch.edge_a[fwd], batch.edge_b[fwd]], 1),
                                    np.stack([batch.edge_b[rev], batch.edge_a[rev]], 1)]).astype(np.int32)
            if not len(seeds):
                continue
            ts = np.concatenate([batch.edge_seq[fwd], batch.edge_seq[rev]])
            if rq.count_only:
                res = search(mvg, plan, seeds, ts)
                for i in np.flatnonzero(res.per_ts):
                    counts[res.ts_base + int(i)] = counts.get(res.ts_base + int(i), 0) + int(res.per_ts[i])
            else:
                search(mvg, plan, seeds, ts, sink=collect)
        if rq.count_only:
            seqs = np.array(sorted(counts), np.int64)
            return self._finish(rq, seqs, np.array([sign_of[s] for s in seqs.tolist()], np.int8),
                                None, np.array([counts[s] for s in seqs.tolist()], np.int64))
        if not parts_rows:
            return self._finish(rq, np.zeros(0, np.int64), np.zeros(0, np.int8), np.zeros((0, rq.q.n), np.int32))
        rows = np.concatenate(parts_rows)
        seqs = np.concatenate(parts_seq)
        # deterministic order whatever the batching: by update, then by the match itself
        order = np.lexsort(tuple(rows[:, c] for c in range(rq.q.n - 1, -1, -1)) + (seqs,))
        rows, seqs = rows[order], seqs[order]
        signs = np.array([sign_of[s] for s in seqs.tolist()], np.int8)
        return self._finish(rq, seqs, signs, rows)

    @staticmethod
    def _finish(rq, seqs, signs, rows, counts=None) -> QueryDeltas:
        weight = np.ones(len(seqs), np.int64) if counts is None else counts
        pos = int(weight[signs > 0].sum())
        neg = int(weight[signs < 0].sum())
        return QueryDeltas(rq.name, seqs, signs, rows, pos, neg, counts)
