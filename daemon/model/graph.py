"""The static graph model: CSR with sorted neighbor arrays, vertex and edge labels.

Vertices are dense internal ids 0..n-1; `ext_ids[i]` is the id the user gave
(int64, or str for tables with string keys) and is what every output reports.
Edges are undirected, at most one per vertex pair, self-loops dropped (docs/design.md section 1). A directed
graph keeps one entry per pair too, labelled with a code of its arcs (model/direction.py).
"""

from __future__ import annotations

import numpy as np

from csmd.model.direction import arc_code, arcs_of, flip


def gather_ranges(start: np.ndarray, size: np.ndarray) -> np.ndarray:
    """The concatenated index ranges [start, start + size) as one array."""
    ends = np.cumsum(size)
    return np.repeat(start - (ends - size), size) + np.arange(int(ends[-1]) if len(ends) else 0)


def _packed_csr(lo, hi, el, n: int):
    """An undirected graph's entries (rows, cols, labels) in CSR order, its pairs (lo < hi, label el)
    deduplicated, by sorting one int64 key an entry (row, column, label packed): numpy sorts keys
    some 20 times as fast as its stable argsort sorts positions (70M entries: 0.5 against 9.9 s on
    the 2-core VM; LiveJournal's size took from_edges 13 s). None where a key would not fit, or a
    pair repeats with another label: which label the first of them has is then the caller's to keep."""
    eb, nb = int(el.max(initial=0)).bit_length(), max(int(n - 1).bit_length(), 1)
    if 2 * nb + eb > 62 or el.min(initial=0) < 0:
        return None
    # in place where numpy allows: at this size each new array is mostly page faults
    key = np.left_shift(lo, nb + eb)
    key |= hi << eb
    key |= el
    key.sort()
    if len(key) > 1:
        new = np.empty(len(key), bool)
        new[0] = True
        np.not_equal(key[1:], key[:-1], out=new[1:])
        if not new.all():
            key = key[new]
    pair = key >> eb
    if (pair[1:] == pair[:-1]).any():
        return None
    both = np.empty(2 * len(key), np.int64)
    both[: len(key)] = key
    back = both[len(key):]  # each pair from its other end: (hi, lo, label)
    np.bitwise_and(pair, (1 << nb) - 1, out=back)
    back <<= nb
    pair >>= nb
    back |= pair
    back <<= eb
    key &= (1 << eb) - 1
    back |= key
    both.sort()
    els = (both & ((1 << eb) - 1)).astype(np.int32)
    both >>= eb
    cols = (both & ((1 << nb) - 1)).astype(np.int32)
    both >>= nb
    return both, cols, els


def id_array(ids, strings: bool | None = None) -> np.ndarray:
    """External ids as an int64 array, or for string ids an object array: never numpy's
    fixed-width unicode, which cut ids to the width of the first array's longest and padded
    every id to the longest one. strings: the kind (None: from the array's dtype, else from
    the first id; int64 when there is none)."""
    if strings is None:
        strings = ids.dtype.kind in "OUS" if isinstance(ids, np.ndarray) else len(ids) > 0 and isinstance(ids[0], str)
    if not strings:
        return np.asarray(ids, np.int64)
    out = np.empty(len(ids), object)
    out[:] = ids  # element by element: no unicode array made on the way
    return out


def scalar(x):
    """A numpy scalar as the plain Python value (for dict keys and messages)."""
    return x.item() if hasattr(x, "item") else x


class Graph:
    """Immutable labeled graph in CSR form, undirected or directed.

    indptr[v]..indptr[v+1] is v's slice of `indices` (neighbors, ascending) and
    `elabels` (the label of each such edge; directed: the code of the pair's arcs as v sees
    them). Derived indexes used by the matchers (sorted edge keys, label-grouped adjacency)
    are built on first use. edge_ts: the event times its file gave edges, as (u, v, ts) arrays
    of external ids (None: none; pipeline/event_time.py expires them); high_ts: a checkpoint's
    largest ts applied (the watermark before lateness), where the graph is one; time: a query's
    span and order constraints.
    """

    def __init__(self, labels, indptr, indices, elabels, ext_ids=None, directed: bool = False):
        self.labels = np.ascontiguousarray(labels, dtype=np.int32)
        self.indptr = np.ascontiguousarray(indptr, dtype=np.int64)
        self.indices = np.ascontiguousarray(indices, dtype=np.int32)
        self.elabels = np.ascontiguousarray(elabels, dtype=np.int32)
        self.n = len(self.labels)
        self.directed = directed
        self.ext_ids = np.arange(self.n, dtype=np.int64) if ext_ids is None else id_array(ext_ids)
        self._index_of = None
        self._edge_keys = None
        self._grouped = None
        self.edge_ts: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self.high_ts: int | None = None
        self.time = None  # a query's time constraints (model/time_constraints.py QueryTime), None: none

    # ---- construction -------------------------------------------------------
    @property
    def str_ids(self) -> bool:
        """Whether the graph is keyed by strings (an Arrow/Parquet graph with string ids): the ids of
        its text update streams are then the tokens as written."""
        return self.ext_ids.dtype.kind in "OUS"

    @classmethod
    def from_edges(cls, labels, src, dst, elabels=None, ext_ids=None, directed: bool = False) -> "Graph":
        """Build from internal-id edge lists; drops self-loops and repeated pairs (first wins;
        directed: repeated ordered pairs, u->v and v->u being two arcs of one pair)."""
        labels = np.asarray(labels, dtype=np.int32)
        n = len(labels)
        src = np.asarray(src, dtype=np.int64)
        dst = np.asarray(dst, dtype=np.int64)
        elabels = np.zeros(len(src), np.int32) if elabels is None else np.asarray(elabels, np.int32)
        keep = src != dst
        src, dst, el = src[keep], dst[keep], elabels[keep]
        lo, hi = np.minimum(src, dst), np.maximum(src, dst)
        packed = None if directed else _packed_csr(lo, hi, el, n)
        if packed is not None:
            rows, cols, els = packed
        else:
            if directed:
                _, first = np.unique(src * n + dst, return_index=True)
                code = arc_code(el[first], src[first] < dst[first]).astype(np.int64)  # as lo sees it
                pair, inverse = np.unique(lo[first] * n + hi[first], return_inverse=True)
                lo, hi = pair // max(n, 1), pair % max(n, 1)
                el_lo = np.bincount(inverse, code, len(pair)).astype(np.int32)  # a pair's two halves
                el_hi = flip(el_lo)
            else:
                _, first = np.unique(lo * n + hi, return_index=True)
                lo, hi, el_lo = lo[first], hi[first], el[first]
                el_hi = el_lo
            rows = np.concatenate([lo, hi])
            cols = np.concatenate([hi, lo])
            els = np.concatenate([el_lo, el_hi])
            order = np.argsort(rows * n + cols, kind="stable")
            rows, cols, els = rows[order], cols[order], els[order]
        indptr = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(rows, minlength=n), out=indptr[1:])
        return cls(labels, indptr, cols, els, ext_ids, directed)

    # ---- basic accessors ----------------------------------------------------
    @property
    def num_edges(self) -> int:
        """Edges; a directed graph's arcs (a reciprocal pair is two)."""
        return len(self.arcs()[0]) if self.directed else len(self.indices) // 2

    @property
    def degrees(self) -> np.ndarray:
        return np.diff(self.indptr)

    @property
    def num_labels(self) -> int:
        return int(self.labels.max()) + 1 if self.n else 0

    def neighbors(self, v: int) -> np.ndarray:
        return self.indices[self.indptr[v]:self.indptr[v + 1]]

    def edge_list(self):
        """(src, dst, elabel) with src < dst, one row per vertex pair (directed: the pair's code as src
        sees it)."""
        rows = np.repeat(np.arange(self.n, dtype=np.int64), self.degrees)
        m = rows < self.indices
        return rows[m], self.indices[m].astype(np.int64), self.elabels[m]

    def arcs(self):
        """(src, dst, label) of every edge as the user wrote it: undirected, src < dst; directed,
        every arc u->v."""
        s, d, e = self.edge_list()
        return arcs_of(s, d, e) if self.directed else (s, d, e)

    def index_of(self, ext) -> int:
        """Internal id of an external id; KeyError if unknown."""
        if self._index_of is None:
            self._index_of = {scalar(x): i for i, x in enumerate(self.ext_ids)}
        return self._index_of[ext]

    def same_as(self, other: "Graph") -> bool:
        """Same vertices (by external id), labels and labelled edges, whatever the internal numbering."""
        if self.n != other.n or self.directed != other.directed or self.num_edges != other.num_edges:
            return False
        try:
            perm = np.array([other.index_of(scalar(x)) for x in self.ext_ids], np.int64)
        except KeyError:
            return False
        if not np.array_equal(self.labels, other.labels[perm]):
            return False
        s, d, e = self.arcs()
        a, b = perm[s], perm[d]
        if not self.directed:
            a, b = np.minimum(a, b), np.maximum(a, b)
        mine = sorted(zip(a.tolist(), b.tolist(), e.tolist()))
        return mine == sorted(zip(*(x.tolist() for x in other.arcs())))

    # ---- matcher indexes ----------------------------------------------------
    @property
    def edge_keys(self) -> np.ndarray:
        """row * n + col for every adjacency entry; globally sorted because CSR rows are."""
        if self._edge_keys is None:
            rows = np.repeat(np.arange(self.n, dtype=np.int64), self.degrees)
            self._edge_keys = rows * self.n + self.indices
        return self._edge_keys

    def edge_label_between(self, u: np.ndarray, v: np.ndarray, ts=None) -> np.ndarray:
        """Label of edge {u, v} for each pair, -1 where there is no edge (vectorized)."""
        keys = u.astype(np.int64) * self.n + v
        ek = self.edge_keys
        out = np.full(len(keys), -1, np.int32)
        if len(ek):
            pos = np.minimum(np.searchsorted(ek, keys), len(ek) - 1)
            found = ek[pos] == keys
            out[found] = self.elabels[pos[found]]
        return out

    @property
    def grouped(self):
        """Adjacency regrouped by neighbor label: (group_keys, nbrs, elabels).

        Within v's slice the neighbors are sorted by (label, id), and
        group_keys = v * num_labels + label(neighbor) is globally sorted, so the
        neighbors of v with label l are one contiguous range found by searchsorted.
        """
        if self._grouped is None:
            nl = max(self.num_labels, 1)
            rows = np.repeat(np.arange(self.n, dtype=np.int64), self.degrees)
            gk = rows * nl + self.labels[self.indices]
            order = np.lexsort((self.indices, gk))
            self._grouped = (gk[order], self.indices[order], self.elabels[order])
        return self._grouped

    # The matcher's read interface, shared with the multi-version graph (which uses `ts`).
    lifetimes = None

    @property
    def nbrs(self) -> np.ndarray:
        return self.grouped[1]

    @property
    def nels(self) -> np.ndarray:
        return self.grouped[2]

    def ranges(self, v: np.ndarray, label: int, ts=None):
        """Start and end (into `nbrs`) of the neighbors of each v that carry `label`."""
        if not 0 <= label < self.num_labels:
            z = np.zeros(len(v), np.int64)
            return z, z
        gk = self.grouped[0]
        key = v.astype(np.int64) * self.num_labels + label
        return np.searchsorted(gk, key, "left"), np.searchsorted(gk, key, "right")
