"""Event time: the watermark, late updates and the edges that expire (the sequencer's clock).

With event time on ([graph] time = "event", `csmd replay --time event`), every edge update
carries a ts (int64, in whatever unit the deployment chooses). The watermark is the largest
ts of any edge update applied so far, less `lateness`. With a window W:

- an update whose ts < watermark - W when it arrives is late: ignored and counted (`late`),
  and it does not move the watermark;
- after each applied update, every live edge whose ts < watermark - W expires, in order of
  (ts, u, v) (external ids; an undirected edge's smaller id first): the sequencer deletes it
  as if a `-e` had arrived at that point of the stream, with a sequence number of its own,
  its deltas naming the record that moved the watermark (source "expired by ...").

Re-inserting a live edge with another ts replaces it: its deletion (the matches judged under
the old ts vanish), then its insertion under the new ts, each with its own sequence number.
Without a window nothing is late and nothing expires; the ts are still kept. Edges of the
initial graph carry the ts its file gives them (nothing expires before the first update sets
the watermark); edges without one never expire.

The clock keys edges by internal ids (pipeline/sequencer.py Vertices), packed into one int64,
and keeps them in arrays that compiled code reads and writes: the ts of every live edge in a
hash table (open addressing: one cache miss a look-up, where a numba typed dict takes two, on
a table of millions of edges), the edges in the window in a min-heap. A timed batch of edge
records is then sequenced in one compiled pass (pipeline/timed_edges.py), and the
record-by-record path reads the same state through small compiled calls. A relabel gives a vertex a new internal id:
its edges' ts move to it (Clock.rename); a restart seeds the clock from the checkpoint's
external ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from numba import njit

from csmd.model.formats import DELETE_EDGE, Update
from csmd.model.time_constraints import NO_TS

ID_BITS = 32  # an edge key is its first end's internal id << ID_BITS | its second's
ID_MASK = (1 << ID_BITS) - 1


@dataclass(frozen=True)
class EventTime:
    """The event-time settings: window (None: edges never expire) and lateness, in ts units."""

    window: int | None = None
    lateness: int = 0

    def __post_init__(self):
        if self.window is not None and (type(self.window) is not int or self.window <= 0):
            raise ValueError(f"event time: window must be an integer > 0 (or None), got {self.window!r}")
        if type(self.lateness) is not int or self.lateness < 0:
            raise ValueError(f"event time: lateness must be an integer >= 0, got {self.lateness!r}")


def edge_keys(a, b, directed: bool):
    """The clock's key of each edge (a[i], b[i]) (internal ids; numpy arrays or ints): an arc's
    (a, b), an undirected pair's smaller id first. pair_keys: the pair's key whatever the direction."""
    if not directed:
        return pair_keys(a, b)
    return (np.asarray(a, np.int64) << ID_BITS) | b


def pair_keys(a, b):
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    return (np.minimum(a, b) << ID_BITS) | np.maximum(a, b)


@njit(cache=True, nogil=True)
def edge_key(a, b, directed):
    """edge_keys of one edge, in compiled code."""
    if directed or a < b:
        return (a << ID_BITS) | b
    return (b << ID_BITS) | a


@njit(cache=True, nogil=True)
def key_ends(key, ext, directed):
    """The ends of the edge `key` in the order its expiry names them: an arc's, an undirected
    pair's by external id (ext: each internal id's), the smaller first."""
    a, b = key >> ID_BITS, key & ID_MASK
    if not directed and ext[b] < ext[a]:
        return b, a
    return a, b


@njit(cache=True, nogil=True)
def push(heap_ts, heap_key, n, ts, key):
    """Add (ts, key) to the min-heap by ts in heap_ts[:n], heap_key[:n] (room for one more); the new n."""
    i = n
    while i > 0:
        parent = (i - 1) >> 1
        if heap_ts[parent] <= ts:
            break
        heap_ts[i], heap_key[i] = heap_ts[parent], heap_key[parent]
        i = parent
    heap_ts[i], heap_key[i] = ts, key
    return n + 1


@njit(cache=True, nogil=True)
def _walk(heap_ts, heap_key, n, h, out):
    """How many of the heap's entries have a ts below h, their keys written to out as far as it
    has room: a walk that skips every subtree whose root has not (its stack holds a path's worth)."""
    stack = np.empty(64, np.int64)
    found, top = 0, 0
    if n and heap_ts[0] < h:
        stack[0], top = 0, 1
    while top:
        top -= 1
        i = stack[top]
        if found < len(out):
            out[found] = heap_key[i]
        found += 1
        for c in (2 * i + 1, 2 * i + 2):
            if c < n and heap_ts[c] < h:
                stack[top] = c
                top += 1
    return found


@njit(cache=True, nogil=True)
def below(heap_ts, heap_key, n, h):
    """The keys of the heap's entries with a ts below h."""
    out = np.empty(_walk(heap_ts, heap_key, n, h, np.empty(0, np.int64)), np.int64)
    _walk(heap_ts, heap_key, n, h, out)
    return out


@njit(cache=True, nogil=True)
def pop_below(heap_ts, heap_key, n, h, out_ts, out_keys):
    """Take the entries with a ts below h off the heap, in ts order, into out_ts and out_keys
    (room for them all): how many, and the new n."""
    m = 0
    while n and heap_ts[0] < h:
        out_ts[m], out_keys[m] = heap_ts[0], heap_key[0]
        m += 1
        n -= 1
        last_ts, last_key = heap_ts[n], heap_key[n]
        i = 0
        while True:  # the last entry sifts down from the root
            c = 2 * i + 1
            if c >= n:
                break
            if c + 1 < n and heap_ts[c + 1] < heap_ts[c]:
                c += 1
            if heap_ts[c] >= last_ts:
                break
            heap_ts[i], heap_key[i] = heap_ts[c], heap_key[c]
            i = c
        heap_ts[i], heap_key[i] = last_ts, last_key
    return m, n


@njit(cache=True, nogil=True)
def sort_due(ts, keys, ext, directed):
    """Put the entries that pop_below took (ts, keys) in the order they expire: by (ts, u, v),
    external ids."""
    if len(ts) < 2:
        return
    u, v = np.empty(len(ts), np.int64), np.empty(len(ts), np.int64)
    for j in range(len(ts)):
        a, b = key_ends(keys[j], ext, directed)
        u[j], v[j] = ext[a], ext[b]
    order = np.arange(len(ts))
    for col in (v, u, ts):  # stable sorts, least significant first
        order = order[np.argsort(col[order], kind="mergesort")]
    ts[:], keys[:] = ts[order], keys[order]


# The ts table: rows (key, ts), key EMPTY where free (keys are >= 0), linear probing, at most
# half full (Clock.reserve grows it), a deletion shifting back the rows after it (no tombstones)
EMPTY = -1
GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 (2^64 over the golden ratio) as an int64: Fibonacci hashing


@njit(cache=True, nogil=True)
def _home(key, mask):
    return (((key ^ (key >> 29)) * GOLDEN) >> 32) & mask  # (the product wraps: its middle bits are the hash)


@njit(cache=True, nogil=True)
def _slot(table, key):
    """The row of key, or the free row where it would go."""
    mask = len(table) - 1
    j = _home(key, mask)
    while table[j, 0] != key and table[j, 0] != EMPTY:
        j = (j + 1) & mask
    return j


@njit(cache=True, nogil=True)
def ts_get(table, key):
    """The edge's ts, NO_TS where the clock has none."""
    j = _slot(table, key)
    return table[j, 1] if table[j, 0] == key else NO_TS


@njit(cache=True, nogil=True)
def ts_holds(table, key, ts):
    """Does the clock hold the edge with this ts?"""
    j = _slot(table, key)
    return table[j, 0] == key and table[j, 1] == ts


@njit(cache=True, nogil=True)
def ts_put(table, size, key, ts):
    """Write the edge's ts (room for one more); the new size."""
    j = _slot(table, key)
    new = table[j, 0] == EMPTY
    table[j, 0], table[j, 1] = key, ts
    return size + 1 if new else size


@njit(cache=True, nogil=True)
def _free(table, j):
    """Empty row j, shifting back each later row of its run that may sit there."""
    mask = len(table) - 1
    while True:
        table[j, 0] = EMPTY
        k = j
        while True:
            k = (k + 1) & mask
            if table[k, 0] == EMPTY:
                return
            home = _home(table[k, 0], mask)
            if (k - home) & mask >= (k - j) & mask:  # row k's probe passed j: it moves there
                break
        table[j, 0], table[j, 1] = table[k, 0], table[k, 1]
        j = k


@njit(cache=True, nogil=True)
def ts_pop(table, size, key):
    """Forget the edge: its ts (NO_TS: none) and the new size."""
    j = _slot(table, key)
    if table[j, 0] != key:
        return NO_TS, size
    ts = table[j, 1]
    _free(table, j)
    return ts, size - 1


@njit(cache=True, nogil=True)
def ts_take(table, size, key, ts):
    """Forget the edge if the clock holds it with this ts (a heap entry not since gone or
    rewritten): whether it did, and the new size."""
    j = _slot(table, key)
    if table[j, 0] != key or table[j, 1] != ts:
        return False, size
    _free(table, j)
    return True, size - 1


@njit(cache=True, nogil=True)
def _rehash(table, rows):
    grown = np.full((rows, 2), EMPTY, np.int64)
    for j in range(len(table)):
        if table[j, 0] != EMPTY:
            ts_put(grown, 0, table[j, 0], table[j, 1])
    return grown


@njit(cache=True, nogil=True)
def _put_many(table, size, keys, ts):
    for j in range(len(keys)):
        size = ts_put(table, size, keys[j], ts[j])
    return size


@njit(cache=True, nogil=True)
def _ts_many(table, keys):
    ts = np.empty(len(keys), np.int64)
    for j in range(len(keys)):
        ts[j] = ts_get(table, keys[j])
    return ts


@njit(cache=True, nogil=True)
def _write(table, size, heap_ts, heap_key, n, key, ts, heaped):
    """ts_put and, under a window, the heap's entry: the new size and heap n."""
    return ts_put(table, size, key, ts), push(heap_ts, heap_key, n, ts, key) if heaped else n


def expiry(rec: Update, u, v, ts: int) -> Update:
    """The deletion of the edge (u, v) (external ids) that expired after rec, as its record."""
    return Update(DELETE_EDGE, u, v, 0, f"expired by {rec.source}", rec.origin, None, ts)


class Clock:
    """The watermark, the ts of every live edge a timed update wrote (by its key, edge_keys of
    internal ids) and the heap of the edges that may expire."""

    def __init__(self, spec: EventTime, directed: bool = False):
        self.spec, self.directed = spec, directed
        self.high: int | None = None  # the largest ts applied
        self.table, self.size = np.full((16, 2), EMPTY, np.int64), 0  # live edge -> its ts (ts_get)
        # under a window, (ts, key) of every ts written: a min-heap by ts in heap_ts[:heap_n] and
        # heap_key[:heap_n], with entries of edges since gone or rewritten (stale)
        self.heap_ts, self.heap_key, self.heap_n = np.empty(0, np.int64), np.empty(0, np.int64), 0
        self.expired = 0

    def key(self, a: int, b: int) -> int:
        return edge_key.py_func(a, b, self.directed)  # in Python: ints, no numpy call per record

    @property
    def watermark(self) -> int | None:
        return None if self.high is None else self.high - self.spec.lateness

    def horizon(self, high: int | None = None) -> int | None:
        """Edges with a ts below this have left the window (None: none has); high: the largest
        ts applied, if not the clock's."""
        high = self.high if high is None else high
        if self.spec.window is None or high is None:
            return None
        return high - self.spec.lateness - self.spec.window

    def late(self, ts: int) -> bool:
        h = self.horizon()
        return h is not None and ts < h

    def advance(self, ts: int) -> None:
        if self.high is None or ts > self.high:
            self.high = ts

    def get(self, key: int) -> int:
        """The edge's ts, NO_TS where the clock has none."""
        return ts_get(self.table, key)

    def holds(self, key: int, ts: int) -> bool:
        return ts_holds(self.table, key, ts)

    def write(self, key: int, ts: int) -> None:
        self.reserve(1)
        self.size, self.heap_n = _write(self.table, self.size, self.heap_ts, self.heap_key, self.heap_n, key, ts,
                                        self.spec.window is not None)

    def forget(self, key: int) -> None:
        self.size = ts_pop(self.table, self.size, key)[1]

    def rename(self, old: int, new: int) -> None:
        """The edge `old` is now `new` (a relabelled vertex's new internal id): its ts moves."""
        ts, self.size = ts_pop(self.table, self.size, old)
        if ts != NO_TS:
            self.write(new, ts)

    def reserve(self, k: int) -> None:
        """Room for k more edges, in the table and in the heap."""
        if 2 * (self.size + k) > len(self.table):
            self.table = _rehash(self.table, 1 << (3 * (self.size + k)).bit_length())
        if self.heap_n + k > len(self.heap_ts):
            size = max(2 * len(self.heap_ts), self.heap_n + k, 16)
            self.heap_ts, self.heap_key = (np.concatenate([x[: self.heap_n], np.empty(size - self.heap_n, np.int64)])
                                           for x in (self.heap_ts, self.heap_key))

    def below(self, h: int) -> np.ndarray:
        """The keys of the heap's entries with a ts below h: the edges that may expire before the
        horizon reaches h (stale entries too)."""
        return below(self.heap_ts, self.heap_key, self.heap_n, h)

    def due(self, ext_ids: list):
        """The edges that left the window, as (a, b, ts) (internal ids, a first in the expiry's
        (ts, u, v) order; ext_ids: every internal id's external one), each forgotten as it is yielded."""
        h = self.horizon()
        if h is None or not self.heap_n or self.heap_ts[0] >= h:
            return
        m = len(self.below(h))
        ts, keys = np.empty(m, np.int64), np.empty(m, np.int64)
        _, self.heap_n = pop_below(self.heap_ts, self.heap_key, self.heap_n, h, ts, keys)
        gone = [(t, *key_ends.py_func(k, ext_ids, self.directed), k) for t, k in zip(ts.tolist(), keys.tolist())]
        for t, a, b, key in sorted(gone, key=lambda e: (e[0], ext_ids[e[1]], ext_ids[e[2]])):
            taken, self.size = ts_take(self.table, self.size, key, t)
            if taken:
                self.expired += 1
                yield a, b, t

    def seed(self, vertices, edge_ts, high: int | None = None) -> None:
        """The initial graph's event times (Graph.edge_ts: u, v, ts arrays of external ids, which
        vertices maps; None: none; an edge given twice keeps its first, as the graph keeps the
        first of a repeated edge) and, for a checkpoint's graph, the largest ts applied before it
        (Graph.high_ts)."""
        self.high = high
        if edge_ts is None:
            return
        u, v, ts = edge_ts
        a, b = vertices.lookup(u), vertices.lookup(v)
        edge = (a >= 0) & (b >= 0) & (a != b)  # a self-loop is no edge (the graph dropped it)
        keys, first = np.unique(edge_keys(a[edge], b[edge], self.directed), return_index=True)
        ts = np.asarray(ts, np.int64)[edge][first]
        self.reserve(len(keys))
        self.size = _put_many(self.table, self.size, keys, ts)
        if self.spec.window is not None:  # sorted by ts: a heap
            order = np.argsort(ts, kind="stable")
            self.heap_ts, self.heap_key, self.heap_n = ts[order], keys[order], len(keys)

    def ts_of(self, a: np.ndarray, b: np.ndarray) -> pa.Array:
        """The ts of the live edges (a[i], b[i]) (internal ids, which the keys are made of), null
        where one has none."""
        ts = _ts_many(self.table, edge_keys(a, b, self.directed))
        return pa.array(ts, pa.int64(), mask=ts == NO_TS)
