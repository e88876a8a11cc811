"""Shards: the matching work split over the instances of a cluster, above the engine interface.

Every instance applies every update, so each holds the whole multi-version graph;
the matching is split. The matching of an input record for one query belongs to
shard `shard_of(partition, offset, shards, query)`, and only the instance owning
that shard matches it. The unit is (record, query), as the issue proposed with
hash(seq, query), but by record rather than update: a delta's id numbers the deltas
of one record and query (pipeline/deltas.py), so one instance must see all of
them. Splitting a record's queries over the shards spreads the records that
carry much of a stream's matching (on the yeast stream, bench/shard_balance.py:
a 4-instance bound of 3.61x, against 3.40x by record alone).

The shard is the record's hash shifted by the query's (a stable hash of its name, so a
query keeps its shards across restarts). A batch costs the engine one search: the ops
that some query's shards own, with a (query, op) selection the engine skips the rest
by (the engine interface's `select`). One search per distinct selection had cost each
instance of a 4-instance cluster up to 12 searches a batch, a millisecond each of
per-search work (seeding, plans, results) whatever its size: the human stream's match
time did not fall with the share.

Each owned shard has a first offset: its committed progress when it was gained
(records below it were delivered by an earlier owner). A gain re-matches the
shard's records from that offset up to where the gain takes effect, from the
batches kept here, each update at its own timestamp; `hold_seq` is the oldest
update a re-match may still read, which the GC must not release versions for.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections import deque
from dataclasses import fields

import numpy as np

from csmd.engine import UpdateBatch
from csmd.pipeline.sequencer import record_positions
from csmd.pipeline.stages import BatchResult, Marker, Part, Pipeline

_ARRAYS = [f.name for f in fields(UpdateBatch) if f.name.startswith(("edge_", "vertex_"))]
_NEVER = np.iinfo(np.int64).max


def record_hash(partition, offset, shards: int) -> np.ndarray:
    """Splitmix64 of (partition << 40) + offset, mod `shards`: neighbouring records spread over the shards."""
    x = (np.atleast_1d(np.asarray(partition, np.int64)) << 40) + np.atleast_1d(np.asarray(offset, np.int64))
    x = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return (x % np.uint64(shards)).astype(np.int64)


def query_shift(query: str, shards: int) -> int:
    """Where a query's shards start: CRC-32 of its name (the same in every process and run)."""
    return zlib.crc32(query.encode()) % shards


def shard_of(partition, offset, shards: int, query: str) -> np.ndarray:
    """The shard of each record (input partition, offset) for `query`."""
    return (record_hash(partition, offset, shards) + query_shift(query, shards)) % shards


def _concat(parts: list[UpdateBatch], record_of: dict) -> UpdateBatch:
    return UpdateBatch(parts[0].first_seq, parts[-1].end_seq, new_labels=parts[0].new_labels[:0],
                       first_vertex=parts[0].first_vertex, record_of=record_of,
                       **{n: None if getattr(parts[0], n) is None else np.concatenate([getattr(p, n) for p in parts])
                          for n in _ARRAYS})  # edge_ts: None without event time


class _Kept:
    """An applied batch kept for re-matches, with the hash and offset of each op's record."""

    __slots__ = ("batch", "edge_key", "vertex_key", "last_offset")

    def __init__(self, batch: UpdateBatch, shards: int):
        self.batch = batch
        self.edge_key, self.vertex_key = (self._key(batch, seq, shards) for seq in (batch.edge_seq, batch.vertex_seq))
        offsets = record_positions(batch.record_of, np.arange(batch.first_seq, batch.end_seq))[1]
        self.last_offset = int(offsets.max()) if len(offsets) else -1

    @staticmethod
    def _key(batch, seq, shards):
        part, offset = record_positions(batch.record_of, seq)
        return record_hash(part, offset, shards), offset

    def masks(self, first: np.ndarray, shifts: np.ndarray) -> list[np.ndarray]:
        """Which edge and vertex ops (columns) the queries of each shift (rows) match: those of
        records whose shard has a first offset (first[shard]; never where not owned) at or below
        the record's."""
        return [offset >= first[(h + shifts[:, None]) % len(first)] for h, offset in (self.edge_key, self.vertex_key)]


class ShardWork:
    """Which (record, query) pairs this instance matches, and the batches a gained shard is re-matched from.

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
        self._shifts: dict[str, int] = {}

    def select(self, batch: UpdateBatch, registered: list) -> Part | None:
        """Keep the applied batch; the part of it this instance matches (None if nothing), its queries
        `registered` ((ContinuousQuery, prepared) pairs) with their selections."""
        kept = _Kept(batch, self.shards)
        with self._lock:
            self._kept.append(kept)
            self.retained += batch.end_seq - batch.first_seq
            self.kept_to = max(self.kept_to, kept.last_offset + 1)
            self._trim()
        return self._part([kept], self.owned, registered, batch.record_of)

    def _part(self, kept: list[_Kept], owned: dict[int, int], registered: list, record_of: dict) -> Part | None:
        """The kept batches' ops that some query matches for the `owned` shards (shard -> first
        offset), with each query's selection of them (None if no op is selected): one search
        whichever shards the queries' shifts select."""
        first = np.full(self.shards, _NEVER, np.int64)
        for s, f in owned.items():
            first[s] = f
        for item in registered:
            name = item[0].name
            if name not in self._shifts:
                self._shifts[name] = query_shift(name, self.shards)
        shifts, row = np.unique(np.array([self._shifts[q.name] for q, _pq in registered], np.int64),
                                return_inverse=True)  # the selection is the same for a shift's queries
        works, edges, vertices = [], [], []
        for k in kept:
            e, v = k.masks(first, shifts)
            some_e, some_v = e.any(axis=0), v.any(axis=0)
            if some_e.all() and some_v.all():
                works.append(k.batch)
            elif some_e.any() or some_v.any():
                works.append(k.batch.take(some_e, some_v))
                e, v = e[:, some_e], v[:, some_v]
            else:
                continue
            edges.append(e)
            vertices.append(v)
        if not works:
            return None
        work = works[0] if len(works) == 1 else _concat(works, record_of)
        e, v = (x[0] if len(x) == 1 else np.concatenate(x, axis=1) for x in (edges, vertices))
        if e.all() and v.all():  # an owner of every shard: no selection, as without a cluster
            return Part(work, registered)
        return Part(work, registered, e[row.reshape(-1)], v[row.reshape(-1)])

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

    def gain(self, gained: dict[int, int], registered: list) -> tuple[UpdateBatch | None, Part | None, dict[int, int]]:
        """Own these shards (shard -> first offset) from here on. Returns the kept ops to re-match
        now, as a batch that knows every op's record and their part (as select's; both None if
        there are none), and the shards whose first offset is older than anything kept (shard ->
        the oldest offset kept): their records in between cannot be re-matched here."""
        with self._lock:
            gaps = {s: self.kept_from for s, f in gained.items() if f < self.kept_from}
            kept = list(self._kept)
        self.owned.update(gained)
        record_of = {}
        for k in kept:
            record_of.update(k.batch.record_of)
        part = self._part(kept, gained, registered, record_of) if kept else None
        if part is None:
            return None, None, gaps
        none = np.zeros(0, np.int64)
        knows = kept[0].batch.take(none, none)  # no ops: what a re-match's result needs is record_of
        knows.record_of = record_of
        return knows, part, gaps

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
            batch, part, self.gaps = work.gain(self.gain, pipe.registered().pairs)
            if batch is not None:
                self.rematched = len(np.unique(np.concatenate([part.work.edge_seq, part.work.vertex_seq])))
                self.result = BatchResult(batch, pipe.match_now(part), time.monotonic(), follows=False)
