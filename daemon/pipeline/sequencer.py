"""The graph updater (GU): sequence numbers, batching, and applying batches to the MVG.

Every record gets the next sequence number on arrival (its timestamp T). A
vertex deletion expands into one edge deletion per live edge, each with its own
sequence number, then the vertex's removal. Records that change nothing
(inserting an edge that exists, deleting one that does not, adding a vertex
that exists, self-loops) keep their sequence number, produce no delta and are
counted in `ignored`.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from csmd.model.formats import DELETE_EDGE, DELETE_VERTEX, INSERT_EDGE, INSERT_VERTEX, Update
from csmd.cpu.mvg import MultiVersionGraph


@dataclass
class Batch:
    """One applied batch, as the executor sees it. Arrays are indexed by effective op."""

    first_seq: int
    end_seq: int  # one past the last sequence number the batch used
    edge_seq: np.ndarray  # edge ops (internal ids; sign +1 insert, -1 delete)
    edge_a: np.ndarray
    edge_b: np.ndarray
    edge_label: np.ndarray
    edge_sign: np.ndarray
    vertex_seq: np.ndarray  # vertex creations (+1) and removals (-1)
    vertex_id: np.ndarray
    vertex_sign: np.ndarray
    record_of: dict[int, Update] = field(default_factory=dict)  # seq -> the record it came from
    arrived: list[float] = field(default_factory=list)  # arrival time of each record (latency)
    records: int = 0


class GraphUpdater:
    def __init__(self, mvg: MultiVersionGraph, first_seq: int = 0):
        self.mvg = mvg
        self.next_seq = first_seq
        self.ignored: Counter = Counter()

    def _vertex(self, ext, label, seq, vertex_ops) -> int:
        v = self.mvg.index.get(ext)
        if v is None:
            v = self.mvg.add_vertex(ext, label)
            vertex_ops.append((seq, v, +1))
        return v

    def apply(self, records: list[Update], arrived: list[float] | None = None):
        """Apply records in order; returns (Batch, replaced versions for the GC)."""
        mvg = self.mvg
        first = self.next_seq
        edge_ops: list[tuple[int, int, int, int, int]] = []
        vertex_ops: list[tuple[int, int, int]] = []
        record_of: dict[int, Update] = {}
        # this batch's view of the latest edges, over what the MVG holds
        overlay: dict[tuple[int, int], int] = {}

        # one vectorized look-up for the pairs of every edge record whose vertices exist
        known = [(mvg.index[r.u], mvg.index[r.v]) for r in records
                 if r.op in (INSERT_EDGE, DELETE_EDGE) and r.u in mvg.index and r.v in mvg.index and r.u != r.v]
        if known:
            pa, pb = np.array(known, np.int64).T
            for x, y, lab in zip(pa.tolist(), pb.tolist(), mvg.live_edge_label(pa, pb).tolist()):
                overlay.setdefault((min(x, y), max(x, y)), lab)

        def live_label(a: int, b: int) -> int:
            key = (min(a, b), max(a, b))
            if key not in overlay:
                overlay[key] = int(mvg.live_edge_label(np.array([a]), np.array([b]))[0])
            return overlay[key]

        def edge(seq, a, b, sign, label):
            overlay[(min(a, b), max(a, b))] = label if sign > 0 else -1
            edge_ops.append((seq, a, b, label, sign))

        for rec in records:
            seq = self.next_seq
            self.next_seq += 1
            record_of[seq] = rec
            if rec.op == INSERT_EDGE:
                if rec.u == rec.v:
                    self.ignored["self_loop"] += 1
                    continue
                a = self._vertex(rec.u, 0, seq, vertex_ops)
                b = self._vertex(rec.v, 0, seq, vertex_ops)
                if live_label(a, b) >= 0:
                    self.ignored["duplicate_insert"] += 1
                else:
                    edge(seq, a, b, +1, rec.label)
            elif rec.op == DELETE_EDGE:
                a, b = mvg.index.get(rec.u), mvg.index.get(rec.v)
                label = -1 if a is None or b is None or a == b else live_label(a, b)
                if label < 0:
                    self.ignored["missing_delete"] += 1
                else:
                    edge(seq, a, b, -1, label)  # the stored edge's label: it is what vanishes
            elif rec.op == INSERT_VERTEX:
                if rec.u in mvg.index:
                    self.ignored["duplicate_vertex"] += 1
                else:
                    self._vertex(rec.u, rec.label, seq, vertex_ops)
            elif rec.op == DELETE_VERTEX:
                v = mvg.index.get(rec.u)
                if v is None:
                    self.ignored["missing_vertex"] += 1
                    continue
                live = set(int(x) for x in mvg.live_neighbors(v))
                live |= {b if a == v else a for (a, b), lab in overlay.items() if lab >= 0 and v in (a, b)}
                live -= {b if a == v else a for (a, b), lab in overlay.items() if lab < 0 and v in (a, b)}
                self.next_seq -= 1  # the edge deletions come first, each with its own number
                for w in sorted(live):
                    s = self.next_seq
                    self.next_seq += 1
                    record_of[s] = rec
                    edge(s, v, w, -1, live_label(v, w))
                seq = self.next_seq
                self.next_seq += 1
                record_of[seq] = rec
                vertex_ops.append((seq, v, -1))
                mvg.retire_vertex(v)
            else:  # parse_update only makes the four ops above
                raise AssertionError(rec.op)
        e = np.array(edge_ops, np.int64).reshape(-1, 5)
        vo = np.array(vertex_ops, np.int64).reshape(-1, 3)
        replaced = mvg.apply(e[:, 0], e[:, 1], e[:, 2], e[:, 3], e[:, 4])
        batch = Batch(first, self.next_seq, e[:, 0], e[:, 1], e[:, 2], e[:, 3], e[:, 4], vo[:, 0], vo[:, 1], vo[:, 2],
                      record_of, arrived if arrived is not None else [time.monotonic()] * len(records), len(records))
        return batch, replaced
