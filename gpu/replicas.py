"""Several GPUs behind one engine: a replica of the multi-version graph on each device, every
batch applied on all of them, and each batch's search split over them.

The host work of a batch (sequencing, its seeds, its deltas) is done once; what the devices
share is the search, below the seed: every device takes every seed (one side of an update
with one anchor's table), searches the prefixes above the last depth it enumerates as one
device would, and keeps its share of each prefix's candidates for that depth, a range of
neighbour ids cut at evenly spaced entries (matcher.cu deal_at), so that the work under a hub
is dealt out wherever it is met. On the LiveJournal-sized workload (4 H200s, bench/README.md)
tree_6 went 3.47x one GPU's speed that way, where dealing out each seed's depth-2 candidates
gave 1.19x (a hub among them took its whole subtree to one device). A seed of a query of
fewer than 4 vertices, or whose tail is counted at once from depth 2 (count_suffix_at), goes
to one device whole, seeds dealt out in turn: its work is one range or less. Ranges
of seeds handed out as devices finished were measured first and lost: every range's launch
ends in a tail where most of the device waits for a few warps, and the tails add up (the
yeast stream at batch 4096: 0.074 s on one H200, 0.118 s on two). A
search of fewer than SPLIT_SEEDS seeds stays on the first device unless, at its group's last
search's seconds a seed, it would take more than SPLIT_SECONDS: a part costs a launch, a
read-back and a hand-off to the device's thread, more than a small search gains. The parts'
counts add up seed by seed, and their rows come back as pieces, which the pipeline puts in
the canonical delta order as it does one device's: the deltas are the same bytes whatever
the split.

The replicas apply the same ops in the same order; the versions a batch replaced on all of
them are one entry of the GC (each replica's list), released together: a version's entries
are the same on every replica, which the shares of a range rest on. The latest-state reads
(the sequencer's) come from the first replica. CuPy's current device is per thread: every
call into a replica runs under its device, and each device but the first searches on a
thread of its own (the first on the executor's, which waits for the others).
"""

from __future__ import annotations

import time

import cupy as cp
import numpy as np

from csmd.engine import ContinuousEngine, ContinuousQuery, Done, EngineStats, UpdateBatch
from csmd.errors import CsmdError
from csmd.model.graph import Graph

from .engine import GpuEngine
from .launch import on_each_device

SPLIT_SEEDS = 2048  # a search of fewer seeds runs on the first device alone, unless at its group's
SPLIT_SECONDS = 0.002  # last search's seconds a seed they would take longer than this


def device_ids(gpus, setting: str = "--gpus") -> list[int]:
    """The devices `gpus` asks for: "all", or a count (the first that many); CsmdError naming
    `setting` when the machine has fewer."""
    have = cp.cuda.runtime.getDeviceCount()
    if gpus == "all":
        return list(range(have))
    if not isinstance(gpus, int) or gpus < 1:
        raise CsmdError(f"{setting} must be a positive number of GPUs or \"all\", got {gpus!r}")
    if gpus > have:
        raise CsmdError(f"{setting} {gpus}: this machine has {have} GPU{'s' * (have != 1)}")
    return list(range(gpus))


class _Prepared:
    """A registered query in every replica's form (one PreparedQuery each)."""

    def __init__(self, name: str, count_only: bool, per: list):
        self.name, self.count_only, self.per = name, count_only, per


class MultiGpuEngine(ContinuousEngine):
    """The continuous engine over several devices (see the module docstring). devices: CUDA
    device ids, the first one holding the replica the sequencer reads; a device may be named
    twice (two replicas on one device: what the tests do on a machine with one GPU)."""

    name = "gpu"

    def __init__(self, g0: Graph, devices: list[int], timed: bool = False):
        if len(devices) < 2:
            raise ValueError("MultiGpuEngine needs two devices or more (one: GpuEngine)")
        if not isinstance(g0, Graph):  # a DeviceGraph lives on one device: every replica would read its arrays
            raise TypeError("MultiGpuEngine takes a host Graph")
        self.devices = [cp.cuda.Device(d) for d in devices]
        self.replicas = []
        for dev in self.devices:
            with dev:
                self.replicas.append(GpuEngine(g0, timed=timed))
        self._ids = list(devices)
        self._last: tuple = (None, [])  # the last query list submitted, and each replica's list of it
        # the split searches' seconds: wall, their slowest device's and their devices' mean, summed
        # (slowest / mean: how unevenly the shares weighed; wall / slowest: the split's own cost)
        self.split_seconds = np.zeros(3)
        self._per_seed: dict[tuple, float] = {}  # (query list, group) -> seconds a seed its last search took

    # ---- storage: every replica ----------------------------------------------------------------
    def apply(self, batch: UpdateBatch):
        replaced = []
        for dev, r in zip(self.devices, self.replicas):
            with dev:
                replaced.append(r.apply(batch))
        if not any(replaced):
            return []
        # one token for the batch: each replica's (token, replaced_at) list, released when the last may be
        return [(tuple(replaced), max(at for versions in replaced for _t, at in versions))]

    def release(self, tokens) -> None:
        for i, (dev, r) in enumerate(zip(self.devices, self.replicas)):
            with dev:
                r.release([t for group in tokens for t, _at in group[i]])

    # ---- the latest state: the first replica -------------------------------------------------
    def live_edge_labels(self, a, b):
        with self.devices[0]:
            return self.replicas[0].live_edge_labels(a, b)

    def live_neighbors(self, v: int):
        with self.devices[0]:
            return self.replicas[0].live_neighbors(v)

    def live_edges(self):
        with self.devices[0]:
            return self.replicas[0].live_edges()

    # ---- matching ------------------------------------------------------------------------------
    def prepare(self, query: ContinuousQuery) -> _Prepared:
        per = []
        for dev, r in zip(self.devices, self.replicas):
            with dev:
                per.append(r.prepare(query))
        return _Prepared(query.name, query.count_only, per)

    def _per_replica(self, queries: list[_Prepared]) -> list[list]:
        """Each replica's list of the queries (the same list objects batch after batch, as the
        executors cache their groups by them)."""
        if queries is not self._last[0]:
            self._last = (queries, [[pq.per[i] for pq in queries] for i in range(len(self.replicas))])
        return self._last[1]

    def warm(self, queries: list[_Prepared]) -> None:
        for dev, r, mine in zip(self.devices, self.replicas, self._per_replica(queries)):
            with dev:
                r.warm(mine)

    def submit(self, batch: UpdateBatch, queries: list[_Prepared], select: np.ndarray | None = None) -> Done:
        per = self._per_replica(queries)
        for dev, r in zip(self.devices, self.replicas):
            with dev:
                r.await_apply(batch)
        first = self.replicas[0]

        def split(g, a, b, seq, tab, emit, ts, bits):
            return self._split(per, g, (a, b, seq, tab), emit, ts, bits)

        with self.devices[0]:
            return Done(first.executor.run(first.mvg, batch, per[0], first.labels, select, split))

    def _split(self, per, g: int, seeds: tuple, emit: bool, ts, bits: int):
        """Executor.searched's answer for the seeds of group g, searched in parts on every device
        where it is large: SPLIT_SEEDS seeds or more, or fewer that the group's last search says
        take longer than SPLIT_SECONDS on one device (a query alone has a few hundred seeds a
        batch of 4096 on the LiveJournal-sized stream, each of them heavy)."""
        S, N = len(seeds[2]), len(self.replicas)
        key = id(per[0]), g  # the group, while its query list is the one submitted (_per_replica keeps it)
        if key not in self._per_seed and len(self._per_seed) >= 64:  # query lists gone: their estimates too
            self._per_seed.clear()
        if S < SPLIT_SEEDS and S * self._per_seed.get(key, 0.0) < SPLIT_SECONDS:
            (counts, found, ready), sec = self._timed_part((0, 1), per, g, seeds, emit, ts, bits)
            self._per_seed[key] = sec / max(S, 1)
            return counts, found, ready
        t0 = time.perf_counter()
        parts = on_each_device(self._ids, lambda i: self._timed_part((i, N), per, g, seeds, emit, ts, bits))
        took = [sec for _, sec in parts]
        self.split_seconds += (time.perf_counter() - t0, max(took), sum(took) / N)
        self._per_seed[key] = sum(took) / max(S, 1)  # about one device's time
        counts = sum(c for (c, _, _), _ in parts)
        return counts, [x for (_, f, _), _ in parts for x in f], [x for (_, _, r), _ in parts for x in r]

    def _timed_part(self, split: tuple[int, int], *args):
        t = time.perf_counter()
        return self._part(split, *args), time.perf_counter() - t

    def _part(self, split: tuple[int, int], per, g: int, seeds: tuple, emit: bool, ts, bits: int):
        """Replica i's part (i, N) of the search (matcher.cu deal_at): Executor.searched's answer."""
        r = self.replicas[split[0]]
        return r.executor.searched(r.mvg, r.executor.groups(per[split[0]])[g][1], *seeds, emit, ts, bits, split)

    def stats(self) -> EngineStats:
        per = []
        for dev, r in zip(self.devices, self.replicas):
            with dev:
                per.append(r.stats())
        return EngineStats(per[0].live_versions, sum(s.memory_bytes for s in per))

    def close(self) -> None:
        for dev, r in zip(self.devices, self.replicas):
            with dev:
                r.close()
