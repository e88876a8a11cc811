"""The device multi-version graph (gpu/device_mvg.py) against the CPU one (csmd.mvg).

Skipped without CUDA. Random valid streams at the internal-id level (inserts, deletes, a
pair deleted and re-inserted inside one batch, edge labels, hubs, new vertices) go to both
graphs; after every batch, reads at timestamps in and around the batch (version contents
with lifetimes, label ranges, edge look-ups) and the latest state must agree. Then: memory
stays flat over a long stream with the GC releasing versions, and reads at batch k on one
stream stay right while batch k+1 is applied on another.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from csmd.backends import gpu_unavailable_reason
from csmd.pipeline.gc import GarbageCollector
from csmd.model.graph import Graph
from csmd.cpu.mvg import MultiVersionGraph

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason()))]

NUM_STREAMS = 200
BATCH_SIZES = (1, 7, 64, 1024)
OPS = {1: 150, 7: 300, 64: 640, 1024: 3072}  # updates per stream, by batch size
LAG = 3  # batches the GC pointer trails the newest batch; reads go back that far


def device_mvg(g: Graph, path: str = "auto"):
    """path: which apply every batch takes. auto: by its size and its copy (gpu/mvg.cu's
    GU_SMALL_ROWS and GU_FUSED_COPY); block: planned and written in one block (up to
    GU_SMALL_ROWS rows); mid: planned in one block, written over the grid; grid: the multi-kernel
    path, which otherwise only takes batches of more than GU_SMALL_ROWS / 2 ops."""
    from csmd.gpu.device_mvg import DeviceMVG

    dm = DeviceMVG.from_graph(g)
    if path == "grid":
        dm.small_rows = 0
    elif path in ("block", "mid"):
        dm.fused_copy = dm.solo_copy = 1 << 62 if path == "block" else -1
    return dm


# ---- a random valid stream ---------------------------------------------------------------------
class Stream:
    """Edges as (min, max) -> label; every op it makes is valid where it stands."""

    def __init__(self, rng: random.Random, n: int, labels: int, elabels: int):
        self.rng, self.labels, self.elabels = rng, labels, elabels
        self.vlabel = [rng.randrange(labels) for _ in range(n)]
        self.hubs = rng.sample(range(n), rng.randint(1, 3))
        self.live: dict[tuple[int, int], int] = {}
        self.pairs: list[tuple[int, int]] = []  # live pairs, for a uniform choice
        self.where: dict[tuple[int, int], int] = {}
        for _ in range(rng.randint(n, 4 * n)):
            self._set(self._new_pair(), rng.randrange(elabels))
        self.seq = 0

    def graph(self) -> Graph:
        e = np.array([(a, b, lab) for (a, b), lab in self.live.items()], np.int64).reshape(-1, 3)
        return Graph.from_edges(self.vlabel, e[:, 0], e[:, 1], e[:, 2])

    def _set(self, pair, label) -> None:
        if label is None:
            del self.live[pair]
            i = self.where.pop(pair)
            last = self.pairs.pop()
            if last != pair:
                self.pairs[i] = last
                self.where[last] = i
        else:
            self.live[pair] = label
            self.where[pair] = len(self.pairs)
            self.pairs.append(pair)

    def _vertex(self) -> int:
        if self.rng.random() < 0.3:
            return self.rng.choice(self.hubs)
        return self.rng.randrange(len(self.vlabel))

    def _new_pair(self):
        while True:
            a, b = self._vertex(), self._vertex()
            if a != b and (min(a, b), max(a, b)) not in self.live:
                return min(a, b), max(a, b)

    def new_vertices(self) -> list[int]:
        k = self.rng.choice((0, 0, 0, 1, 2))
        labels = [self.rng.randrange(self.labels) for _ in range(k)]
        self.vlabel += labels
        return labels

    def batch(self, size: int):
        """(seq, a, b, label, sign) arrays of the next `size` ops; seq has gaps (ignored records)."""
        rng, ops, touched = self.rng, [], []
        for _ in range(size):
            r = rng.random()
            if r < 0.25 and touched:  # the same pair again in this batch: delete <-> re-insert
                pair = rng.choice(touched)
                sign = -1 if pair in self.live else 1
            elif r < 0.62 or not self.pairs:
                pair, sign = self._new_pair(), 1
            else:
                pair, sign = rng.choice(self.pairs), -1
            label = rng.randrange(self.elabels) if sign > 0 else self.live[pair]
            self._set(pair, label if sign > 0 else None)
            touched.append(pair)
            self.seq += 1 + (rng.random() < 0.1)
            a, b = pair if rng.random() < 0.5 else pair[::-1]
            ops.append((self.seq, a, b, label, sign))
        return tuple(np.array(x, np.int64) for x in zip(*ops))


# ---- comparing the two graphs --------------------------------------------------------------------
def cpu_entries(mvg: MultiVersionGraph, s: int, e: int):
    ct, dt = mvg.lifetimes
    return list(zip(mvg.e_nbr.a[s:e].tolist(), mvg.e_el.a[s:e].tolist(), ct[s:e].tolist(), dt[s:e].tolist()))


class DeviceCopy:
    """The device arrays on the host, read once per check (on the updater's stream: after its writes)."""

    def __init__(self, dm):
        with dm.stream:
            self.nbr, self.lab, self.el, self.ct, self.dt, self.start, self.size = (
                x.get() for x in (dm.e_nbr, dm.e_lab, dm.e_el, dm.e_ct, dm.e_dt, dm.v_start, dm.v_size))

    def entries(self, s: int, e: int):
        return list(zip(self.nbr[s:e].tolist(), self.el[s:e].tolist(), self.ct[s:e].tolist(), self.dt[s:e].tolist()))

    def version(self, vid: int):
        s = int(self.start[vid])
        return self.entries(s, s + int(self.size[vid]))


def check(mvg: MultiVersionGraph, dm, st: Stream, rng: np.random.Generator, t_lo: int, ops, queries: int = 80):
    first, last = int(ops[0][0]), int(ops[0][-1])
    n = mvg.n
    ts = np.r_[rng.integers(t_lo, last + 3, queries), first - 1, first, first + 1, last, last + 1]
    ts = np.maximum(ts, t_lo)
    q = len(ts)
    touched = np.r_[ops[1], ops[2]]
    vs = np.where(rng.random(q) < 0.5, rng.choice(touched, q), rng.integers(0, n, q))
    dev = DeviceCopy(dm)
    # whole versions, entries with their lifetimes
    cpu_vid, dev_vid = mvg.version_at(vs.copy(), ts), dm.versions_at(vs, ts)
    assert ((cpu_vid >= 0) == (dev_vid >= 0)).all()
    for cv, dv in zip(cpu_vid.tolist(), dev_vid.tolist()):
        if cv >= 0:
            assert dev.version(dv) == cpu_entries(mvg, mvg.v_es.a[cv], mvg.v_ee.a[cv])
    for v, t in zip(vs[:5].tolist(), ts[:5].tolist()):
        nbr, el = dm.neighbors_at(v, t)
        vid = mvg.version_at(np.array([v]), np.array([t]))[0]
        want = [] if vid < 0 else [(w, e) for w, e, c, d in cpu_entries(mvg, mvg.v_es.a[vid], mvg.v_ee.a[vid])
                                   if c < t <= d]
        assert list(zip(nbr.tolist(), el.tolist())) == want
    # label ranges: the same entries (visible at T or not), every one with that label
    for lab in range(st.labels + 1):
        start, size = dm.label_ranges_at(vs, np.full(q, lab), ts)
        cs, ce = mvg.ranges(vs, lab, ts)
        for i in range(q):
            got = dev.entries(start[i], start[i] + size[i])
            assert got == cpu_entries(mvg, cs[i], ce[i])
            assert (dev.lab[start[i]: start[i] + size[i]] == lab).all()
    # edge look-ups: the batch's pairs both ways, live pairs, random pairs
    pa = np.r_[ops[1], ops[2], rng.integers(0, n, q)]
    pb = np.r_[ops[2], ops[1], rng.integers(0, n, q)]
    if st.pairs:
        live = np.array([st.pairs[i] for i in rng.integers(0, len(st.pairs), q)])
        pa, pb = np.r_[pa, live[:, 0]], np.r_[pb, live[:, 1]]
    pt = np.maximum(rng.integers(t_lo, last + 3, len(pa)), t_lo)
    want = mvg.edge_label_between(pa, pb, pt)
    pos, label = dm.edges_at(pa, pb, pt)
    assert (label == want).all()
    assert (dev.el[pos[pos >= 0]] == want[pos >= 0]).all()
    el = np.where(rng.random(len(pa)) < 0.5, want, rng.integers(0, st.elabels, len(pa)))
    pos, _ = dm.edges_at(pa, pb, pt, el, check_el=True)
    assert ((pos >= 0) == ((want >= 0) & (want == el))).all()
    # the latest state
    assert (dm.live_edge_labels(pa, pb) == mvg.live_edge_label(pa, pb)).all()
    src, dst, lab = dm.live_edges()
    assert sorted(zip(src.tolist(), dst.tolist(), lab.tolist())) == sorted(
        zip(*(x.tolist() for x in mvg.live_edges())))
    for v in vs[:8].tolist():
        assert sorted(dm.live_neighbors(v).tolist()) == sorted(mvg.live_neighbors(v).tolist())


@pytest.mark.parametrize("seed", range(NUM_STREAMS), ids=lambda s: f"seed{s}")
def test_random_stream_matches_cpu_mvg(seed, monkeypatch):
    rnd = random.Random(seed)
    size = BATCH_SIZES[seed % len(BATCH_SIZES)]
    st = Stream(rnd, rnd.randint(30, 300), rnd.randint(1, 4), rnd.randint(1, 3))
    g = st.graph()
    # the one-block kernels on half of the seeds, the one-block plan with the grid's write and the
    # multi-kernel path on a quarter each; of the first two, some may not grow the pool for a
    # batch's worst case (hubs then take the path that reads the counters before the write)
    if seed % 8 in (2, 3, 5):
        monkeypatch.setattr("csmd.gpu.device_mvg.DEFER_GROWTH", 0)
    path = (("auto",) * 4 + ("mid", "mid", "grid", "grid"))[seed % 8]
    mvg, dm = MultiVersionGraph(g), device_mvg(g, path)
    gc = GarbageCollector()
    rng = np.random.default_rng(seed)
    firsts, released = [], 0
    held = []  # odd seeds read a token only after the next batch is applied (a deferred one settles then)
    for _ in range(OPS[size] // size):
        for lab in st.new_vertices():
            mvg.add_vertices(np.array([lab], np.int32))
            assert dm.add_vertices([lab]) == mvg.n - 1
        ops = st.batch(size)
        firsts.append(int(ops[0][0]))
        held.append((dm.apply(*ops), mvg.apply(*ops)))
        if seed % 2 and len(held) < 2:
            continue
        token, replaced = held.pop(0)
        assert token.count == sum(len(t) for t, _ in replaced)
        if token.count:
            assert token.replaced_at == max(at for _, at in replaced)
            gc.replaced([(token, token.replaced_at)])
        # reads from LAG batches back are still possible; the GC frees what is older
        t_lo = firsts[max(0, len(firsts) - LAG)]
        free = gc.finished(gc.pointer, t_lo)
        dm.release(free)
        released += sum(t.count for t in free)
        if not seed % 2:  # (this settles the newest token)
            assert dm.live_versions == mvg.v_vertex.n - released
        check(mvg, dm, st, rng, t_lo, ops)
    assert dm.live_versions == mvg.v_vertex.n - released


@pytest.mark.parametrize("ops,path,defer", [
    (2500, "auto", True), (2500, "auto", False), (2500, "block", True), (2500, "mid", False),
    (2500, "grid", True), (8000, "auto", True), (8000, "auto", False), (8000, "block", True),
    (8000, "block", False)])
def test_large_one_block_batches_match_cpu_mvg(ops, path, defer, monkeypatch):
    """Batches of more than the old one-block limit (2,048 ops) and at most GU_SMALL_ROWS / 2
    (the one-block plan, then the grid's write or the block's), on few vertices with hubs: many
    deletions, re-insertions and several versions per vertex in one batch."""
    if not defer:
        monkeypatch.setattr("csmd.gpu.device_mvg.DEFER_GROWTH", 0)
    seed = ops + len(path) + defer
    rnd = random.Random(seed)
    st = Stream(rnd, rnd.randint(200, 400), 3, 2)
    g = st.graph()
    mvg, dm = MultiVersionGraph(g), device_mvg(g, path)
    assert 2 * ops <= dm._small[0]  # gpu/mvg.cu's GU_SMALL_ROWS
    gc, rng, firsts = GarbageCollector(), np.random.default_rng(seed), []
    for _ in range(3):
        ops_ = st.batch(ops)
        firsts.append(int(ops_[0][0]))
        token, replaced = dm.apply(*ops_), mvg.apply(*ops_)
        assert token.count == sum(len(t) for t, _ in replaced)
        if token.count:
            assert token.replaced_at == max(at for _, at in replaced)
            gc.replaced([(token, token.replaced_at)])
        t_lo = firsts[max(0, len(firsts) - 2)]
        dm.release(gc.finished(gc.pointer, t_lo))
        check(mvg, dm, st, rng, t_lo, ops_)


# ---- memory over a long stream -------------------------------------------------------------------------
class PowerLawStream:
    """Edges drawn with power-law endpoint weights; each batch deletes random live edges and
    inserts as many new ones drawn the same way (distinct pairs: any order is valid), so the
    degree distribution stays what it was."""

    def __init__(self, n: int, m: int, seed: int):
        self.n, self.rng = n, np.random.default_rng(seed)
        w = (np.arange(n) + 1.0) ** -0.7
        self.p = w / w.sum()
        self.live: set[int] = set()
        self.keys = self._fresh(m)
        self.seq = 0

    def _fresh(self, k: int) -> np.ndarray:
        """k new pairs (as lo * n + hi keys), added to the live set."""
        out: list[int] = []
        while len(out) < k:
            a, b = self.rng.choice(self.n, (2, 2 * k), p=self.p)
            lo, hi = np.minimum(a, b), np.maximum(a, b)
            for key in (lo * self.n + hi)[lo != hi].tolist():
                if key not in self.live and len(out) < k:
                    self.live.add(key)
                    out.append(key)
        return np.array(out, np.int64)

    def graph(self) -> Graph:
        return Graph.from_edges(np.zeros(self.n, np.int32), self.keys // self.n, self.keys % self.n)

    def batch(self, size: int):
        half = size // 2
        idx = self.rng.choice(len(self.keys), half, replace=False)
        gone, new = self.keys[idx], self._fresh(half)
        self.live.difference_update(gone.tolist())
        self.keys[idx] = new
        key = np.r_[gone, new]
        sign = np.r_[np.full(half, -1), np.ones(half, np.int64)]
        order = self.rng.permutation(2 * half)
        key, sign = key[order], sign[order]
        seq = self.seq + 1 + np.arange(2 * half)
        self.seq += 2 * half
        return seq, key // self.n, key % self.n, np.zeros(2 * half, np.int64), sign


def test_memory_stays_flat_over_a_long_stream():
    n, m, updates, size = 100_000, 500_000, 2_000_000, 4096
    s = PowerLawStream(n, m, seed=7)
    dm = device_mvg(s.graph())
    gc = GarbageCollector()
    held, bump, firsts = [], [], []
    for _ in range(updates // size):
        ops = s.batch(size)
        firsts.append(int(ops[0][0]))
        token = dm.apply(*ops)
        if token.count:
            gc.replaced([(token, token.replaced_at)])
        dm.release(gc.finished(gc.pointer, firsts[max(0, len(firsts) - 2)]))
        held.append(dm.memory_bytes)
        bump.append(dm.bump)
    warm, half = len(held) // 10, len(held) // 2
    print(f"pool bytes {held[0]} -> {held[-1]}; entries used {bump[0]} -> {bump[half]} -> {bump[-1]}; "
          f"live versions {dm.live_versions}")
    assert max(held[warm:]) == held[warm]
    assert bump[-1] - bump[half] <= 0.02 * bump[half]
    assert dm.live_versions <= n + 3 * size * 2
    src, dst, _ = dm.live_edges()
    assert set((src * n + dst).tolist()) == s.live


# ---- reads overlapping the updater --------------------------------------------------------------------
def test_reads_at_batch_k_while_batch_k_plus_1_is_applied():
    import cupy as cp

    s = PowerLawStream(20_000, 200_000, seed=3)
    g = s.graph()
    mvg, dm = MultiVersionGraph(g), device_mvg(g)
    gc = GarbageCollector()
    reader = cp.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(5)
    ops = s.batch(4096)
    mvg.apply(*ops)
    token = dm.apply(*ops)
    for _ in range(6):
        # reads at timestamps of batch k, ordered after its publication only
        seq = ops[0]
        q = 1_000_000
        pick = rng.integers(0, len(seq), q)
        a = np.where(rng.random(q) < 0.7, ops[1][pick], rng.integers(0, s.n, q))
        b = np.where(rng.random(q) < 0.7, ops[2][pick], rng.integers(0, s.n, q))
        t = rng.integers(seq[0], seq[-1] + 2, q)
        want = mvg.edge_label_between(a, b, t)
        done = cp.cuda.Event()
        done.record(dm.stream)
        reader.wait_event(done)
        _, label = dm.edges_at_async(a, b, t, stream=reader)
        if token.count:
            gc.replaced([(token, token.replaced_at)])
        # versions no read at >= seq[0] needs go back to the pool, and batch k+1 (which may
        # reuse them) is applied on the updater's stream while the reads run
        dm.release(gc.finished(gc.pointer, int(seq[0])))
        ops = s.batch(4096)
        mvg.apply(*ops)
        token = dm.apply(*ops)
        with reader:
            assert (label.get() == want).all()
        reader.synchronize()
