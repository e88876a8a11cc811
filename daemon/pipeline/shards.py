"""Shards: the matching work split over the instances of a cluster, above the engine interface.

Every instance applies every update, so each holds the whole multi-version graph;
the matching is split. The matching of an input record, for every query, belongs
to shard `shard_of(partition, offset)`, and only the instance owning that shard
matches it. The unit is the record, not the update (the issue proposed
hash(seq, query)): a delta's id numbers the deltas of one record and query
(pipeline/deltas.py), so one instance must see all of a record's deltas; and
keeping every query of an update together keeps the engine's one search of all
registered queries per batch, where splitting by query would call the engine once
per shard and batch.

Each owned shard has a first offset: its committed progress when it was gained
(records below it were delivered by an earlier owner). A gain re-matches the
shard's records from that offset up to where the gain takes effect, from the
batches kept here, each update at its own timestamp; `hold_seq` is the oldest
update a re-match may still read, which the GC must not release versions for.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import fields

import numpy as np

from csmd.engine import UpdateBatch
from csmd.pipeline.sequencer import record_positions
from csmd.pipeline.stages import BatchResult, Marker, Pipeline

_ARRAYS = [f.name for f in fields(UpdateBatch) if f.name.startswith(("edge_", "vertex_"))]
_NEVER = np.iinfo(np.int64).max


def shard_of(partition, offset, shards: int) -> np.ndarray:
    """The shard of each record (input partition, offset): splitmix64 of (partition << 40) + offset,
    mod `shards`, so that neighbouring records spread over the shards."""
    x = (np.atleast_1d(np.asarray(partition, np.int64)) << 40) + np.atleast_1d(np.asarray(offset, np.int64))
    x = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return (x % np.uint64(shards)).astype(np.int64)


def _take(batch: UpdateBatch, edges: np.ndarray, vertices: np.ndarray) -> UpdateBatch:
    """The selected ops of an applied batch, to be matched (nothing in it is applied again)."""
    sel = {n: getattr(batch, n)[edges if n.startswith("edge_") else vertices] for n in _ARRAYS}
    return UpdateBatch(batch.first_seq, batch.end_seq, new_labels=batch.new_labels[:0],
                       first_vertex=batch.first_vertex, record_of=batch.record_of, **sel)


def _concat(parts: list[UpdateBatch]) -> UpdateBatch:
    record_of = {}
    for p in parts:
        record_of.update(p.record_of)
    return UpdateBatch(parts[0].first_seq, parts[-1].end_seq, new_labels=parts[0].new_labels[:0],
                       first_vertex=parts[0].first_vertex, record_of=record_of,
                       **{n: np.concatenate([getattr(p, n) for p in parts]) for n in _ARRAYS})


class _Kept:
    """An applied batch kept for re-matches, with the shard and offset of each op's record."""

    __slots__ = ("batch", "edge_key", "vertex_key", "last_offset")

    def __init__(self, batch: UpdateBatch, shards: int):
        self.batch = batch
        self.edge_key, self.vertex_key = (self._key(batch, seq, shards) for seq in (batch.edge_seq, batch.vertex_seq))
        offsets = record_positions(batch.record_of, np.arange(batch.first_seq, batch.end_seq))[1]
        self.last_offset = int(offsets.max()) if len(offsets) else -1

    @staticmethod
    def _key(batch, seq, shards):
        part, offset = record_positions(batch.record_of, seq)
        return shard_of(part, offset, shards), offset

    def part(self, owned: dict[int, int], shards: int) -> UpdateBatch:
        """The ops of records of `owned` shards (shard -> first offset) at or past their first offset."""
        first = np.full(shards, _NEVER, np.int64)
        for s, f in owned.items():
            first[s] = f
        mask = [offset >= first[shard] for shard, offset in (self.edge_key, self.vertex_key)]
        if all(m.all() for m in mask):
            return self.batch
        return _take(self.batch, *mask)


class ShardWork:
    """Which records this instance matches, and the batches a gained shard is re-matched from.

    The executor stage calls select, gain and lose (in stream order); the consume loop
    calls set_floor with the lowest committed progress of any shard (no re-match will
    start below it), which lets old batches go, also while the input is paused for
    want of room. `kept_from` is the oldest offset a re-match can start at: the
    instance's start position (its graph begins there), or the floor.
    """

    def __init__(self, shards: int, first_seq: int, start_offset: int):
        self.shards = shards
        self.owned: dict[int, int] = {}  # shard -> first offset this instance matches
        self.floor = start_offset
        self.kept_from = start_offset
        self.hold_seq = first_seq  # the GC keeps the versions updates from here on may read
        self.retained = 0  # updates in the kept batches
        self.kept_to = start_offset  # one past the last record kept
        self._kept: deque[_Kept] = deque()
        self._lock = threading.Lock()  # the executor stage keeps batches, the consume loop trims them

    def select(self, batch: UpdateBatch) -> UpdateBatch:
        """Keep the applied batch; the part of it this instance matches."""
        kept = _Kept(batch, self.shards)
        with self._lock:
            self._kept.append(kept)
            self.retained += batch.end_seq - batch.first_seq
            self.kept_to = max(self.kept_to, kept.last_offset + 1)
            self._trim()
        return kept.part(self.owned, self.shards)

    def set_floor(self, floor: int) -> None:
        with self._lock:
            self.floor = max(self.floor, floor)
            self._trim()

    def _trim(self) -> None:
        floor = self.floor
        while self._kept and self._kept[0].last_offset < floor:
            b = self._kept.popleft().batch
            self.retained -= b.end_seq - b.first_seq
            self.hold_seq = b.end_seq
        if self._kept:
            self.hold_seq = self._kept[0].batch.first_seq
        self.kept_from = max(self.kept_from, floor)

    def gain(self, gained: dict[int, int]) -> tuple[UpdateBatch | None, dict[int, int]]:
        """Own these shards (shard -> first offset) from here on. Returns the kept ops to re-match
        now (None if none) and the shards whose first offset is older than anything kept
        (shard -> the oldest offset kept): their records in between cannot be re-matched here."""
        with self._lock:
            gaps = {s: self.kept_from for s, f in gained.items() if f < self.kept_from}
            parts = [k.part(gained, self.shards) for k in self._kept]
        parts = [p for p in parts if len(p.edge_seq) or len(p.vertex_seq)]
        self.owned.update(gained)
        return (_concat(parts) if parts else None), gaps

    def lose(self, shards) -> None:
        for s in shards:
            self.owned.pop(s, None)


class ShardChange(Marker):
    """Shards gained (shard -> first offset) and lost, taking effect between two input records.

    At the executor, the gained shards' kept records from their first offsets up to
    here are matched (`result`, published like a batch's deltas); records after the
    marker are matched by the normal flow for the shards now owned."""

    def __init__(self, gain: dict[int, int], lose=()):
        self.gain, self.lose = dict(gain), set(lose)
        self.result: BatchResult | None = None
        self.gaps: dict[int, int] = {}
        self.rematched = 0  # updates re-matched

    def at_executor(self, pipe: Pipeline) -> None:
        work = pipe.shards
        work.lose(self.lose)
        if self.gain:
            batch, self.gaps = work.gain(self.gain)
            if batch is not None:
                self.rematched = len(batch.edge_seq) + len(batch.vertex_seq)
                self.result = BatchResult(batch, pipe.match_now(batch), time.monotonic())
