"""The canonical order of one query's matches (queries.canonical), compiled and without the GIL.

By update, then by the match's internal ids in query-vertex order. An engine's rows come
in sorted runs (a search finds an anchor's matches of an update in the order of their
candidates: some 40 rows a run on the yeast stream), so a counting sort by update keeps
them (it is stable), and a merge of each update's runs sorts it; the ids are compared
packed into as few uint64 words as hold them, moved with the row's index. numpy's lexsort
of the packed words took some 80 ns a row there, and held the GIL.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(inline="always")
def _before(a, i, b, j) -> bool:
    """Whether packed row a[i] sorts before b[j] (their last word is the row's index, not a key)."""
    for d in range(a.shape[1] - 1):
        if a[i, d] != b[j, d]:
            return a[i, d] < b[j, d]
    return False


@njit(cache=True, nogil=True)
def _by_update(seq):
    """A stable order of seq: a counting sort where its span is small (a batch's updates), else
    a merge sort."""
    k = len(seq)
    s0 = seq.min()
    span = seq.max() - s0 + 1
    if span > 2 * k + 1024:
        return np.argsort(seq, kind="mergesort")
    pos = np.zeros(span + 1, np.int64)
    for i in range(k):
        pos[seq[i] - s0 + 1] += 1
    for u in range(span):
        pos[u + 1] += pos[u]
    out = np.empty(k, np.int64)
    for i in range(k):
        u = seq[i] - s0
        out[pos[u]] = i
        pos[u] += 1
    return out


@njit(cache=True, nogil=True)
def _packed(rows, order):
    """rows in `order`, their ids (>= 0) packed most significant first into as few uint64 words as
    hold them, the row's index as a last word."""
    k, n = rows.shape
    top = 0
    for i in range(k):
        for c in range(n):
            top = max(top, rows[i, c])
    bits = 1
    while (1 << bits) <= top:
        bits += 1
    per = 64 // bits
    words = (n + per - 1) // per
    out = np.empty((k, words + 1), np.uint64)
    for r in range(k):
        i = order[r]
        c = 0
        for d in range(words):
            x = np.uint64(0)
            for _ in range(per):
                x <<= np.uint64(bits)
                if c < n:
                    x |= np.uint64(rows[i, c])
                c += 1
            out[r, d] = x
        out[r, words] = i
    return out


@njit(cache=True, nogil=True)
def _merge(src, dst, lo, mid, hi) -> None:
    """dst[lo:hi] = the sorted runs src[lo:mid] and src[mid:hi] merged (stable)."""
    i, j, o = lo, mid, lo
    while i < mid and j < hi:
        if _before(src, j, src, i):
            for d in range(src.shape[1]):
                dst[o, d] = src[j, d]
            j += 1
        else:
            for d in range(src.shape[1]):
                dst[o, d] = src[i, d]
            i += 1
        o += 1
    dst[o: o + mid - i] = src[i: mid]
    o += mid - i
    dst[o: o + hi - j] = src[j: hi]


@njit(cache=True, nogil=True)
def canonical_order(rows, seq):
    """The order of rows (k x n int32 internal ids) by seq (k int64), then by the ids: stable."""
    k = len(seq)
    if k == 0:
        return np.zeros(0, np.int64)
    by_seq = _by_update(seq)
    a = _packed(rows, by_seq)
    b = np.empty_like(a)
    g0 = 0
    while g0 < k:  # each update's rows: their sorted runs merged pairwise until one is left
        g1 = g0 + 1
        while g1 < k and seq[by_seq[g1]] == seq[by_seq[g0]]:
            g1 += 1
        runs = [g0]
        for i in range(g0 + 1, g1):
            if _before(a, i, a, i - 1):
                runs.append(i)
        runs.append(g1)
        src, dst, moved = a, b, False
        while len(runs) > 2:
            merged = [g0]
            for r in range(0, len(runs) - 2, 2):
                _merge(src, dst, runs[r], runs[r + 1], runs[r + 2])
                merged.append(runs[r + 2])
            if len(runs) % 2 == 0:  # an odd run out: copied as it is
                dst[runs[-2]: g1] = src[runs[-2]: g1]
                merged.append(g1)
            runs = merged
            src, dst, moved = dst, src, not moved
        if moved:  # the sorted rows are in b
            a[g0:g1] = b[g0:g1]
        g0 = g1
    return a[:, -1].astype(np.int64)
