"""Compiled fills of the delta columns from runs of rows (DeltaEncoder).

A batch's deltas are runs: each query's rows of one update, contiguous in that query's
arrays, so the Arrow columns are copies and repeats of slices, never a gather by row.
numpy needs a repeat, an arange and a gather over every value for that (some 10 ns an id
on the yeast stream); one pass here, without the GIL.
"""

from __future__ import annotations

from numba import njit


@njit(cache=True, nogil=True)
def copy_runs(src, lo, hi, at, table, out):
    """out[at[s]:at[s] + hi[s] - lo[s]] = src[lo[s]:hi[s]] for each run s, mapped through table
    (empty: not mapped)."""
    mapped = len(table) > 0
    for s in range(len(lo)):
        p = at[s]
        for j in range(lo[s], hi[s]):
            out[p] = table[src[j]] if mapped else src[j]
            p += 1


@njit(inline="always")
def _move(out, frm, to, n):
    """out[to:to + n] = out[frm:frm + n], the ranges apart: a loop, not a slice assignment, which
    numba cannot prove free of overlap and so copies through a temporary array (an allocation a
    copy: on the device host a slice's copy cost some 0.3 us)."""
    for j in range(n):
        out[to + j] = out[frm + j]


@njit(cache=True, nogil=True)
def repeat_runs(src, lo, hi, times, out):
    """src[lo[s]:hi[s]] times[s] times over, for each run s in turn, into out: the first copy,
    then what is written so far doubled (a run's strings are a few bytes repeated thousands of
    times). 105 MB of a yeast-like stream's strings: 31 -> 62 ms on the 2-core VM, 254 -> 77 ms
    on the H200 host, against slice assignments."""
    p = 0
    for s in range(len(lo)):
        size = hi[s] - lo[s]
        total = size * times[s]
        if not total:
            continue
        for j in range(size):
            out[p + j] = src[lo[s] + j]
        done = size
        while done < total:
            c = min(done, total - done)
            _move(out, p, p + done, c)
            done += c
        p += total
