"""The CPU engine's executor (EX): incremental matching of every update at its own timestamp.

For an anchor query edge (x, y) the matches that contain an updated edge {a, b} are
the static search seeded with x -> a, y -> b and with x -> b, y -> a (directed: the ways
that map one of the anchor's arcs onto the updated arc a -> b), in the order
that starts from that edge. Each seed row carries its update's timestamp, so the
rows of a whole batch (and of every update in it) are searched together while each
reads exactly the graph G_k of its update. Under event time a seed row also carries its
update's arcs' ts (UpdateBatch.edge_ts, put on the anchor's arcs), which the search checks as
the anchor's own constraints before it extends the row.
"""

from __future__ import annotations

import numpy as np

from csmd.cpu.matcher import search
from csmd.cpu.mvg import MultiVersionGraph
from csmd.engine import ContinuousQuery, Matches, UpdateBatch
from csmd.model.direction import label_test, seed_ways
from csmd.model.plan import Plan, make_plan
from csmd.model.time_constraints import NO_TS


class PreparedQuery:
    """A registered query with one search plan per anchor (no candidate masks: the graph changes)."""

    def __init__(self, query: ContinuousQuery):
        self.name, self.q, self.count_only = query.name, query.q, query.count_only
        self.anchors: list[tuple[int, int, int, Plan]] = [
            (a.x, a.y, a.el, make_plan(query.q, None, a.order, query.sym)) for a in query.anchors]


def match_batch(mvg: MultiVersionGraph, batch: UpdateBatch, pq: PreparedQuery) -> Matches | None:
    """pq's matches containing each edge update of the batch, at the update's timestamp."""
    labels = mvg.labels.a
    parts_rows, parts_seq, parts_ts, counts = [], [], [], {}
    timed = mvg.timed
    edge_ts = batch.edge_ts
    if timed and edge_ts is None:  # (every timed batch has them; a hand-made one counts as untimed)
        edge_ts = np.full((len(batch.edge_seq), 2), NO_TS, np.int64)

    def collect(rows, ts, match_ts=None):
        parts_rows.append(rows.copy())
        parts_seq.append(ts.copy())
        if match_ts is not None:
            parts_ts.append(match_ts)

    la, lb = labels[batch.edge_a], labels[batch.edge_b]
    for x, y, el, plan in pq.anchors:
        lx, ly = pq.q.labels[x], pq.q.labels[y]
        ways = seed_ways(batch.edge_label, label_test(el, pq.q.directed), pq.q.directed)
        fwd = (la == lx) & (lb == ly) & (ways & 1 > 0)
        rev = (lb == lx) & (la == ly) & (ways & 2 > 0)
        seeds = np.concatenate([np.stack([batch.edge_a[fwd], batch.edge_b[fwd]], 1),
                                np.stack([batch.edge_b[rev], batch.edge_a[rev]], 1)]).astype(np.int32)
        ts = np.concatenate([batch.edge_seq[fwd], batch.edge_seq[rev]])
        # the arcs x -> y and y -> x: the update's a -> b and b -> a where x is on a, swapped where on b
        seed_ts = np.concatenate([edge_ts[fwd], edge_ts[rev][:, ::-1]]) if timed else None
        # the search checks depths from 2 on: a symmetry constraint between the anchor's two
        # vertices (depth 1's, distinct queries) is the seed's
        keep = np.ones(len(seeds), bool)
        for j in plan.less[1]:
            keep &= seeds[:, j] < seeds[:, 1]
        for j in plan.greater[1]:
            keep &= seeds[:, j] > seeds[:, 1]
        seeds, ts = seeds[keep], ts[keep]
        seed_ts = None if seed_ts is None else seed_ts[keep]
        if not len(seeds):
            continue
        if pq.count_only:
            res = search(mvg, plan, seeds, ts, seed_ts=seed_ts)
            for i in np.flatnonzero(res.per_ts):
                counts[res.ts_base + int(i)] = counts.get(res.ts_base + int(i), 0) + int(res.per_ts[i])
        else:
            search(mvg, plan, seeds, ts, seed_ts=seed_ts, match_ts=timed, sink=collect)
    if pq.count_only:
        if not counts:
            return None
        seq = np.fromiter(counts, np.int64, len(counts))
        return Matches(seq, counts=np.fromiter(counts.values(), np.int64, len(counts)))
    if not parts_rows:
        return None
    return Matches(np.concatenate(parts_seq), rows=np.concatenate(parts_rows),
                   ts=np.concatenate(parts_ts) if timed else None)
