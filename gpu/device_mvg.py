"""The multi-version graph on the device and its graph updater (docs/design.md section 3).

DeviceMVG has the semantics of csmd.mvg (the CPU MultiVersionGraph, which the tests hold
it to) and the storage of gpu/mvg.cu: per vertex a chain of versions (cur, prev), each
version one block of the entry pool, blocks in power-of-two size classes recycled through
per-class free lists together with their version ids. Kernels that match at a timestamp
read it through gpu/mvg_access.cuh, with the MVGView that `view()` returns.

Host work per batch: one upload of the batch and one read-back of a few counters (they
size the copy and say whether a pool must grow); no per-entry Python. A small batch whose
worst case the host can make room for beforehand does not wait for that read-back: its
counters are read at the next apply. Every array grows
by doubling when it runs out (`_reserve`), after synchronizing the device, because a
reader on another stream may still hold the old one; in steady state nothing grows.
"""

from __future__ import annotations

import itertools
import re
import threading

import cupy as cp
import numpy as np

from csmd.model.direction import flip
from csmd.model.graph import Graph

from .launch import THREADS, DirectLaunch, flat_grid, i64
from .module import HERE, kernel

INF = np.iinfo(np.int64).max
NOW = INF - 1  # a read "now": after every update, before the end of every live entry
# the batch counters, as gpu/mvg.cu's enum names them
_STATS = re.split(r",\s*", re.search(r"enum \{\s*(S_NEW,[^}]*?)\s*\};", (HERE / "mvg.cu").read_text()).group(1))
S_NEW, S_REPLACED, S_EMPTY, S_REPLACED_AT, S_FRESH, S_FRESH_ENTRIES, S_COPY, S_MAX_SIZE, S_COUNT = (
    _STATS.index(name) for name in ("S_NEW", "S_REPLACED", "S_EMPTY", "S_REPLACED_AT", "S_FRESH", "S_FRESH_ENTRIES",
                                    "S_COPY", "S_MAX_SIZE", "S_COUNT"))
# A small batch's allocation may grow the pool by this many entries (and its copy space as many)
# towards room for its worst case, so that its counters need not be read back before its copy.
DEFER_GROWTH = 1 << 20
# A deferred small batch whose worst case copies at most this many entries is written by its one
# block whatever it copies (one launch; one block copies some 150 entries a microsecond, so at
# worst about 0.9 ms, a bound seldom reached: 64 ops on the human graph may copy 98,688 entries
# and copy some 4,700); beyond it five grid launches follow, which do the write where it copies
# more than GU_FUSED_COPY (some 0.1 ms of host time that a hub's copy repays).
SOLO_COPY = 1 << 17
_FORMATS = {"int*": np.uint64, "i64*": np.uint64, "i64": np.int64}
# Deferred small batches take their new version ids from slabs of this many (one allocation per
# slab, not per batch; a token keeps its slab until the GC releases it)
VID_SLAB = 1 << 14


_KERNELS: dict = {}  # (device, name) -> kernel
_SMALL: dict = {}  # device -> _small_layout()


def _kernel(name: str):
    key = (cp.cuda.Device().id, name)
    return _KERNELS.get(key) or _KERNELS.setdefault(key, kernel("mvg", name))


def _launch(name: str, n: int, args) -> None:
    """A grid-stride kernel over n items. The SM count and the functions are looked up once
    per device: launch.flat_grid's, and a batch's fixed cost is mostly such host overhead."""
    _kernel(name)(flat_grid(n), (THREADS,), args)


def _small_layout() -> tuple[int, int, int, int]:
    """(rows, fused copy, threads, arena words) of the one-block kernels, from gpu/mvg.cu; raises
    the dynamic shared memory those that sort may take to what their largest batch needs."""
    out = cp.zeros(4, cp.int64)
    _kernel("gu_small_layout")((1,), (1,), (out,))
    rows, fused, threads, arena = (int(x) for x in out.get())
    for name in ("gu_small_plan", "gu_small_apply"):
        _kernel(name).max_dynamic_shared_size_bytes = 8 * _pow2(rows)
    return rows, fused, threads, arena


def _pow2(n: int) -> int:
    """The smallest power of two >= n (block_ops.cuh's pow2_at_least)."""
    return 1 << max(0, int(n) - 1).bit_length()


def _view_dtype() -> np.dtype:
    """MVGView as a numpy dtype: field names from the header's MVG_VIEW_FIELDS, offsets and
    sizes from the device compiler (mvg_view_layout), so the layout is never written twice."""
    text = (HERE / "mvg_access.cuh").read_text()
    block = re.search(r"#define MVG_VIEW_FIELDS\(X\)((?:.*\\\n)*.*)", text).group(1)
    fields = re.findall(r"X\(([^,()]+),\s*(\w+)\)", block)
    out = cp.zeros(1 + 2 * len(fields), cp.int64)
    kernel("mvg", "mvg_view_layout")((1,), (1,), (out,))
    layout = out.get()
    formats = [_FORMATS[t.replace(" ", "")] for t, _ in fields]
    for i, ((t, name), f) in enumerate(zip(fields, formats)):
        if layout[2 + 2 * i] != np.dtype(f).itemsize:
            raise RuntimeError(f"MVGView.{name}: {layout[2 + 2 * i]} bytes on the device, {t} here")
    return np.dtype({"names": [name for _, name in fields], "formats": formats,
                     "offsets": [int(x) for x in layout[1::2]], "itemsize": int(layout[0])})


def _grown(a: cp.ndarray, size: int, fill=None) -> cp.ndarray:
    """a in a new array of `size` items (the rest `fill`, or not set), on the current stream: one
    cudaMemcpyAsync, a tenth of the host time of a slice assignment (a pool grows by some
    thirteen arrays at once)."""
    out = cp.empty(size, a.dtype) if fill is None else cp.full(size, fill, a.dtype)
    cp.cuda.runtime.memcpyAsync(out.data.ptr, a.data.ptr, a.nbytes, cp.cuda.runtime.memcpyDeviceToDevice,
                                cp.cuda.get_current_stream().ptr)
    return out


class Staging:
    """An int64 buffer in pinned host memory and one on the device, grown together. Copies
    between them are single cudaMemcpyAsync calls: from pinned memory an upload does not wait
    for the stream to drain, as one from pageable memory does, and either way costs a fraction
    of cp.asarray or .get(). One user at a time, who synchronizes the stream (a read-back)
    before filling the host buffer again."""

    def __init__(self):
        self.host, self.dev = np.zeros(0, np.int64), cp.zeros(0, cp.int64)
        self.ptr = self.host.ctypes.data  # host's address (asking numpy each time costs 2 us on the device host)

    def host_view(self, n: int) -> np.ndarray:
        if n > len(self.host):
            size = max(n, 2 * len(self.host), 1024)
            self._pinned = cp.cuda.alloc_pinned_memory(8 * size)
            self.host = np.frombuffer(self._pinned, np.int64, size)
            self.ptr = self.host.ctypes.data
            self.dev = cp.empty(size, cp.int64)
        return self.host[:n]

    def upload(self, n: int, stream: cp.cuda.Stream) -> cp.ndarray:
        """host[:n] to the device buffer (returned whole: its first n items are the data)."""
        cp.cuda.runtime.memcpyAsync(self.dev.data.ptr, self.ptr, 8 * n,
                                    cp.cuda.runtime.memcpyHostToDevice, stream.ptr)
        return self.dev

    def read_back(self, at: int, n: int, stream: cp.cuda.Stream) -> np.ndarray:
        """dev[at:at + n] (after what `stream` has queued) in host[at:at + n]: a kernel's results
        written next to its inputs come back to where the host staged them."""
        cp.cuda.runtime.memcpyAsync(self.ptr + 8 * at, self.dev.data.ptr + 8 * at, 8 * n,
                                    cp.cuda.runtime.memcpyDeviceToHost, stream.ptr)
        stream.synchronize()
        return self.host[at: at + n]

    def download(self, src: cp.ndarray, n: int, stream: cp.cuda.Stream) -> np.ndarray:
        """src's first n int64 items (after what `stream` has queued), in host[:n]."""
        self.host_view(n)
        cp.cuda.runtime.memcpyAsync(self.ptr, src.data.ptr, 8 * n,
                                    cp.cuda.runtime.memcpyDeviceToHost, stream.ptr)
        stream.synchronize()
        return self.host[:n]


class Replaced:
    """The versions one batch replaced: an opaque token for the host GC.

    Free it with `DeviceMVG.release` once every read at a timestamp <= replaced_at has
    finished (csmd.gc.GarbageCollector does that with (token, replaced_at) pairs).
    count: versions replaced (csmd.mvg's apply returns as many pairs); blocks: those
    owning a block (the others were empty and their ids are not reused).

    A small batch's token is `pending` until the MVG reads the batch's counters back (at the
    next apply, or when a field is first read): the batch's launches need not wait for them.
    """

    __slots__ = ("_slab", "_at", "_n", "_replaced_at", "_count", "_blocks", "_mvg", "_serial")
    _serials = itertools.count()

    def __init__(self, vids, replaced_at: int = -1, count: int = 0, blocks: int = 0, mvg: "DeviceMVG | None" = None,
                 at: int = 0, n: int | None = None):
        """vids: the replaced version ids (device int32), or a slab holding them from `at` on (n of
        them; a pending token's n is the room for every insertion row, of which the counters say
        how much was used); None: none."""
        self._slab, self._at = vids, at
        self._n = 0 if vids is None else len(vids) if n is None else n
        self._replaced_at, self._count, self._blocks, self._mvg = replaced_at, count, blocks, mvg
        self._serial = next(self._serials)

    @property
    def pending(self) -> bool:
        return self._mvg is not None

    @property
    def at_most(self) -> int:
        """count, or while pending a bound on it that needs no wait (the batch's insertion rows)."""
        return self._n if self._mvg is not None else self._count

    def _fill(self, st: list[int]) -> None:
        """The fields from the batch's counters."""
        self._n = st[S_NEW]
        self._replaced_at, self._count, self._blocks = st[S_REPLACED_AT], st[S_REPLACED] + st[S_EMPTY], st[S_REPLACED]
        self._mvg = None

    def _settled(self) -> "Replaced":
        if self._mvg is not None:
            self._mvg._settle()
        return self

    @property
    def vids(self):
        t = self._settled()
        return None if t._slab is None else t._slab[t._at: t._at + t._n]

    replaced_at = property(lambda self: self._settled()._replaced_at)
    count = property(lambda self: self._settled()._count)
    blocks = property(lambda self: self._settled()._blocks)

    def __lt__(self, other: "Replaced") -> bool:  # heap ties in the GC
        return self._serial < other._serial

    def __len__(self) -> int:
        return self.count


class DeviceMVG:
    """Vertex labels and the versioned adjacency on the device (internal vertex ids)."""

    _dtype: np.dtype | None = None

    def __init__(self, labels: cp.ndarray, indptr: cp.ndarray, nbrs: cp.ndarray, els: cp.ndarray | None,
                 directed: bool = False, ts: cp.ndarray | None = None):
        """From a device CSR whose slices are sorted by (neighbour label, neighbour).

        Vertex v gets version v (ct_min -1: older than every update), in a block of its
        size class; the entry pool starts with half its size spare for the first batches.
        directed: the labels are the codes of vertex pairs' arcs (daemon/model/direction.py).
        ts: under event time, the entries' arc ts (2 rows: the arc to the neighbour, the arc
        back; daemon/model/time_constraints.py NO_TS where none); None: untimed.
        """
        if DeviceMVG._dtype is None:
            DeviceMVG._dtype = _view_dtype()
        device = cp.cuda.Device().id  # the layout is the compiler's, the kernels' shared memory limit each device's
        self._small = _SMALL.get(device) or _SMALL.setdefault(device, _small_layout())
        cp.cuda.Device().synchronize()  # the inputs may still be in flight on another stream
        self.stream = cp.cuda.Stream(non_blocking=True)
        n, m = len(labels), len(nbrs)
        self.n, self.directed = n, directed
        self.timed = ts is not None
        # some edge, now or ever, has a non-zero label; until then readers may skip the label
        # test (monotone: a batch sets it in apply, before its search is submitted)
        self.has_edge_labels = els is not None and bool(els.any())
        with self.stream:
            vcap = max(n, 1024)
            self.labels = _grown(labels.astype(cp.int32), vcap, 0)
            self.cur = cp.full(vcap, -1, cp.int32)
            self.n_versions = n
            vcap = max(2 * n, 1024)
            self.v_ct_min, self.v_dt_max, self.v_start, self.v_ct_hi = (cp.empty(vcap, cp.int64) for _ in range(4))
            self.v_prev, self.v_size, self.v_cls, self.v_live = (cp.empty(vcap, cp.int32) for _ in range(4))
            # free list: keys class << 32 | vid; the first n_keys hold the n_free free versions and
            # MVG_INF holes, sorted (holes last) when sorted is set
            self.free_keys = cp.full(vcap, INF, cp.int64)
            self.n_free = self.n_keys = 0
            self.sorted = True
            self.dropped = 0  # released empty versions: no block, id not reused
            self.e_nbr = self.e_lab = self.e_el = cp.empty(1, cp.int32)
            self.e_ct = self.e_dt = self.e_ts = self.e_tsin = cp.empty(1, cp.int64)
            self._view = None
            # the fused small-batch path's scratch (gpu/mvg.cu GuSmall), its counters and its
            # copy space (grown by doubling); only the updater's stream uses them, one batch after another
            self._arena = cp.empty(self._small[3], cp.int64)
            self._stats = cp.empty(S_COUNT, cp.int64)
            self._live, self._incl = cp.empty(1024, cp.int32), cp.empty(1024, cp.int64)
            self._tiles = cp.empty(1024 // THREADS + 2, cp.int64)
            self._batch, self._counters, self._lookups = Staging(), Staging(), Staging()
            self._slab, self._slab_at = cp.empty(0, cp.int32), 0  # new version ids of deferred small batches
            self._small_apply = DirectLaunch(_kernel("gu_small_apply"), 16, self._dtype.itemsize // 8)
            self._counters.host_view(S_COUNT)  # where gu_small_apply writes its counters (pinned)
            self._pending: Replaced | None = None  # the token of a deferred batch not yet settled
            self._deferred = False  # a small batch's launches were not waited for (its staging is in use)
            # the largest batch (in rows: 2 per op) planned in one block (0: none), and the largest
            # copy (in entries) that the block also does (larger ones take five grid launches)
            self.small_rows, self.fused_copy = self._small[0], self._small[1]
            self.solo_copy = SOLO_COPY
            # held while arrays are swapped (growth, new vertices) and while a reader on another
            # stream takes the view and enqueues its launch: a growth then waits for that launch
            self.swap = threading.RLock()
            indptr = indptr.astype(cp.int64)
            cap = cp.empty(max(n, 1), cp.int64)
            _launch("mvg_build_plan", n, (self.view(), indptr, cap))
            cap_end = cp.cumsum(cap[:n], dtype=cp.int64)
            self.bump = int(cap_end[-1]) if n else 0
            self.max_size = int(cp.diff(indptr).max()) if n else 0  # the largest version ever made
            size = self.bump + self.bump // 2 + 4096
            self.e_nbr, self.e_lab, self.e_el = (cp.empty(size, cp.int32) for _ in range(3))
            self.e_ct, self.e_dt = (cp.empty(size, cp.int64) for _ in range(2))
            if self.timed:
                self.e_ts, self.e_tsin = (cp.empty(size, cp.int64) for _ in range(2))
            self._view = None
            g = self.view()
            _launch("mvg_build_versions", n, (g, indptr, cap_end))
            _launch("mvg_build_entries", m, (g, i64(m), indptr, nbrs.astype(cp.int32, copy=False),
                                             None if els is None else els.astype(cp.int32, copy=False),
                                             None if ts is None else cp.ascontiguousarray(ts, cp.int64)))
        self.stream.synchronize()

    @classmethod
    def from_graph(cls, g: Graph, timed: bool = False) -> "DeviceMVG":
        """timed: the entries keep their arcs' ts, the initial ones g.edge_ts's."""
        gk, nbrs, els = g.grouped
        ts = None
        if timed:
            from csmd.cpu.mvg import entry_ts

            ts = cp.asarray(np.stack(entry_ts(g, gk // max(g.num_labels, 1), nbrs)))
        return cls(cp.asarray(g.labels), cp.asarray(g.indptr), cp.asarray(nbrs),
                   cp.asarray(els) if g.elabels.any() else None, g.directed, ts)

    @classmethod
    def from_device_graph(cls, dg) -> "DeviceMVG":
        """From a gpu.device_graph.DeviceGraph (its label-grouped order)."""
        return cls(dg.labels, dg.indptr, dg.gadj, dg.gadj_el)

    # ---- the view kernels read --------------------------------------------------------------
    def view(self) -> np.void:
        """The MVGView kernel argument (valid until the next growth or add_vertices; a reader on
        another stream takes it and launches under `swap`). A numpy structured scalar: CuPy
        passes it by value at a third of the host cost of a one-element array."""
        if self._view is None:
            v = np.zeros(1, self._dtype)
            for name in self._dtype.names:
                untimed = name in ("e_ts", "e_tsin") and not self.timed  # null: the kernels write no ts
                v[name] = self.n if name == "n" else 0 if untimed else getattr(self, name).data.ptr
            self._view, self._view_words = v[0], v.view(np.int64)
        return self._view

    def view_words(self) -> np.ndarray:
        """view() as int64 words: a DirectLaunch's struct."""
        self.view()
        return self._view_words

    @property
    def live_versions(self) -> int:
        self._settle()
        return self.n_versions - self.n_free - self.dropped

    @property
    def memory_bytes(self) -> int:
        """Bytes the pool holds (vertices, version table, free list, entries)."""
        return sum(a.nbytes for a in (self.labels, self.cur, self.v_ct_min, self.v_dt_max, self.v_start, self.v_prev,
                                      self.v_size, self.v_cls, self.v_live, self.v_ct_hi, self.free_keys, self.e_nbr,
                                      self.e_lab, self.e_el, self.e_ct, self.e_dt, self.e_ts, self.e_tsin))

    def _reserve(self, vertices: int = 0, versions: int = 0, entries: int = 0, free: int = 0) -> None:
        """Make room for that many vertices, versions, entries and free-list keys: twice the size, or
        half as much again as needed if that is more (the next batch's worst case is about as
        large: one growth, a device-wide sync, rather than one per batch)."""
        grow = [(names, need, fill) for names, need, fill in (
            (("labels", "cur"), vertices, None),
            (("v_ct_min", "v_dt_max", "v_start", "v_prev", "v_size", "v_cls", "v_live", "v_ct_hi"), versions, None),
            (("free_keys",), free, INF),
            (("e_nbr", "e_lab", "e_el", "e_ct", "e_dt") + (("e_ts", "e_tsin") if self.timed else ()), entries, None))
            if need > len(getattr(self, names[0]))]
        if not grow:
            return
        with self.swap:
            cp.cuda.Device().synchronize()  # readers on other streams may still use the old arrays
            for names, need, fill in grow:
                size = max(need + need // 2, 2 * len(getattr(self, names[0])))
                for name in names:
                    f = -1 if name == "cur" else 0 if name == "labels" else fill
                    setattr(self, name, _grown(getattr(self, name), size, f))
            self._view = None

    # ---- vertices ------------------------------------------------------------------------------
    def add_vertices(self, labels) -> int:
        """New vertices with these labels and no version yet; returns the first new id."""
        labels = np.asarray(labels, np.int32)
        first = self.n
        with self.stream, self.swap:
            self._reserve(vertices=first + len(labels))
            self.labels[first: first + len(labels)] = cp.asarray(labels)
            self.n += len(labels)
            self._view = None
        return first

    # ---- the graph updater ---------------------------------------------------------------------
    def apply(self, seq, a, b, label, sign, ts=None) -> Replaced:
        """Apply one batch of edge ops (host arrays in update order, each op valid where it
        stands; sign > 0 inserts), as csmd.mvg.MultiVersionGraph.apply does; ts: under event
        time, each op's (a -> b, b -> a) ts (UpdateBatch.storage_ts).

        Per touched vertex the deletions before its first insertion set dt in place; from
        that insertion on it gets a new version: its live entries merged with the inserted
        ones (sorted by (neighbour label, neighbour, ct)), later deletions closing entries.
        Returns the replaced versions as a token for the GC.
        """
        self._settle()
        k = len(seq)
        if not k:
            return Replaced(None)
        rows = 8 if self.timed else 6
        host = self._batch.host_view(rows * k).reshape(rows, k)
        host[0], host[1], host[2], host[3], host[4] = seq, a, b, label, sign
        host[5] = flip(label) if self.directed else label  # as b sees the edge
        if self.timed:
            host[6], host[7] = ts[:, 0], ts[:, 1]
        self.has_edge_labels = self.has_edge_labels or bool(host[3].any())
        R, n_ins = 2 * k, 2 * int(np.count_nonzero(host[4] > 0))
        with self.stream:
            batch = self._batch.upload(rows * k, self.stream)  # the one upload
            if R <= self.small_rows:
                return self._apply_small(batch, k, R, n_ins)
            g = self.view()
            keys, stats = cp.empty(R, cp.int64), cp.empty(S_COUNT, cp.int64)
            _launch("gu_keys", k, (i64(k), batch, keys, stats))
            keys.sort()
            flags = cp.empty((2, R), cp.int32)  # row starts a vertex's segment; row inserts
            head, ins = flags
            _launch("gu_rows", R, (i64(R), i64(k), batch, keys, head, ins))
            seg, insc = cp.cumsum(flags, axis=1, dtype=cp.int32)
            row0, ts0, first = cp.empty(R + 1, cp.int32), cp.empty(R, cp.int64), cp.empty(R, cp.int32)
            _launch("gu_segments", R, (i64(R), head, seg, row0, ts0))
            _launch("gu_split", R, (g, i64(R), i64(k), batch, keys, seg, insc, ins, row0, ts0, first))
            # the new versions: sizes, then ids and blocks from the free lists or the bump pointers
            req = cp.empty(R, cp.int64)
            s_old, s_size, s_ndel, s_slot = (cp.empty(R, cp.int32) for _ in range(4))
            _launch("gu_plan", R, (g, i64(R), keys, seg, insc, ins, row0, ts0, first, req, s_old, s_size, s_ndel,
                                   stats))
            req.sort()
            if not self.sorted:  # released keys and taken holes since the last allocation
                self.free_keys[: self.n_keys].sort()
                self.n_keys, self.sorted = self.n_free, True
            pos, sizes = cp.empty(R, cp.int64), cp.empty((3, R), cp.int64)
            _launch("gu_alloc_rank", R, (g, i64(R), req, self.free_keys, i64(self.n_free), s_old, pos, sizes))
            ends = cp.cumsum(sizes, axis=1, dtype=cp.int64)
            fresh_n, fresh_end, old_end = ends
            q_vid, q_old, q_start = cp.empty(R, cp.int32), cp.empty(R, cp.int32), cp.empty(R, cp.int64)
            _launch("gu_alloc", R, (g, i64(R), req, self.free_keys, pos, fresh_n, fresh_end, sizes,
                                    i64(self.n_versions), i64(self.bump), s_old, s_slot, q_vid, q_start, q_old))
            _launch("gu_stats", 1, (i64(R), ends, stats))
            st = self._allocated(stats)
            n_new, total = st[S_NEW], st[S_COPY]
            if not n_new:
                return Replaced(None)
            g = self.view()
            _launch("gu_versions", n_new, (g, i64(n_new), req, q_vid, q_start, ts0, s_old, s_size, s_ndel))
            # insertion rows in entry order per vertex: (insertion first, vertex, neighbour label, neighbour, time)
            pair, owner = cp.empty(R, cp.int64), cp.empty(R, cp.int64)
            _launch("gu_ins_keys", R, (g, i64(R), i64(k), batch, keys, pair, owner))
            p1 = cp.argsort(pair, kind="stable")
            perm = p1[cp.argsort(owner[p1], kind="stable")][:n_ins]
            i_pair = pair[perm]
            # copy + merge: old live entries and insertions straight to their final positions
            live = cp.empty(total + 1, cp.int32)
            _launch("gu_copy_flags", total, (g, i64(total), i64(n_new), old_end, q_old, live))
            incl = cp.cumsum(live, dtype=cp.int64)
            _launch("gu_copy", total, (g, i64(total), i64(n_new), old_end, q_old, q_start, req, live, incl, row0,
                                       insc, ins, i_pair))
            _launch("gu_insert", n_ins, (g, i64(n_ins), i64(k), batch, keys, perm, i_pair, seg, row0, insc, ins,
                                         s_slot, old_end, q_old, q_vid, q_start, live, incl))
            _launch("gu_close", R, (g, i64(R), i64(k), batch, keys, seg, ts0, first, s_slot, q_start, s_size))
            _launch("gu_publish", n_new, (g, i64(n_new), req, keys, row0, ts0, q_vid, q_old))
            vids = q_old[:n_new].copy()
        return Replaced(vids, st[S_REPLACED_AT], st[S_REPLACED] + st[S_EMPTY], st[S_REPLACED])

    def _apply_small(self, batch: cp.ndarray, k: int, R: int, n_ins: int) -> Replaced:
        """apply for a batch of at most GU_SMALL_ROWS rows, planned in one block (gpu/mvg.cu);
        where it copies at most GU_FUSED_COPY entries the same block writes it, else five grid
        launches do (launched where the batch's worst case copies more).

        The copy must not run past the pool. Where the batch's worst case fits (each insertion row
        a vertex of its own, copying at most the largest array so far and in all at most every
        entry of the pool, into blocks of at most twice the size, plus 32), room for it is made
        first and the batch's launches follow one another with no wait: its counters land in
        pinned memory, read at the next apply (`_settle`), and the returned token is pending until
        then. Else gu_small_plan runs and the counters are read back before the write, as the
        multi-kernel path does."""
        rows, _, threads, _ = self._small
        copy = min(n_ins * self.max_size, self.bump)
        entries = 2 * copy + 34 * n_ins
        defer = n_ins and (self.bump + entries <= len(self.e_nbr) or entries <= DEFER_GROWTH) and (
            copy < len(self._live) or copy <= DEFER_GROWTH)
        if defer:
            self._reserve(versions=self.n_versions + n_ins, entries=self.bump + entries)
            self._copy_space(copy)
        sort_free = 0
        if not self.sorted:  # as above; the small kernels sort a short free list themselves
            if self.n_keys <= rows:
                sort_free = self.n_keys
            else:
                self.free_keys[: self.n_keys].sort()
            self.n_keys, self.sorted = self.n_free, True
        smem = 8 * _pow2(max(R, sort_free))
        self._deferred = True  # the batch's upload may still be in flight
        if defer:
            if self._slab_at + n_ins > len(self._slab):
                self._slab, self._slab_at = cp.empty(max(VID_SLAB, n_ins), cp.int32), 0
            slab, at = self._slab, self._slab_at
            self._slab_at += n_ins
            grid = copy > self.solo_copy and copy > self.fused_copy
            fused_copy = self.fused_copy if grid else INF
            self._small_apply(1, threads, self.stream.ptr, (
                R, k, batch.data.ptr, self._arena.data.ptr, self._stats.data.ptr, self.free_keys.data.ptr, self.n_free,
                sort_free, self.n_versions, self.bump, n_ins, fused_copy, self._live.data.ptr, self._incl.data.ptr,
                slab.data.ptr + 4 * at, self._counters.ptr), self.view_words(), smem)
            if grid:  # (the kernels do nothing where the block wrote the batch)
                self._write_mid(batch, k, R, n_ins, n_ins, copy, slab[at: at + n_ins])
            self._pending = Replaced(slab, mvg=self, at=at, n=n_ins)
            return self._pending
        plan = (self.view(), i64(R), i64(k), batch, self._arena, self._stats, self.free_keys, i64(self.n_free),
                i64(sort_free), i64(self.n_versions), i64(self.bump))
        _kernel("gu_small_plan")((1,), (threads,), plan + (np.uint64(0),), shared_mem=smem)
        if not n_ins:  # deletions only: applied in place, nothing allocated
            return Replaced(None)
        st = self._allocated(self._stats)
        self._copy_space(st[S_COPY])
        vids = cp.empty(st[S_NEW], cp.int32)
        if st[S_COPY] <= self.fused_copy:
            _kernel("gu_small_write")((1,), (threads,), (self.view(), i64(R), i64(k), batch, self._arena, self._stats,
                                                         i64(n_ins), self._live, self._incl, vids))
        else:
            self._write_mid(batch, k, R, n_ins, st[S_NEW], st[S_COPY], vids)
        return Replaced(vids, st[S_REPLACED_AT], st[S_REPLACED] + st[S_EMPTY], st[S_REPLACED])

    def _write_mid(self, batch: cp.ndarray, k: int, R: int, n_ins: int, n_new: int, copy: int,
                   vids: cp.ndarray) -> None:
        """The write of a batch planned in one block, over the grid (the gu_mid_* kernels):
        n_new and copy bound the new versions and the copied entries (the kernels read both from
        the counters), and size the grids."""
        g, arena, stats, live, incl = self.view(), self._arena, self._stats, self._live, self._incl
        _launch("gu_mid_flags", max(n_new, copy + 1), (g, i64(R), arena, stats, live, self._tiles))
        _launch("gu_mid_incl", copy + 1, (stats, live, self._tiles, incl))
        _launch("gu_mid_copy", max(copy, n_ins), (g, i64(R), i64(k), batch, arena, stats, i64(n_ins), live, incl))
        _launch("gu_mid_close", R, (g, i64(R), i64(k), batch, arena, stats))
        _launch("gu_mid_publish", n_new, (g, arena, stats, vids))

    def _copy_space(self, total: int) -> None:
        """Room for a copy of `total` entries in the small path's flags and prefix sums."""
        if total + 1 > len(self._live):
            size = max(total + 1, 2 * len(self._live))
            self._live, self._incl = cp.empty(size, cp.int32), cp.empty(size, cp.int64)
            self._tiles = cp.empty(size // THREADS + 2, cp.int64)  # gu_mid_flags' per-block counts

    def _settle(self) -> None:
        """Wait for the last small batch's launches (its staging buffers are free again) and, if
        it was deferred, account for its counters and fill in its token."""
        if not self._deferred:
            return
        self._deferred = False
        self.stream.synchronize()
        token, self._pending = self._pending, None
        if token is not None:
            st = self._counters.host[:S_COUNT].tolist()
            self._account(st)
            token._fill(st)

    def _allocated(self, stats: cp.ndarray) -> list[int]:
        """Read back a batch's counters (the one sync of an apply) and account for its allocation,
        growing the pool if needed."""
        st = self._counters.download(stats, S_COUNT, self.stream).tolist()
        self._account(st)
        self._reserve(versions=self.n_versions, entries=self.bump)
        return st

    def _account(self, st: list[int]) -> None:
        """A batch's allocation: versions and entries taken from the bump pointers, free-list keys
        taken, the largest version."""
        n_new = st[S_NEW]
        if n_new > st[S_FRESH]:  # free-list keys were taken: holes until the next sort
            self.n_free -= n_new - st[S_FRESH]
            self.sorted = False
        self.n_versions += st[S_FRESH]
        self.bump += st[S_FRESH_ENTRIES]
        self.max_size = max(self.max_size, st[S_MAX_SIZE])

    @staticmethod
    def warm_release() -> None:
        """Compile (or load) the concatenations release() makes of several tokens' version ids,
        equal-sized or not: CuPy builds them on first use, which put them in a stream's batch."""
        for count in (2, 3, 8, 16, 64):  # CuPy picks its kernel by the number of arrays and their sizes
            for sizes in ([1] * count, [1, 2] * (count // 2)):
                cp.concatenate([cp.zeros(n, cp.int32) for n in sizes])

    def release(self, tokens) -> None:
        """Return the versions of these tokens to the pool's free lists (a kernel and a sort)."""
        tokens = [t for t in tokens if t.count]
        if not tokens:
            return
        with self.stream:
            vids = tokens[0].vids if len(tokens) == 1 else cp.concatenate([t.vids for t in tokens])
            m = len(vids)
            self._reserve(free=self.n_keys + m)
            _launch("mvg_release", m, (self.view(), i64(m), vids, self.free_keys[self.n_keys:]))
        self.n_keys += m
        self.sorted = False  # sorted at the next allocation, with the holes it leaves
        self.n_free += sum(t.blocks for t in tokens)
        self.dropped += sum(t.count - t.blocks for t in tokens)

    # ---- reads ------------------------------------------------------------------------------------
    def _args(self, *arrays):
        return [cp.asarray(x, dtype=t) for x, t in arrays]

    def versions_at(self, v, T) -> np.ndarray:
        """The version of each v that a read at T uses (-1: none)."""
        with self.stream:
            v, T = self._args((v, cp.int32), (T, cp.int64))
            out = cp.empty(len(v), cp.int32)
            _launch("mvg_versions_at", len(v), (self.view(), i64(len(v)), v, T, out))
            return out.get()

    def label_ranges_at(self, v, lab, T):
        """label_range_at for each (v, lab, T): (start, size) host arrays."""
        with self.stream:
            v, lab, T = self._args((v, cp.int32), (lab, cp.int32), (T, cp.int64))
            start, size = cp.empty(len(v), cp.int64), cp.empty(len(v), cp.int32)
            _launch("mvg_label_ranges_at", len(v), (self.view(), i64(len(v)), v, lab, T, start, size))
            return start.get(), size.get()

    def edges_at(self, a, b, T, el=None, check_el=False):
        """edge_at for each (a, b, T[, el]): host arrays (entry position, edge label), -1
        where there is no such edge. One upload, one read-back, both through pinned buffers."""
        m = len(a)
        if not m:
            return np.zeros(0, np.int64), np.zeros(0, np.int32)
        q = self._lookups.host_view(6 * m)[: 4 * m].reshape(4, m)  # then room for the results
        q[0], q[1], q[2], q[3] = a, b, T, 0 if el is None else el
        with self.stream:
            dev = self._lookups.upload(4 * m, self.stream)
            self._edges_at(dev, m, check_el, self.stream, np.uint64(dev.data.ptr + 32 * m))
            host = self._lookups.read_back(4 * m, 2 * m, self.stream)
        return host[:m].copy(), host[m:].astype(np.int32)

    def edges_at_async(self, a, b, T, el=None, check_el=False, stream=None):
        """edges_at launched on `stream` (default: the updater's), without waiting: device arrays
        (positions, labels as int64)."""
        m = len(a)
        q = np.empty((4, m), np.int64)
        q[0], q[1], q[2], q[3] = a, b, T, 0 if el is None else el
        stream = stream or self.stream
        with stream:
            out = cp.empty(2 * m, cp.int64)
            self._edges_at(cp.asarray(q), m, check_el, stream, out)
        return out[:m], out[m:]

    def _edges_at(self, q: cp.ndarray, m: int, check_el, stream, out) -> None:
        """Positions then labels in out (2 m int64: an array, or its address); q: the rows a, b,
        T, el on the device."""
        with stream, self.swap:  # a reader on another stream takes the view under swap
            _launch("mvg_edges_at", m, (self.view(), i64(m), q, np.int32(check_el), out))

    def live_edge_labels(self, a, b) -> np.ndarray:
        """Label of the edge {a, b} now, -1 where there is none (int32)."""
        return self.edges_at(a, b, np.full(len(a), NOW, np.int64))[1]

    def _entries(self, vid: int):
        start, size = (int(x) for x in (self.v_start[vid], self.v_size[vid]))
        return slice(start, start + size)

    def neighbors_at(self, v: int, T: int):
        """(nbr, edge label) of the entries of v visible at T (host arrays, in entry order)."""
        vid = int(self.versions_at([v], [T])[0])
        if vid < 0:
            return np.zeros(0, np.int32), np.zeros(0, np.int32)
        with self.stream:
            s = self._entries(vid)
            vis = ((self.e_ct[s] < T) & (T <= self.e_dt[s])).get()
            return self.e_nbr[s].get()[vis], self.e_el[s].get()[vis]

    def live_neighbors(self, v: int) -> np.ndarray:
        with self.stream:
            vid = int(self.cur[v])
            if vid < 0:
                return np.zeros(0, np.int32)
            s = self._entries(vid)
            return self.e_nbr[s][self.e_dt[s] == INF].get()

    def live_edges(self):
        """(src, dst, label) host arrays of every edge alive now, src < dst."""
        with self.stream:
            cur = self.cur[: self.n]
            end = cp.cumsum(cp.where(cur >= 0, self.v_size[cp.maximum(cur, 0)], 0), dtype=cp.int64)
            total = int(end[-1]) if self.n else 0
            src, dst, label = cp.empty(total, cp.int64), cp.empty(total, cp.int64), cp.empty(total, cp.int32)
            _launch("mvg_live_edges", total, (self.view(), i64(total), end, src, dst, label))
            keep = src >= 0
            return src[keep].get(), dst[keep].get(), label[keep].get()
