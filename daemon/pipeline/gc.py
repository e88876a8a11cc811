"""The garbage collector (GC) of the continuous pipeline, shared by every engine.

The GC graph has the updates as vertices and the replaced neighbor-array
versions as edges, from the update that created a version to the one that
replaced it. The GC pointer advances over the longest prefix of updates whose
matching has finished; a version whose replacing update the pointer has passed
can no longer be read (every read that could see it has finished), so it is
handed back to the engine's memory. Versions are engine tokens: the GC only
orders them by the update that replaced them. A batch's versions stay together in one
entry, sorted by replaced_at, so the cost per batch is a few list operations in C
rather than a heap operation per version; a partly passed entry goes back with the rest.
`hold` keeps versions that later reads at older timestamps still need (a cluster's re-matches).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import threading
from operator import itemgetter


class GarbageCollector:
    def __init__(self, first_seq: int = 0):
        self.pointer = first_seq  # every update before it has finished
        self._hold = 1 << 62  # nothing is released that a read at this timestamp or later may need
        # heap of (first replaced_at, tie, position, replaced_at tuple, token tuple): one per batch;
        # the versions from `position` on are still held
        self._edges: list[tuple[int, int, int, tuple, tuple]] = []
        self._finished: list[tuple[int, int]] = []  # heap of finished [lo, hi) ranges past the pointer
        self._tie = itertools.count()
        self._lock = threading.Lock()  # replaced() runs in the updater stage, finished() after the executor
        self.released = 0

    def replaced(self, versions) -> None:
        """The updater replaced these (token, replaced_at) versions."""
        if not versions:
            return
        tokens, at = zip(*sorted(versions, key=itemgetter(1)))
        with self._lock:
            heapq.heappush(self._edges, (at[0], next(self._tie), 0, at, tokens))

    def hold(self, seq: int) -> None:
        """Keep what reads at `seq` or later need, even once every update before it has finished."""
        self._hold = seq

    def finished(self, lo: int, hi: int) -> list:
        """Updates lo..hi-1 finished matching; returns the tokens to release (callers release them)."""
        with self._lock:
            heapq.heappush(self._finished, (lo, hi))
            while self._finished and self._finished[0][0] <= self.pointer:
                self.pointer = max(self.pointer, heapq.heappop(self._finished)[1])
            free = []
            upto = min(self.pointer, self._hold)
            while self._edges and self._edges[0][0] < upto:
                _, tie, start, at, tokens = heapq.heappop(self._edges)
                end = bisect.bisect_left(at, upto, start)  # at[:end] < upto
                free.extend(tokens[start:end])
                if end < len(at):
                    heapq.heappush(self._edges, (at[end], tie, end, at, tokens))
            self.released += len(free)
            return free
