"""The engine interface: what the CPU and the GPU engine each implement, and the types they share.

Two kinds of work go through an engine:

- static matching (`StaticMatcher.match`): one query against a static graph, counts
  and optionally every match streamed to a sink;
- continuous matching (`ContinuousEngine`): the engine stores the multi-version graph
  (apply a sequenced batch, release versions the GC gives back), answers the latest
  state the sequencer needs, prepares registered queries from engine-neutral anchored
  orders, and matches batches asynchronously (submit now, results later).

What every engine shares is written once above this interface (daemon/pipeline):
sequence numbers and external ids, vertex-deletion expansion and ignored-update
counts (the sequencer), the GC graph and pointer, one-vertex queries, the canonical
delta order and delta ids, batching, backpressure and delivery. This module imports
no engine and no CuPy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np

from csmd.model.graph import Graph


@dataclass
class SearchResult:
    """The outcome of one static search."""

    count: int
    complete: bool
    seconds: float
    per_ts: np.ndarray | None = None  # matches per timestamp, index ts - ts_base (timestamped seeds)
    ts_base: int = 0


class StaticMatcher(ABC):
    """One-shot matching of query graphs against a static data graph."""

    name: str

    @abstractmethod
    def match(self, g: Graph, q: Graph, *, distinct: bool = False, limit=None, time_limit=None,
              sink=None) -> SearchResult:
        """Count q's matches in g; sink(rows), if given, receives every match as int32 rows in
        query-vertex order (internal ids). limit / time_limit (seconds, planning included) stop
        early with complete=False."""

    def match_many(self, g: Graph, queries: list[Graph], *, distinct: bool = False,
                   time_limit=None) -> list[SearchResult]:
        """Count several queries; an engine that searches them together overrides this (every
        query then has time_limit seconds from the start of the whole search)."""
        return [self.match(g, q, distinct=distinct, time_limit=time_limit) for q in queries]


@dataclass
class UpdateBatch:
    """One sequenced batch of updates, in internal vertex ids, as the engine applies and matches it.

    Edge ops are each valid where they stand (an insertion of an absent edge, a deletion of
    a present one, with the stored label), in update order; sign +1 inserts, -1 deletes. They
    are the updates as matched: in a directed graph an op is the arc a -> b and its label the
    code of its pair with the arc (as a sees it: model/direction.py). The multi-version graph
    then stores pairs, and `stored` holds the ops it applies (seq, a, b, label, sign): an arc
    added to or taken from a pair that keeps another is that pair's code replaced, a deletion
    and an insertion with one timestamp.
    """

    first_seq: int
    end_seq: int  # one past the last sequence number the batch used
    edge_seq: np.ndarray  # int64
    edge_a: np.ndarray
    edge_b: np.ndarray
    edge_label: np.ndarray
    edge_sign: np.ndarray
    vertex_seq: np.ndarray  # vertex creations (+1) and removals (-1)
    vertex_id: np.ndarray
    vertex_sign: np.ndarray
    new_labels: np.ndarray  # labels of the vertices this batch created, ids first_vertex, first_vertex+1, ...
    first_vertex: int
    record_of: dict = field(default_factory=dict)  # seq -> the record it came from
    arrived: np.ndarray = field(default_factory=lambda: np.zeros(0))  # arrival time of each update (latency)
    records: int = 0
    stored: tuple | None = None  # the ops the multi-version graph applies, where they differ from the edge ops
    # under event time (None: off), per edge op the ts of its arcs a -> b and b -> a (undirected:
    # the edge's twice; model/time_constraints.py NO_TS: none), as the pair holds them after an
    # insertion and before a deletion; stored_ts the same for the stored ops
    edge_ts: np.ndarray | None = None  # int64 (ops, 2)
    stored_ts: np.ndarray | None = None

    def storage_ops(self) -> tuple:
        """(seq, a, b, label, sign) of the ops the multi-version graph applies."""
        if self.stored is not None:
            return self.stored
        return self.edge_seq, self.edge_a, self.edge_b, self.edge_label, self.edge_sign

    def storage_ts(self) -> np.ndarray | None:
        """The (a -> b, b -> a) ts of each op storage_ops gives (None: event time is off)."""
        return self.stored_ts if self.stored is not None else self.edge_ts

    def take(self, edges: np.ndarray, vertices: np.ndarray) -> "UpdateBatch":
        """The ops selected by the masks or positions, to be matched (nothing in it is applied again)."""
        return UpdateBatch(self.first_seq, self.end_seq, self.edge_seq[edges], self.edge_a[edges],
                           self.edge_b[edges], self.edge_label[edges], self.edge_sign[edges],
                           self.vertex_seq[vertices], self.vertex_id[vertices], self.vertex_sign[vertices],
                           self.new_labels[:0], self.first_vertex, self.record_of,
                           edge_ts=None if self.edge_ts is None else self.edge_ts[edges])


@dataclass
class Anchor:
    """Incremental matching from one query edge (x, y) with edge label el: the data edge of an
    update is mapped onto it in both orientations, then the search follows `order` (x, y first)."""

    x: int
    y: int
    el: int
    order: list[int]


@dataclass
class ContinuousQuery:
    """A registered query, engine-neutral: one anchor per query edge. A distinct query has its
    symmetry-breaking constraints in sym, (x, y) meaning f(x) < f(y) in internal ids, checked at
    every anchor (the seed's two vertices included): of the embeddings of one subgraph instance
    that contain an update's edge, the one that satisfies them is its delta."""

    name: str
    q: Graph
    count_only: bool
    anchors: list[Anchor]
    sym: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class Matches:
    """One query's matches for one batch, as an engine returns them (any order).

    With rows (every match, int32, query-vertex order) seq gives each row's update;
    count-only, seq lists updates and counts their numbers of matches. Under event time, ts
    holds each row's smallest and largest edge ts (int64 (rows, 2); NO_TS where it has none).
    ordered: the rows are in the canonical order already (the GPU engine sorts large drains)."""

    seq: np.ndarray
    rows: np.ndarray | None = None
    counts: np.ndarray | None = None
    ts: np.ndarray | None = None
    ordered: bool = False


@dataclass
class QueryDeltas:
    """One query's deltas for one batch, in the canonical order. rows is None when count-only."""

    name: str
    seq: np.ndarray  # per delta (or per update with a non-zero count when count-only)
    sign: np.ndarray
    rows: np.ndarray | None  # matches (internal ids, query-vertex order)
    positive: int
    negative: int
    counts: np.ndarray | None = None  # count-only: matches per entry of seq
    # each row's (ts_min, ts_max) as Matches.ts gave them, in the rows' order (int64 (rows, 2),
    # NO_TS where the match has none); None: no ts (event time off, count-only, or the engine keeps none)
    ts: np.ndarray | None = None


@dataclass
class EngineStats:
    live_versions: int  # neighbour-array versions held
    memory_bytes: int  # device memory held (0 on the CPU engine)


class Pending(ABC):
    """A submitted batch whose matches may not be ready yet."""

    @abstractmethod
    def result(self) -> dict[str, Matches]:
        """Wait for the batch; its matches by query name (queries without matches may be absent)."""


class Done(Pending):
    """A batch matched at submission (a synchronous engine)."""

    def __init__(self, matches: dict[str, Matches]):
        self._matches = matches

    def result(self) -> dict[str, Matches]:
        return self._matches


class ContinuousEngine(ABC):
    """The multi-version graph and the executor of one engine.

    Threads: `apply` (and the latest-state reads) run in the graph-updater stage, `submit`
    and `result` in the executor stage, `release` in the output stage. An engine must let
    batch k+1 be applied while batch k is matched (the version rules make reads at batch
    k's timestamps unaffected by later batches); whatever else must not overlap (a
    compaction, say) the engine excludes itself.
    """

    name: str

    # ---- storage ---------------------------------------------------------------------------
    @abstractmethod
    def apply(self, batch: UpdateBatch) -> list[tuple[object, int]]:
        """Add the batch's new vertices and apply its edge ops. Returns the replaced versions as
        (token, replaced_at) for the GC graph: a token may be released once every update
        up to replaced_at has finished matching."""

    @abstractmethod
    def release(self, tokens: list) -> None:
        """Return replaced versions to the engine's memory (the GC decided nothing reads them)."""

    # ---- the latest state (for the sequencer, in the updater stage) -------------------------------
    @abstractmethod
    def live_edge_labels(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Label of the live edge {a[i], b[i]}, -1 where there is none."""

    @abstractmethod
    def live_neighbors(self, v: int) -> np.ndarray:
        """The live neighbours of v (for a vertex deletion)."""

    @abstractmethod
    def live_edges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(src, dst, label) of every live edge, src < dst: a consistent copy when called between
        two applied batches (snapshots, checkpoints)."""

    # ---- matching ---------------------------------------------------------------------------
    @abstractmethod
    def prepare(self, query: ContinuousQuery) -> object:
        """The engine's form of a registered query (passed back to submit)."""

    @abstractmethod
    def submit(self, batch: UpdateBatch, queries: list, select: np.ndarray | None = None) -> Pending:
        """Match every edge update of an applied batch at its own timestamp for the prepared
        queries (of at least two vertices); the result may finish later. select: None (every
        query matches every edge op), or bool (len(queries), len(batch.edge_seq)): query i
        matches op j only where select[i, j] (a cluster instance's share, pipeline/shards.py:
        one search for the batch whichever queries' shards it owns)."""

    def warm(self, queries: list) -> None:
        """Build now what the first submit of these prepared queries would build on first use
        (their joined tables, the threads), so that a stream's first batch does not pay for it."""

    @abstractmethod
    def stats(self) -> EngineStats:
        ...

    def close(self) -> None:
        """Release what the engine holds (device memory)."""
