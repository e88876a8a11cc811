"""The sequencer: the host side of the graph updater (GU), shared by every engine.

Every record gets the next sequence number on arrival (its timestamp T). External
vertex ids map to dense internal ids (the vertex table); a vertex deletion expands
into one edge deletion per live edge, each with its own sequence number, then the
vertex's removal. A vertex record naming a live vertex with another label relabels
it: the deletion above, the vertex added again under its new label (a new internal
id, the same external one), and its edges inserted again with their labels, each an
update of its own: the matches holding the vertex vanish and those its new label
makes appear, as the deltas of that record. Records that change nothing (inserting an edge that exists,
deleting one that does not, adding a vertex that exists with the same label, self-loops) keep their
sequence number, produce no delta and are counted in `ignored`. What the engine gets
is an UpdateBatch of valid ops in internal ids; it applies them to its multi-version
graph.

In a directed graph an edge record names an arc: u -> v and v -> u are two edges of one
vertex pair, which the engines store as one entry labelled with the code of the pair's arcs
(model/direction.py). An arc added to or taken from a pair that keeps the other replaces
the pair's code: the batch's edge op is the arc (matched), its stored ops the replacement.

With event time (pipeline/event_time.py) the sequencer also keeps the clock: a late update is
ignored (`late`), a live edge re-inserted with another ts is deleted then inserted, and after
each update the edges that left the window are deleted, each an update of its own whose record
is the one that moved the watermark. A batch of timed edge records between existing vertices
goes through one compiled pass (pipeline/timed_edges.py), any other record by record.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from itertools import repeat
from operator import attrgetter
from typing import NamedTuple

import numpy as np

from csmd.engine import ContinuousEngine, UpdateBatch
from csmd.model.direction import HALF, HALF_MASK, MAX_DIRECTED_LABEL, PRESENT, flip
from csmd.model.formats import (DELETE_EDGE, DELETE_VERTEX, EDGE_OPS, INSERT_EDGE, INSERT_VERTEX, OPS, Update,
                                UpdateBlock)
from csmd.model.graph import Graph, scalar
from csmd.model.time_constraints import NO_TS
from csmd.pipeline import timed_edges
from csmd.pipeline.event_time import ID_BITS, ID_MASK, Clock, EventTime, expiry, pair_keys
from csmd.pipeline.timed_edges import flip_code

FIRST_WINDOW, MAX_WINDOW = 1 << 11, 1 << 16  # block rows checked ahead: at first, at most
# integer external ids below TABLE_SPAN times the vertex count plus TABLE_MIN are looked up
# in an array (Vertices.table), sparser ones in the dict alone
TABLE_SPAN, TABLE_MIN = 4, 1 << 16
FEW_RECORDS = 16  # batches of Updates up to this size are sequenced record by record (about half the time)
# why an update changed nothing: the keys of Sequencer.ignored (the daemon's metric shows each from the start)
# (edge_label_range: a directed graph's edge label past MAX_DIRECTED_LABEL, which its pair codes cannot hold;
# late: under event time, a ts below the watermark less the window)
IGNORED_REASONS = (SELF_LOOP, DUPLICATE_INSERT, MISSING_DELETE, DUPLICATE_VERTEX, MISSING_VERTEX, LABEL_RANGE, LATE) = (
    "self_loop", "duplicate_insert", "missing_delete", "duplicate_vertex", "missing_vertex", "edge_label_range",
    "late")
TIMED_OUTCOMES = (SELF_LOOP, DUPLICATE_INSERT, MISSING_DELETE, LABEL_RANGE, LATE)  # timed_edges' codes 0, 1, ...


class Vertices:
    """External ids, labels and liveness of every vertex, by internal id. A deleted vertex
    keeps its internal id (retired, without a name): a later record naming it creates a new
    vertex."""

    def __init__(self, g: Graph, retired: np.ndarray | None = None):
        self.ext_ids: list = [scalar(x) for x in g.ext_ids]
        self.str_ids = g.str_ids  # the kind of every id, also while there is none (an empty string-keyed graph)
        self._labels = np.array(g.labels, np.int32)
        # integer ids also as an array, for compiled code (None: string ids)
        self._ext = None if self.str_ids else np.array(self.ext_ids, np.int64)
        self.n = len(self.ext_ids)
        self.index: dict = {x: i for i, x in enumerate(self.ext_ids)}
        # the index's integer ids in [0, len(table)) as an array: table[x] = index.get(x, -1)
        self.table = np.full(0, -1, np.int64)
        if self._ext is not None and len(self._ext) and self._ext.max() >= 0:
            self._cover(int(self._ext.max()))
        if retired is not None:
            for v in np.flatnonzero(retired).tolist():
                if self.index.get(self.ext_ids[v]) == v:
                    self.retire(v)

    @property
    def labels(self) -> np.ndarray:
        return self._labels[: self.n]

    @property
    def ext_array(self) -> np.ndarray | None:
        """The external id of every internal id, int64 (None: string ids)."""
        return None if self._ext is None else self._ext[: self.n]

    def add(self, ext, label: int) -> int:
        v = self.n
        self._labels = _room(self._labels, v)
        self._labels[v] = label
        if self._ext is not None:
            self._ext = _room(self._ext, v)
            self._ext[v] = ext
        self.ext_ids.append(ext)
        self.index[ext] = v
        if isinstance(ext, (int, np.integer)) and ext >= 0:  # the keys an int64 id can equal
            self._cover(int(ext))
            if ext < len(self.table):
                self.table[ext] = v
        self.n += 1
        return v

    def retire(self, v: int) -> None:
        ext = self.ext_ids[v]
        del self.index[ext]
        if isinstance(ext, (int, np.integer)) and 0 <= ext < len(self.table):
            self.table[ext] = -1

    def _cover(self, ext: int) -> None:
        """Grow the table (doubling) to hold id ext, unless ids that large are too sparse for
        it: ids past TABLE_SPAN times the vertex count stay in the index alone. The grown part
        takes the index's ids it covers (those that were too sparse, or came before any table)."""
        old = len(self.table)
        if old <= ext < TABLE_SPAN * (self.n + 1) + TABLE_MIN:
            grown = np.full(max(ext + 1, 2 * old, TABLE_MIN), -1, np.int64)
            grown[:old] = self.table
            ids = np.fromiter(self.index, np.int64, len(self.index))
            at = (ids >= old) & (ids < len(grown))
            grown[ids[at]] = np.fromiter(self.index.values(), np.int64, len(self.index))[at]
            self.table = grown

    def lookup(self, ext: np.ndarray | list) -> np.ndarray:
        """The internal ids of external ids (a block's integer column, or records' ids in a
        list), -1 where unknown: a gather from the table when it covers them all, the index's
        look-ups otherwise (they run in C)."""
        if isinstance(ext, np.ndarray):
            if len(ext) and ext.dtype.kind in "iu" and ext.min() >= 0 and ext.max() < len(self.table):
                return self.table[ext]
            ext = ext.tolist()
        return np.fromiter(map(self.index.get, ext, repeat(-1)), np.int64, len(ext))

    def alive(self) -> np.ndarray:
        mask = np.zeros(self.n, bool)
        mask[np.fromiter(self.index.values(), np.int64, len(self.index))] = True
        return mask


def _room(a: np.ndarray, n: int) -> np.ndarray:
    """a, or a copy of its first n entries with twice the room, if it holds no more than n."""
    if n < len(a):
        return a
    grown = np.zeros(max(16, 2 * n), a.dtype)
    grown[:n] = a[:n]
    return grown


class BlockRecords(Mapping):
    """record_of of a batch cut from an UpdateBlock: seq -> its Update, made when asked for."""

    def __init__(self, block: UpdateBlock, first: int):
        self.block, self.first = block, first

    def __getitem__(self, seq: int) -> Update:
        if not 0 <= seq - self.first < len(self.block):
            raise KeyError(seq)
        return self.block.update(seq - self.first)

    def __len__(self) -> int:
        return len(self.block)

    def __iter__(self):
        return iter(range(self.first, self.first + len(self.block)))


def record_positions(record_of: Mapping, seq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The input partition and offset (the last two parts of the origin) of the record of each
    update in seq: from the block's columns where the batch was cut from one (no Update made)."""
    if isinstance(record_of, BlockRecords):
        block = record_of.block
        return np.full(len(seq), block.partition, np.int64), block.lineno[np.asarray(seq) - record_of.first]
    origins = [record_of[s].origin for s in np.asarray(seq).tolist()]
    return (np.array([o[1] for o in origins], np.int64), np.array([o[2] for o in origins], np.int64))


class _Checked(NamedTuple):
    """Edge records checked together (Sequencer._check): per record its ops's columns, whether
    it is valid, and why not (an index into IGNORED_REASONS, -1 when valid)."""

    a: np.ndarray
    b: np.ndarray
    label: np.ndarray
    sign: np.ndarray
    valid: np.ndarray
    reason: np.ndarray
    invalid: np.ndarray  # invalid[i]: how many of the first i records are not valid
    old: np.ndarray | None = None  # directed: the pair's code before each record (as a sees it; -1: no edge)
    new: np.ndarray | None = None  # and after it (0: no edge)


class Sequencer:
    def __init__(self, vertices: Vertices, engine: ContinuousEngine, first_seq: int = 0, directed: bool = False,
                 event_time: EventTime | None = None, g0: Graph | None = None):
        """event_time: its settings (None: off); the clock starts from g0's edge_ts and high_ts."""
        self.vertices, self.engine, self.directed = vertices, engine, directed
        self.clock = Clock(event_time, directed) if event_time is not None else None
        if self.clock is not None and g0 is not None:
            self.clock.seed(vertices, g0.edge_ts, g0.high_ts)
        self.next_seq = first_seq
        self.ignored: Counter = Counter()
        # a block's rows checked ahead: (block, first row, _Checked, the row the next batch must start
        # at to use it), and the window of the next check
        self._checked: tuple | None = None
        self._window = FIRST_WINDOW

    def sequence(self, records: list[Update] | UpdateBlock, arrived: np.ndarray | None = None) -> UpdateBatch:
        """Number the records and turn them into valid ops against the latest state."""
        arrived = arrived if arrived is not None else np.full(len(records), time.monotonic())
        if self.clock is not None:
            if isinstance(records, UpdateBlock):  # its rows carry no ts
                return self._general(records.updates(), arrived)
            # one record goes alone: the compiled pass's cost per batch outweighs one record's step
            batch = self._timed_edges(records, arrived) if len(records) > 1 else None
            return batch if batch is not None else self._general(records, arrived)
        if isinstance(records, UpdateBlock):
            batch = self._edges_block(records, arrived)
            return batch if batch is not None else self._general(records.updates(), arrived)
        # a few records go one at a time: numpy's cost per call outweighs its speed per record
        batch = self._edges_only(records, arrived) if len(records) > FEW_RECORDS else None
        return batch if batch is not None else self._general(records, arrived)

    def _edges_only(self, records: list[Update], arrived: np.ndarray) -> UpdateBatch | None:
        """The common batch, with numpy instead of a Python step per record: edge records between
        existing vertices. None for any other batch (_general takes it, with the same result)."""
        if not records:
            return None
        op = np.array([OPS.index(r.op) for r in records], np.int8)
        ids = self.vertices.lookup([r.u for r in records] + [r.v for r in records])
        checked = self._check(op, ids, np.array([r.label for r in records], np.int64), len(records))
        if checked is None:
            return None
        return self._batch(checked, 0, len(records), dict(zip(range(self.next_seq, self.next_seq + len(records)),
                                                                records)), arrived)

    def _edges_block(self, block: UpdateBlock, arrived: np.ndarray) -> UpdateBatch | None:
        """_edges_only for a block. The rows after the batch are checked with it, up to a window,
        so that the batches cut from the same block next take their ops from that check, without
        array work of their own: nothing but those rows changes the graph in between."""
        root, at = block.cut_from or (block, 0)
        k = len(block)
        last = self._checked
        if last is None or last[0] is not root or at != last[3] or at + k > last[1] + len(last[2].valid):
            hi = min(len(root), at + max(k, self._window))
            ids = self.vertices.lookup(np.concatenate([root.u[at:hi], root.v[at:hi]]))
            checked = self._check(root.op[at:hi], ids, root.label[at:hi], k)
            if checked is None:
                self._checked = None
                return None
            # the next window: twice what this one held (a long run of edge records grows it, one cut
            # short by a vertex record or an unknown vertex shrinks it)
            self._window = min(max(2 * len(checked.valid), k), MAX_WINDOW)
            last = (root, at, checked, at)
        self._checked = last[:3] + (at + k,)
        return self._batch(last[2], at - last[1], k, BlockRecords(block, self.next_seq), arrived)

    def _check(self, op, ids, label, need: int) -> _Checked | None:
        """The longest prefix of these records (op: an index into OPS; ids: the internal ids of
        their u's, then of their v's, -1 unknown) that are edge records between known vertices,
        each checked against the latest state as the records before it leave it; None if it is
        shorter than `need`.

        A vertex pair's records are checked together, in their order: whatever a record's outcome,
        an insertion leaves the pair's edge present and a deletion leaves it absent, so each record
        finds the edge as the record before it on the same pair left it (the first, as the engine
        holds it), and a deletion removes the label of the pair's last valid insertion before it
        (of the first's stored edge where none)."""
        m = len(op)
        a, b = ids[:m], ids[m:]
        bad = np.flatnonzero((op > OPS.index(DELETE_EDGE)) | (a < 0) | (b < 0))
        stop = bad[0] if len(bad) else m
        if stop < need:
            return None
        a, b, insert, label = a[:stop], b[:stop], op[:stop] == OPS.index(INSERT_EDGE), label[:stop]
        if self.directed:
            return self._check_arcs(a, b, insert, label)
        pair = a != b
        key = np.where(pair, np.minimum(a, b) * self.vertices.n + np.maximum(a, b), -1 - np.arange(stop))
        live = np.full(stop, -1, np.int64)
        live[pair] = self.engine.live_edge_labels(a[pair], b[pair])
        order = np.argsort(key, kind="stable")  # by pair, in time within each
        k, ins = key[order], insert[order]
        first = np.ones(stop, bool)
        first[1:] = k[1:] != k[:-1]
        present = np.where(first, live[order] >= 0, np.roll(ins, 1))  # before each record (sorted)
        valid = np.empty(stop, bool)
        valid[order] = pair[order] & (present != ins)  # an insertion of an absent edge, a deletion of a live one
        # each record's pair's last valid insertion before it (sorted positions), if in its group
        made = np.maximum.accumulate(np.where(ins & valid[order], np.arange(stop), -1))
        prior = np.r_[-1, made[:-1]]
        start = np.maximum.accumulate(np.where(first, np.arange(stop), 0))
        stored = np.empty(stop, np.int64)
        stored[order] = np.where(prior >= start, label[order][np.maximum(prior, 0)], live[order])
        reason = np.full(stop, -1, np.int8)
        for r, rows in enumerate((insert & ~pair, insert & pair & ~valid, ~insert & ~valid)):  # IGNORED_REASONS
            reason[rows] = r
        # an insertion carries its record's label, a deletion the stored edge's: it is what vanishes
        return _Checked(a, b, np.where(insert, label, stored), insert * np.int64(2) - 1, valid, reason,
                        np.concatenate(([0], np.cumsum(~valid))))

    def _check_arcs(self, a, b, insert, label) -> _Checked:
        """_check for a directed graph: each record's arc is checked as _check checks a pair (by the
        records before it on the same arc), and its pair's code before and after it follows from
        its own arc and the pair's other arc as the records before it on that one left it."""
        m = len(a)
        pos = np.arange(m)
        pair = a != b
        usable = pair & (~insert | (label <= MAX_DIRECTED_LABEL))
        lo, hi = np.minimum(a, b), np.maximum(a, b)
        fwd = a < b  # the record's arc is lo -> hi: the out half of the code lo sees
        key = np.where(usable, lo * self.vertices.n + hi, -1 - pos)
        live = np.full(m, -1, np.int64)
        live[usable] = self.engine.live_edge_labels(lo[usable], hi[usable])
        order = np.argsort(key, kind="stable")  # by pair, in time within each
        k, ins, out, code0 = key[order], insert[order], fwd[order], live[order]
        first = np.ones(m, bool)
        first[1:] = k[1:] != k[:-1]
        start = np.maximum.accumulate(np.where(first, pos, 0))

        def before(mask):
            """Per sorted record: the last earlier record of its pair where mask holds (-1: none)."""
            last = np.maximum.accumulate(np.where(mask, pos, -1))
            prev = np.r_[-1, last[:-1]]
            return np.where(prev >= start, prev, -1)

        def initially(is_out):
            """The arc's presence and label in the engine's code (as lo sees it)."""
            half = np.where(is_out, code0, code0 >> HALF) & HALF_MASK
            return (code0 >= 0) & ((half & PRESENT) != 0), half & MAX_DIRECTED_LABEL

        own_prev = np.where(out, before(out), before(~out))
        other_prev = np.where(out, before(~out), before(out))
        own_init, own_label0 = initially(out)
        other_init, other_label0 = initially(~out)
        own_has = np.where(own_prev >= 0, ins[np.maximum(own_prev, 0)], own_init)  # a record leaves its arc as it says
        other_has = np.where(other_prev >= 0, ins[np.maximum(other_prev, 0)], other_init)
        valid_s = usable[order] & (own_has != ins)
        made = ins & valid_s  # the arcs' labels: their last valid insertion's, else the engine's
        own_made = np.where(out, before(made & out), before(made & ~out))
        other_made = np.where(out, before(made & ~out), before(made & out))
        lab = label[order]
        own_label = np.where(own_made >= 0, lab[np.maximum(own_made, 0)], own_label0)
        other_label = np.where(other_made >= 0, lab[np.maximum(other_made, 0)], other_label0)

        def half(has, lab, is_out):
            return np.where(has, (PRESENT | lab) << np.where(is_out, 0, HALF), 0)

        kept = half(other_has, other_label, ~out)
        old_s = kept | half(own_has, own_label, out)
        new_s = np.where(valid_s, kept | half(ins, lab, out), old_s)
        old, new, valid = np.empty(m, np.int64), np.empty(m, np.int64), np.empty(m, bool)
        old[order], new[order], valid[order] = old_s, new_s, valid_s
        old, new = (np.where(fwd, c, flip(c).astype(np.int64)) for c in (old, new))  # as a sees them
        old = np.where(old == 0, -1, old)
        reason = np.full(m, -1, np.int8)
        for r, rows in ((SELF_LOOP, insert & ~pair), (DUPLICATE_INSERT, insert & usable & ~valid),
                        (MISSING_DELETE, ~insert & ~valid), (LABEL_RANGE, insert & pair & ~usable)):
            reason[rows] = IGNORED_REASONS.index(r)
        # an insertion carries the pair's code with its arc after it, a deletion before it: what vanishes
        return _Checked(a, b, np.where(insert, new, old), insert * np.int64(2) - 1, valid, reason,
                        np.concatenate(([0], np.cumsum(~valid))), old, new)

    def _batch(self, checked: _Checked, lo: int, k: int, record_of, arrived) -> UpdateBatch:
        """The batch of the checked records lo .. lo + k - 1, numbered from next_seq."""
        rows = slice(lo, lo + k)
        first = self.next_seq
        self.next_seq += k
        seq = np.arange(first, self.next_seq, dtype=np.int64)
        cols = [x[rows] for x in checked[:4]]
        codes = None if checked.old is None else (checked.old[rows], checked.new[rows])
        if checked.invalid[lo + k] > checked.invalid[lo]:
            valid = checked.valid[rows]
            for r, n in enumerate(np.bincount(checked.reason[rows][~valid], minlength=3)):
                if n:
                    self.ignored[IGNORED_REASONS[r]] += int(n)
            seq, cols = seq[valid], [x[valid] for x in cols]
            codes = codes and (codes[0][valid], codes[1][valid])
        z = np.zeros(0, np.int64)
        stored = None
        if codes is not None:  # the pair's old code closed, its new one opened, in that order
            old, new = codes
            take = np.stack([old >= 0, new > 0], 1).reshape(-1)
            signs = np.tile(np.array([-1, 1], np.int64), len(seq))
            stored = tuple(x[take] for x in (np.repeat(seq, 2), np.repeat(cols[0], 2), np.repeat(cols[1], 2),
                                             np.stack([old, new], 1).reshape(-1), signs))
        return UpdateBatch(first, self.next_seq, seq, *cols, z, z, z, np.zeros(0, np.int32), self.vertices.n, record_of,
                           arrived, k, stored)

    def _timed_edges(self, records: list[Update], arrived: np.ndarray) -> UpdateBatch | None:
        """The common batch under event time, in one compiled pass (pipeline/timed_edges.py): edge
        records with a ts, integer ids, insertions between existing vertices. None for any other
        batch (_general takes it, with the same result)."""
        vx, clock, directed = self.vertices, self.clock, self.directed
        if vx.str_ids or not records:
            return None
        op, u, v, label, ts = zip(*map(attrgetter("op", "u", "v", "label", "ts"), records))
        if None in ts or not set(op) <= set(EDGE_OPS):
            return None
        n = len(records)
        insert = np.fromiter(map(INSERT_EDGE.__eq__, op), bool, n)
        uv, label, ts = np.array(u + v, np.int64), np.array(label, np.int64), np.array(ts, np.int64)
        ids = vx.lookup(uv)
        a, b, same = ids[:n], ids[n:], uv[:n] == uv[n:]
        if (insert & ~same & ~(directed & (label > MAX_DIRECTED_LABEL)) & ((a < 0) | (b < 0))).any():
            return None  # an insertion that creates a vertex
        known = (a >= 0) & (b >= 0) & ~same
        pairs = [pair_keys(a[known], b[known])]
        most_due = int(insert.sum())  # heap entries the batch may take off: its own, and those due by its last ts
        window = clock.spec.window
        if window is not None:
            top = int(ts.max()) if clock.high is None else max(clock.high, int(ts.max()))
            due = clock.below(clock.horizon(top))
            pairs.append(pair_keys(due >> ID_BITS, due & ID_MASK))
            most_due += len(due)
        pairs = np.unique(np.concatenate(pairs))
        labels = self.engine.live_edge_labels(pairs >> ID_BITS, pairs & ID_MASK).astype(np.int64)
        clock.reserve(int(insert.sum()))
        ops, stored, outcome, owner, expiry_of, gone, clock.size, clock.heap_n, high, has_high, expired = \
            timed_edges.sequence_edges(insert, a, b, label, ts, same, self.next_seq, directed,
                                       -1 if window is None else window, clock.spec.lateness,
                                       0 if clock.high is None else clock.high, clock.high is not None, clock.table,
                                       clock.size, clock.heap_ts, clock.heap_key, clock.heap_n, vx.ext_array, pairs, labels,
                                       most_due)
        clock.high = int(high) if has_high else None
        clock.expired += expired
        first = self.next_seq
        self.next_seq += len(owner)
        for r, count in enumerate(np.bincount(outcome[outcome >= 0], minlength=len(TIMED_OUTCOMES)).tolist()):
            if count:
                self.ignored[TIMED_OUTCOMES[r]] += count
        z = np.zeros(0, np.int64)
        return UpdateBatch(first, self.next_seq, *ops[:5], z, z, z, np.zeros(0, np.int32), vx.n,
                           timed_edges.TimedRecords(records, first, owner, expiry_of, gone, vx.ext_ids), arrived,
                           n, tuple(stored[:5]) if directed else None, ops[5:].T.copy(),
                           stored[5:].T.copy())

    def _general(self, records: list[Update], arrived: np.ndarray) -> UpdateBatch:
        """Any batch, one record at a time (vertex records, new vertices, a pair named twice)."""
        vx, engine, directed, clock = self.vertices, self.engine, self.directed, self.clock
        first, first_vertex = self.next_seq, vx.n
        edge_ops: list[tuple[int, int, int, int, int]] = []
        stored: list[tuple[int, int, int, int, int]] = []  # directed: the multi-version graph's ops
        vertex_ops: list[tuple[int, int, int]] = []
        edge_ts: list[tuple[int, int]] = []  # under event time: per edge op (and stored op) its arcs' ts
        stored_ts: list[tuple[int, int]] = []
        record_of: dict[int, Update] = {}
        # this batch's view of the latest edges over what the engine holds (-1: none), by pair
        # (lo, hi): the label, or a directed pair's code as lo sees it
        overlay: dict[tuple[int, int], int] = {}

        def fetch(pairs: list[tuple[int, int]]) -> None:
            """The engine's labels of these pairs (lo, hi) of vertices it holds, where the overlay
            has none yet, in one look-up."""
            new = [p for p in dict.fromkeys(pairs) if p not in overlay]
            if new:
                lo, hi = np.array(new, np.int64).T
                overlay.update(zip(new, engine.live_edge_labels(lo, hi).tolist()))

        # one look-up for the pairs of every edge record whose vertices exist and of every edge that
        # may expire before the batch's last record
        known = [(vx.index[r.u], vx.index[r.v]) for r in records
                 if r.op in EDGE_OPS and r.u in vx.index and r.v in vx.index and r.u != r.v]
        stamps = [r.ts for r in records if r.op in EDGE_OPS and r.ts is not None]
        if clock is not None and clock.spec.window is not None and stamps:
            h = clock.horizon(max(stamps) if clock.high is None else max(clock.high, *stamps))
            known += [(k >> ID_BITS, k & ID_MASK) for k in clock.below(h).tolist()]
        fetch([(min(a, b), max(a, b)) for a, b in known])

        def live_label(a: int, b: int) -> int:
            """The pair's label (directed: its code as a sees it), -1 where it has no edge."""
            key = (min(a, b), max(a, b))
            if key not in overlay:  # a vertex created in this batch has no edge in the engine yet
                if a < first_vertex and b < first_vertex:
                    fetch([key])
                else:
                    overlay[key] = -1
            c = overlay[key]
            return flip_code(c) if directed and c >= 0 and a > b else c

        def has(a: int, b: int) -> bool:
            """Is there an edge (a, b)? (directed: the arc a -> b)"""
            c = live_label(a, b)
            return c >= 0 and (not directed or bool(c & PRESENT))

        def edge(seq, a, b, sign, label, ts=None):
            """The update (a, b) with its label (a deletion: the stored edge's, it is what vanishes)
            and, under event time, its ts (None: the clock's now)."""
            if clock is not None:
                ts = clock.get(clock.key(a, b)) if ts is None else ts
                back = clock.get(clock.key(b, a)) if directed else ts  # the pair's other arc keeps its own
                edge_ts.append((ts, back))
            if not directed:
                overlay[(min(a, b), max(a, b))] = label if sign > 0 else -1
                edge_ops.append((seq, a, b, label, sign))
                return
            old = live_label(a, b)
            kept = 0 if old < 0 else old & ~HALF_MASK  # the pair's other arc
            new = kept | PRESENT | label if sign > 0 else kept
            overlay[(min(a, b), max(a, b))] = -1 if not new else new if a < b else flip_code(new)
            edge_ops.append((seq, a, b, new if sign > 0 else old, sign))  # the pair's code with the arc
            if old >= 0:
                stored.append((seq, a, b, old, -1))
                if clock is not None:
                    stored_ts.append((ts, back))
            if new:
                stored.append((seq, a, b, new, +1))
                if clock is not None:
                    stored_ts.append((ts if sign > 0 else NO_TS, back))

        def vertex(ext, label, seq) -> int:
            v = vx.index.get(ext)
            if v is None:
                v = vx.add(ext, label)
                vertex_ops.append((seq, v, +1))
            return v

        def numbered(rec) -> int:
            """The next sequence number, for an update of record rec."""
            seq = self.next_seq
            self.next_seq += 1
            record_of[seq] = rec
            return seq

        def drop_vertex(v: int, rec) -> list[tuple[int, int, int]]:
            """Delete v's live edges, each an update with its own number (the record's own first),
            then v itself; the (a, b, label) of each edge deleted (one of them v)."""
            live = set(engine.live_neighbors(v).tolist()) if v < first_vertex else set()
            live |= {b if a == v else a for (a, b), lab in overlay.items() if lab >= 0 and v in (a, b)}
            live -= {b if a == v else a for (a, b), lab in overlay.items() if lab < 0 and v in (a, b)}
            if v < first_vertex:
                fetch([(min(v, w), max(v, w)) for w in live if w < first_vertex])
            self.next_seq -= 1
            gone = []
            for w in sorted(live):
                lab = live_label(v, w)
                if directed:  # its arcs (the code's halves): v -> w, then w -> v
                    gone += [(x, y, (lab >> at) & MAX_DIRECTED_LABEL) for x, y, at in ((v, w, 0), (w, v, HALF))
                             if (lab >> at) & PRESENT]
                else:
                    gone.append((v, w, lab))
            for a, b, label in gone:
                edge(numbered(rec), a, b, -1, label)
            vertex_ops.append((numbered(rec), v, -1))
            vx.retire(v)
            return gone

        def expire(rec) -> None:
            """Delete the edges that left the window, each with a number of its own, as rec's."""
            for a, b, ts in clock.due(vx.ext_ids):
                edge(numbered(expiry(rec, vx.ext_ids[a], vx.ext_ids[b], ts)), a, b, -1, live_label(a, b), ts)

        for rec in records:
            seq = self.next_seq
            self.next_seq += 1
            record_of[seq] = rec
            # (an edge update without a ts, which the decoders refuse under event time, is applied untimed)
            timed = clock is not None and rec.op in EDGE_OPS and rec.ts is not None
            if timed:
                if clock.late(rec.ts):
                    self.ignored[LATE] += 1
                    continue
                clock.advance(rec.ts)
            if rec.op == INSERT_EDGE:
                if rec.u == rec.v:
                    self.ignored[SELF_LOOP] += 1
                elif directed and rec.label > MAX_DIRECTED_LABEL:
                    self.ignored[LABEL_RANGE] += 1
                else:
                    a = vertex(rec.u, 0, seq)
                    b = vertex(rec.v, 0, seq)
                    key = clock.key(a, b) if timed else None
                    if not has(a, b):
                        edge(seq, a, b, +1, rec.label, rec.ts if timed else NO_TS)
                    elif not timed or clock.holds(key, rec.ts):
                        self.ignored[DUPLICATE_INSERT] += 1
                    else:  # a new ts replaces the edge: it goes, then comes back under its new ts
                        edge(seq, a, b, -1, live_label(a, b))
                        edge(numbered(rec), a, b, +1, rec.label, rec.ts)
                    if timed:
                        clock.write(key, rec.ts)
            elif rec.op == DELETE_EDGE:
                a, b = vx.index.get(rec.u), vx.index.get(rec.v)
                if a is None or b is None or a == b or not has(a, b):
                    self.ignored[MISSING_DELETE] += 1
                else:
                    edge(seq, a, b, -1, live_label(a, b))  # the stored edge's label: it is what vanishes
                    if clock is not None:  # (with a ts or without: the edge is gone, it cannot expire)
                        clock.forget(clock.key(a, b))
            elif rec.op == INSERT_VERTEX:
                v = vx.index.get(rec.u)
                if v is None:
                    vertex(rec.u, rec.label, seq)
                elif vx.labels[v] == rec.label:
                    self.ignored[DUPLICATE_VERTEX] += 1
                else:  # a relabel: the vertex leaves with its edges and comes back under the new label
                    gone = drop_vertex(v, rec)
                    w = vertex(rec.u, rec.label, numbered(rec))
                    moved = [(w if a == v else a, w if b == v else b, label) for a, b, label in gone]
                    if clock is not None:  # its edges keep their ts under its new id
                        for (a, b, _), (x, y, _) in zip(gone, moved):
                            clock.rename(clock.key(a, b), clock.key(x, y))
                    for a, b, label in moved:
                        edge(numbered(rec), a, b, +1, label)
            elif rec.op == DELETE_VERTEX:
                v = vx.index.get(rec.u)
                if v is None:
                    self.ignored[MISSING_VERTEX] += 1
                else:
                    for a, b, _ in drop_vertex(v, rec):
                        if clock is not None:
                            clock.forget(clock.key(a, b))
            else:  # parse_update only makes the four ops above
                raise ValueError(f"unknown update op {rec.op!r}")
            if timed:
                expire(rec)
        e = np.array(edge_ops, np.int64).reshape(-1, 5)
        vo = np.array(vertex_ops, np.int64).reshape(-1, 3)
        st = np.array(stored, np.int64).reshape(-1, 5)
        timed = None if clock is None else (np.array(edge_ts, np.int64).reshape(-1, 2),
                                            np.array(stored_ts, np.int64).reshape(-1, 2))
        return UpdateBatch(first, self.next_seq, e[:, 0], e[:, 1], e[:, 2], e[:, 3], e[:, 4], vo[:, 0], vo[:, 1],
                           vo[:, 2], vx.labels[first_vertex:].copy(), first_vertex, record_of, arrived, len(records),
                           tuple(st.T) if directed else None, *(timed or (None, None)))
