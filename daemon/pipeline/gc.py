"""The garbage collector (GC) of the continuous pipeline.

The GC graph has the updates as vertices and the replaced neighbor-array
versions as edges, from the update that created a version to the one that
replaced it. The GC pointer advances over the longest prefix of updates whose
matching has finished; a version whose replacing update the pointer has passed
can no longer be read (every read that could see it has finished), so it is
released to the memory pool.
"""

from __future__ import annotations

import heapq

from csmd.cpu.mvg import MultiVersionGraph


class GarbageCollector:
    def __init__(self, mvg: MultiVersionGraph, first_seq: int = 0):
        self.mvg = mvg
        self.pointer = first_seq  # every update before it has finished
        self._edges: list[tuple[int, int]] = []  # heap of (replaced_at, version)
        self._finished: list[tuple[int, int]] = []  # heap of finished [lo, hi) ranges past the pointer
        self.released = 0

    def replaced(self, versions) -> None:
        """The updater replaced these (version, replaced_at) pairs."""
        for vid, at in versions:
            heapq.heappush(self._edges, (at, vid))

    def finished(self, lo: int, hi: int) -> list[int]:
        """Updates lo..hi-1 finished matching; returns the versions to release (callers free them)."""
        heapq.heappush(self._finished, (lo, hi))
        while self._finished and self._finished[0][0] <= self.pointer:
            self.pointer = max(self.pointer, heapq.heappop(self._finished)[1])
        free = []
        while self._edges and self._edges[0][0] < self.pointer:
            free.append(heapq.heappop(self._edges)[1])
        self.released += len(free)
        return free
