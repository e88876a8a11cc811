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
the watermark); edges without one never expire. The clock keys
edges by external ids, so a relabel (which gives a vertex a new internal id) keeps them.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
import pyarrow as pa


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


class Clock:
    """The watermark and the ts of every live edge a timed update wrote, by external ids."""

    def __init__(self, spec: EventTime, directed: bool = False):
        self.spec, self.directed = spec, directed
        self.high: int | None = None  # the largest ts applied
        self.ts: dict[tuple, int] = {}  # live edge -> its ts
        self._heap: list[tuple[int, tuple]] = []  # (ts, edge), with entries of edges since gone
        self.expired = 0

    def key(self, u, v) -> tuple:
        return (u, v) if self.directed or u <= v else (v, u)

    @property
    def watermark(self) -> int | None:
        return None if self.high is None else self.high - self.spec.lateness

    def _horizon(self) -> int | None:
        """Edges with a ts below this have left the window (None: none has)."""
        if self.spec.window is None or self.high is None:
            return None
        return self.high - self.spec.lateness - self.spec.window

    def late(self, ts: int) -> bool:
        h = self._horizon()
        return h is not None and ts < h

    def advance(self, ts: int) -> None:
        if self.high is None or ts > self.high:
            self.high = ts

    def write(self, key: tuple, ts: int) -> None:
        self.ts[key] = ts
        if self.spec.window is not None:
            heapq.heappush(self._heap, (ts, key))

    def seed(self, edge_ts, high: int | None = None) -> None:
        """The initial graph's event times (Graph.edge_ts: u, v, ts arrays; None: none; an edge
        given twice keeps its first, as the graph keeps the first of a repeated edge) and, for a
        checkpoint's graph, the largest ts applied before it (Graph.high_ts)."""
        self.high = high
        if edge_ts is None:
            return
        for u, v, ts in zip(*(c.tolist() for c in edge_ts)):
            key = self.key(u, v)
            if u != v and key not in self.ts:  # a self-loop is no edge (the graph dropped it)
                self.write(key, ts)

    def ts_of(self, vertices, a: np.ndarray, b: np.ndarray) -> pa.Array:
        """The ts of the live edges (a[i], b[i]) (internal ids; pipeline/sequencer.py Vertices),
        null where one has none: one sort and search, not a look-up per edge (a checkpoint
        takes every edge's)."""
        n = max(vertices.n, 1)
        keys = list(self.ts)
        u = vertices.lookup([k[0] for k in keys])
        v = vertices.lookup([k[1] for k in keys])
        have = self._pair_keys(u, v, n)
        order = np.argsort(have)
        have, ts = have[order], np.fromiter(self.ts.values(), np.int64, len(keys))[order]
        want = self._pair_keys(np.asarray(a, np.int64), np.asarray(b, np.int64), n)
        at = np.minimum(np.searchsorted(have, want), max(len(have) - 1, 0))
        found = have[at] == want if len(have) else np.zeros(len(want), bool)
        return pa.array(ts[at] if len(have) else np.zeros(len(want), np.int64), pa.int64(), mask=~found)

    def _pair_keys(self, a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
        """One int64 per edge: an arc's (a, b), an undirected pair's smaller id first."""
        if not self.directed:
            a, b = np.minimum(a, b), np.maximum(a, b)
        return a * n + b

    def forget(self, key: tuple) -> None:
        self.ts.pop(key, None)

    def due(self):
        """The edges that left the window, in (ts, u, v) order, each forgotten as it is yielded."""
        h = self._horizon()
        heap = self._heap
        while h is not None and heap and heap[0][0] < h:
            ts, key = heapq.heappop(heap)
            if self.ts.get(key) == ts:  # else gone or rewritten since: a stale entry
                del self.ts[key]
                self.expired += 1
                yield key, ts
