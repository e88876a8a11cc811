"""A timed batch of edge records, sequenced in one compiled pass (the sequencer's common batch under event time).

Under event time every record's outcome depends on the clock as the records before it left it
(the watermark, late records, replaced and expired edges: pipeline/event_time.py), so the
batch is a sequential walk, as Sequencer._general's record by record; here it runs in numba
over the clock's own state (its ts table and heap) and over the labels of every vertex pair
the batch can touch, which the sequencer fetches from the engine in one call beforehand: the
pairs of its records and those of the heap's entries that may expire before its last record.
What it returns is what _general would make of the same records: the same ops in the same
order (a replaced edge's deletion and insertion, each expiry right after the record that moved
the watermark), their arcs' ts, the same outcome per record.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from numba import njit

from csmd.model.direction import HALF, HALF_MASK, MAX_DIRECTED_LABEL, PRESENT
from csmd.model.time_constraints import NO_TS
from csmd.pipeline.event_time import (edge_key, expiry, key_ends, pop_below, push, sort_due, ts_get, ts_holds,
                                      ts_pop, ts_put, ts_take)

# a record's outcome: applied, or why it changed nothing (Sequencer names them: TIMED_OUTCOMES)
APPLIED, SELF_LOOP, DUPLICATE_INSERT, MISSING_DELETE, LABEL_RANGE, LATE = -1, 0, 1, 2, 3, 4
FIELDS = 7  # an op's row: seq, a, b, label, sign, and its arcs' ts (a -> b, b -> a)


def flip_code(c):
    """model/direction.py flip of one code (a Python step per record pays numpy's cost per call)."""
    return ((c & HALF_MASK) << HALF) | (c >> HALF)


_flip = njit(cache=True, nogil=True)(flip_code)


@njit(cache=True, nogil=True)
def _as_seen(code, a, b, directed):
    """A pair's label (its code as the smaller id sees it) as a sees it."""
    return _flip(code) if directed and code >= 0 and a > b else code


@njit(cache=True, nogil=True)
def _put(out, k, seq, a, b, label, sign, ts, back):
    out[0, k], out[1, k], out[2, k], out[3, k], out[4, k], out[5, k], out[6, k] = seq, a, b, label, sign, ts, back


@njit(cache=True, nogil=True)
def _edge(ops, k, stored, ks, labels, slot, seq, a, b, sign, label, ts, back, directed):
    """Sequencer._general's edge(): the update (a, b) with its label (a deletion's: the stored
    edge's) and its arcs' ts; labels[slot] (the pair's overlay) follows. The new op counts."""
    if not directed:
        labels[slot] = label if sign > 0 else -1
        _put(ops, k, seq, a, b, label, sign, ts, back)
        return k + 1, ks
    old = _as_seen(labels[slot], a, b, True)
    kept = 0 if old < 0 else old & ~HALF_MASK  # the pair's other arc
    new = kept | PRESENT | label if sign > 0 else kept
    labels[slot] = -1 if new == 0 else new if a < b else _flip(new)
    _put(ops, k, seq, a, b, new if sign > 0 else old, sign, ts, back)
    if old >= 0:
        _put(stored, ks, seq, a, b, old, -1, ts, back)
        ks += 1
    if new:
        _put(stored, ks, seq, a, b, new, 1, ts if sign > 0 else NO_TS, back)
        ks += 1
    return k + 1, ks


@njit(cache=True, nogil=True)
def sequence_edges(insert, a, b, label, ts, same, first_seq, directed, window, lateness, high, has_high,
                   table, size, heap_ts, heap_key, heap_n, ext, pairs, labels, most_due):
    """Sequence the edge records (insert or delete; a, b: internal ids, -1 unknown, which only a
    deletion, a self-loop or a label out of range may name; same: u == v; ts each) from first_seq.

    window: -1 for none. table, size, heap_*: the clock's (pipeline/event_time.py), updated in
    place (with room for an edge per insertion). ext: the external id of every internal id.
    pairs: sorted pair keys of every pair the batch may touch, labels: the engine's label of each
    (directed: the code as the smaller id sees it; -1 none), the batch's overlay from then on.
    most_due: a bound on the heap entries the batch may take off (those below its last
    horizon now, plus one per insertion), and so on its expiries.

    Returns the ops and the stored ops (FIELDS rows each), each record's outcome, per sequence
    number its record (owner) and its expiry (an index into gone: a, b, ts; -1 none), and the
    clock's size, heap_n, high, has_high and the count of expired edges."""
    n = len(insert)
    cap = 2 * n + most_due
    ops = np.empty((FIELDS, cap), np.int64)
    stored = np.empty((FIELDS, 2 * cap if directed else 0), np.int64)
    outcome = np.full(n, APPLIED, np.int8)
    owner, expiry_of = np.empty(cap, np.int64), np.full(cap, -1, np.int64)
    gone = np.empty((3, most_due), np.int64)
    due_ts, due_keys = np.empty(most_due, np.int64), np.empty(most_due, np.int64)  # each pass's
    k = ks = x = 0
    seq = first_seq
    for i in range(n):
        s = seq
        owner[s - first_seq] = i
        seq += 1
        t = ts[i]
        if window >= 0 and has_high and t < high - lateness - window:
            outcome[i] = LATE
            continue
        if not has_high or t > high:
            high, has_high = t, True
        u, v = a[i], b[i]
        if insert[i] and same[i]:
            outcome[i] = SELF_LOOP
        elif insert[i] and directed and label[i] > MAX_DIRECTED_LABEL:
            outcome[i] = LABEL_RANGE
        elif not insert[i] and (u < 0 or v < 0 or same[i]):
            outcome[i] = MISSING_DELETE
        else:
            key = edge_key(u, v, directed)
            slot = np.searchsorted(pairs, edge_key(u, v, False))
            code = _as_seen(labels[slot], u, v, directed)
            present = code >= 0 and (not directed or (code & PRESENT) != 0)
            back = ts_get(table, edge_key(v, u, True)) if directed else t  # the pair's other arc
            if insert[i]:
                if not present:
                    k, ks = _edge(ops, k, stored, ks, labels, slot, s, u, v, 1, label[i], t, back, directed)
                elif ts_holds(table, key, t):
                    outcome[i] = DUPLICATE_INSERT
                else:  # a new ts replaces the edge: it goes, then comes back under its new ts
                    was = ts_get(table, key)
                    k, ks = _edge(ops, k, stored, ks, labels, slot, s, u, v, -1, code, was,
                                  back if directed else was, directed)
                    owner[seq - first_seq] = i
                    k, ks = _edge(ops, k, stored, ks, labels, slot, seq, u, v, 1, label[i], t, back, directed)
                    seq += 1
                size = ts_put(table, size, key, t)
                if window >= 0:
                    heap_n = push(heap_ts, heap_key, heap_n, t, key)
            elif not present:
                outcome[i] = MISSING_DELETE
            else:
                was, size = ts_pop(table, size, key)
                k, ks = _edge(ops, k, stored, ks, labels, slot, s, u, v, -1, code, was, back if directed else was,
                              directed)
        if window < 0 or not heap_n or heap_ts[0] >= high - lateness - window:
            continue
        m, heap_n = pop_below(heap_ts, heap_key, heap_n, high - lateness - window, due_ts, due_keys)
        sort_due(due_ts[:m], due_keys[:m], ext, directed)
        for j in range(m):
            taken, size = ts_take(table, size, due_keys[j], due_ts[j])
            if not taken:
                continue  # a stale entry: the edge is gone or has another ts
            u, v = key_ends(due_keys[j], ext, directed)
            slot = np.searchsorted(pairs, edge_key(u, v, False))
            back = ts_get(table, edge_key(v, u, True)) if directed else due_ts[j]
            k, ks = _edge(ops, k, stored, ks, labels, slot, seq, u, v, -1, _as_seen(labels[slot], u, v, directed),
                          due_ts[j], back, directed)
            owner[seq - first_seq], expiry_of[seq - first_seq] = i, x
            gone[0, x], gone[1, x], gone[2, x] = u, v, due_ts[j]
            x += 1
            seq += 1
    m = seq - first_seq
    return ops[:, :k], stored[:, :ks], outcome, owner[:m], expiry_of[:m], gone[:, :x], size, heap_n, high, has_high, x


class TimedRecords(Mapping):
    """record_of of a batch that sequence_edges made: seq -> its record, or for an expiry the
    Update of its deletion (event_time.expiry), made when asked for (most never are)."""

    def __init__(self, records: list, first: int, owner: np.ndarray, expiry_of: np.ndarray, gone: np.ndarray,
                 ext_ids: list):
        self.records, self.first, self.owner, self.expiry_of, self.gone, self.ext_ids = \
            records, first, owner, expiry_of, gone, ext_ids

    def __getitem__(self, seq: int):
        i = seq - self.first
        if not 0 <= i < len(self.owner):
            raise KeyError(seq)
        rec, j = self.records[self.owner[i]], self.expiry_of[i]
        if j < 0:
            return rec
        a, b, ts = self.gone[:, j].tolist()
        return expiry(rec, self.ext_ids[a], self.ext_ids[b], ts)

    def __len__(self) -> int:
        return len(self.owner)

    def __iter__(self):
        return iter(range(self.first, self.first + len(self.owner)))
