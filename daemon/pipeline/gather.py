"""The compiled gather of a batch's matches into one Arrow list column (DeltaEncoder, by update).

numpy needs a repeat, an arange and two gathers over every vertex id for rows of several
widths in an arbitrary order (some 10 ns an id on the yeast stream); one pass here.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def gather_ids(flat, start, widths, at, table):
    """The list offsets and values of rows `at`: row r is flat[start[r]:start[r] + widths[r]],
    its ids mapped through table."""
    k = len(at)
    offsets = np.empty(k + 1, np.int32)
    total = 0
    for i in range(k):
        offsets[i] = total
        total += widths[at[i]]
    offsets[k] = total
    out = np.empty(total, table.dtype)
    p = 0
    for i in range(k):
        r = at[i]
        s = start[r]
        for j in range(widths[r]):
            out[p] = table[flat[s + j]]
            p += 1
    return offsets, out
