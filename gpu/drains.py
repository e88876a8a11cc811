"""A large drain of the executor's output buffer sorted into the canonical delta order on the device.

match_at leaves a materialized search's rows in the output buffer in the order its warps
found them. On the host their canonical order (by update, then the match's ids:
pipeline/queries.canonical) cost some 170 ns a row on the yeast stream, more than half of
the materialized replay, because the merge of sorted runs degenerates on rows in no order;
the split by query and the read-back into pageable memory took most of the rest. Here the
device packs each row's keys (gpu/drains.cu), sorts them with stable radix sorts (CuPy's
argsort), the last word first, compacts each query's rows to its width with its update
beside it, and the host gets it all in one copy to pinned memory, as each query's Matches
already in order (Matches.ordered: canonical skips its sort). The executor keeps a small
drain on the host (executor.DEVICE_SORT_ROWS): the sorts' launches cost more than its rows.
"""

from __future__ import annotations

import cupy as cp
import numpy as np

from csmd.engine import Matches

from .launch import THREADS, flat_grid, i32, i64
from .module import kernel

def id_bits(vertices: int) -> int:
    """The bits of the largest internal id below `vertices`."""
    return max(int(vertices - 1).bit_length(), 1)


def sorted_drain(out: cp.ndarray, k: int, grp, seeds: cp.ndarray, S: int, bits: int,
                 stream: cp.cuda.Stream) -> dict[str, Matches]:
    """The first k rows of `out` (the executor's output buffer, grp.width int32 a row) as each
    query of grp's matches in canonical order; seeds: the search's seeds buffer (S seeds);
    bits: id_bits of the graph's vertices."""
    nq, width, timed = len(grp.names), grp.width, grp.timed
    per = 64 // bits
    words = -(-grp.nmax // per)
    grid = flat_grid(k)
    with stream:
        keys = cp.empty((words + 1) * k, cp.uint64)
        kernel("drains", "drain_keys")(grid, (THREADS,), (out, i64(k), i32(width), seeds, i64(S), grp.dev_tab_query,
                                                         grp.dev_widths, i32(bits), i32(words), keys))
        perm = cp.argsort(keys[words * k:])  # stable (thrust's stable_sort_by_key): LSD
        for d in range(words - 1, -1, -1):
            perm = perm[cp.argsort(keys[d * k: (d + 1) * k][perm])]
        # one buffer, copied back in two parts: the spans (whose total sizes the second), then each
        # row's update, ts pair (event time) and the compacted ids
        head, tsw = 3 * nq + 1, 2 * k if timed else 0
        buf = cp.empty(head + k + tsw + -(-k * grp.nmax // 2), cp.int64)
        key0 = keys[:k]
        kernel("drains", "drain_spans")((1,), (min(1024, max(32, nq)),), (i64(k), key0, perm, i32(nq), grp.dev_widths,
                                                                          buf))
        kernel("drains", "drain_rows")(grid, (THREADS,), (out, i64(k), i32(width), key0, perm, i32(nq), buf, grp.dev_widths,
                                                          i32(timed), buf[head:], buf[head + k:],
                                                          buf[head + k + tsw:].view(cp.int32)))
    spans = _copy(buf, 0, head, stream)
    total = int(spans[-1])
    host = _copy(buf, head, k + tsw + -(-total // 2), stream)
    seq, ts, ids = host[:k], host[k: k + tsw].reshape(-1, 2), host[k + tsw:].view(np.int32)
    out_ = {}
    for q in np.flatnonzero(spans[:nq]).tolist():
        n, lo, at, w = int(spans[q]), int(spans[nq + q]), int(spans[2 * nq + q]), int(grp.widths[q])
        out_[grp.names[q]] = Matches(seq[lo: lo + n], rows=ids[at: at + n * w].reshape(n, w),
                                     ts=ts[lo: lo + n] if timed else None, ordered=True)
    return out_


def _copy(buf: cp.ndarray, at: int, n: int, stream: cp.cuda.Stream) -> np.ndarray:
    """buf[at:at + n] (int64, after what `stream` has queued) in pinned host memory of its own
    (CuPy's pinned pool: the Matches made of it hold it until their deltas are gone)."""
    mem = cp.cuda.alloc_pinned_memory(max(8 * n, 8))
    cp.cuda.runtime.memcpyAsync(mem.ptr, buf.data.ptr + 8 * at, 8 * n, cp.cuda.runtime.memcpyDeviceToHost, stream.ptr)
    stream.synchronize()
    return np.frombuffer(mem, np.int64, n)
