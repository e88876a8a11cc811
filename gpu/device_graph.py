"""The data graph on the device: CSR in two neighbour orders, vertex and edge labels."""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import cupy as cp

from csmd.model.graph import Graph

from .launch import THREADS, flat_grid, i32, i64
from .module import kernel

HUB_DEGREE = 32  # below this a label range is a short binary search
LABEL_INDEX_BYTES = 1 << 30  # the threshold doubles until the index fits


@dataclass
class DeviceGraph:
    """indptr (int64) with two aligned neighbour orders of each vertex's slice:
    adj/adj_el sorted by id (membership tests) and gadj/gadj_el sorted by (label, id)
    (candidate ranges). With one vertex label both orders are the same arrays;
    without edge labels adj_el/gadj_el are None and edge labels are never read.
    """

    n: int
    indptr: cp.ndarray
    adj: cp.ndarray
    adj_el: cp.ndarray | None
    gadj: cp.ndarray
    gadj_el: cp.ndarray | None
    labels: cp.ndarray
    num_labels: int
    hub_of: cp.ndarray | None = None
    hub_tab: cp.ndarray | None = None

    def __post_init__(self):
        """Per-label offsets into the label-grouped slices of the high-degree vertices."""
        if self.single_label or not self.n:
            return
        deg = cp.diff(self.indptr)
        row = self.num_labels + 1
        threshold = HUB_DEGREE
        hubs = cp.flatnonzero(deg >= threshold)
        while len(hubs) * row * 4 > LABEL_INDEX_BYTES:
            threshold *= 2
            hubs = cp.flatnonzero(deg >= threshold)
        self.hub_of = cp.full(self.n, -1, cp.int32)
        self.hub_of[hubs] = cp.arange(len(hubs), dtype=cp.int32)
        self.hub_tab = cp.empty(max(1, len(hubs) * row), cp.int32)
        if len(hubs):
            kernel("filtering", "label_index")(flat_grid(len(hubs) * row), (THREADS,), (
                i64(len(hubs)), hubs.astype(cp.int32), i32(self.num_labels), self.indptr, self.gadj, self.labels,
                self.hub_tab))

    @property
    def single_label(self) -> bool:
        return self.num_labels <= 1

    @property
    def has_edge_labels(self) -> bool:
        return self.adj_el is not None

    @property
    def nbytes(self) -> int:
        arrays = {id(a): a for a in (self.indptr, self.adj, self.adj_el, self.gadj, self.gadj_el, self.labels,
                                     self.hub_of, self.hub_tab) if a is not None}
        return sum(a.nbytes for a in arrays.values())

    @classmethod
    def from_csr(cls, labels: cp.ndarray, indptr: cp.ndarray, adj: cp.ndarray, adj_el: cp.ndarray | None):
        """From a device CSR whose slices are sorted by neighbour id; builds the label-grouped order."""
        n = len(labels)
        num_labels = int(labels.max()) + 1 if n else 0
        if adj_el is not None and not bool(adj_el.any()):
            adj_el = None
        if num_labels <= 1:
            return cls(n, indptr, adj, adj_el, adj, adj_el, labels, num_labels)
        rows = cp.repeat(cp.arange(n, dtype=cp.int64), cp.diff(indptr).astype(cp.int64))
        group = rows * num_labels + labels[adj]
        del rows
        if adj_el is None and n * n * num_labels < 1 << 62:
            # (row, label, neighbour) in one int64 key: a plain sort, no permutation kept
            key = group * n + adj
            del group
            key.sort()
            return cls(n, indptr, adj, None, (key % n).astype(cp.int32), None, labels, num_labels)
        # a stable sort by (row, neighbour label) keeps each group in id order
        perm = cp.argsort(group, kind="stable")
        del group
        gadj = adj[perm]
        gadj_el = None if adj_el is None else adj_el[perm]
        return cls(n, indptr, adj, adj_el, gadj, gadj_el, labels, num_labels)


# each Graph's upload on each device it was uploaded to (a static search on several GPUs
# uploads it to every one of them, from a thread per device)
_UPLOADED: "weakref.WeakKeyDictionary[Graph, dict[int, DeviceGraph]]" = weakref.WeakKeyDictionary()
_UPLOADING = threading.Lock()


def uploaded(g: Graph) -> bool:
    """Whether g has been uploaded to the current device (device_graph(g) costs nothing more)."""
    return cp.cuda.runtime.getDevice() in _UPLOADED.get(g, {})


def device_graph(g: Graph) -> DeviceGraph:
    """g on the current device, uploaded once per Graph object and device."""
    device = cp.cuda.runtime.getDevice()
    with _UPLOADING:
        on = _UPLOADED.setdefault(g, {})
    dg = on.get(device)
    if dg is None:
        el = g.elabels if g.elabels.any() else None
        adj, adj_el = cp.asarray(g.indices), None if el is None else cp.asarray(el)
        if g.num_labels <= 1:
            gadj, gadj_el = adj, adj_el
        else:
            _, nbrs, nels = g.grouped
            gadj, gadj_el = cp.asarray(nbrs), None if el is None else cp.asarray(nels)
        dg = DeviceGraph(g.n, cp.asarray(g.indptr), adj, adj_el, gadj, gadj_el, cp.asarray(g.labels), g.num_labels)
        on[device] = dg
    return dg
