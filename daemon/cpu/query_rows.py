"""A search's matches split by query (CompiledEngine._matches), compiled.

Each search thread returns its rows padded to the widest query, with each row's query and op;
a query's matches are its rows cut to its width. One pass over every thread's rows puts them
into one buffer, query after query: numpy needed the threads' rows concatenated, a mask per
query over all of them and a gather of each query's rows (some 20 ns a row on the yeast stream).
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def split_rows(rows, row_q, row_op, row_ts, seq, width, first, ids, filled, out, out_seq, out_ts):
    """One thread's rows (rows, row_q, row_op and row_ts, empty without event time, as
    dfs.match_units returns them) after the filled[q] rows of query q so far: its k-th row's ids
    at out[ids[q] + k * width[q]:][:width[q]], its update seq[op] at out_seq[first[q] + k], its
    ts at out_ts[first[q] + k]."""
    timed = len(row_ts) > 0
    for r in range(len(row_q)):
        q = row_q[r]
        k = filled[q]
        filled[q] = k + 1
        w = width[q]
        at = ids[q] + k * w
        for c in range(w):
            out[at + c] = rows[r, c]
        out_seq[first[q] + k] = seq[row_op[r]]
        if timed:
            out_ts[first[q] + k, 0] = row_ts[r, 0]
            out_ts[first[q] + k, 1] = row_ts[r, 1]
