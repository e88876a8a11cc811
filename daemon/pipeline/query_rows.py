"""A search's matches split by query (the compiled CPU engine's and the GPU executor's), compiled.

A search returns its rows in chunks (a CPU thread's, a drain of the device's output buffer),
each row padded to the widest query, with its query and op; a query's matches are its rows cut
to its width. One pass over every chunk puts them into one buffer, query after query: numpy
needed the chunks concatenated, a mask (or a sort) per query over all of them and a gather of
each query's rows (some 20 ns a row on the yeast stream).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from csmd.engine import Matches


def by_query(chunks, names: list[str], widths: np.ndarray) -> dict[str, Matches]:
    """Each query's matches (query i: names[i], widths[i] ids a row) from chunks (rows, row_q,
    row_op, row_ts, seq) as split_rows takes them, in chunk order; queries without rows are absent."""
    chunks = [c for c in chunks if len(c[1])]
    if not chunks:
        return {}
    rows = sum(np.bincount(c[1], minlength=len(names)) for c in chunks)
    first, ids = np.cumsum(rows) - rows, np.cumsum(rows * widths) - rows * widths
    flat, row_seq = np.empty(int((rows * widths).sum()), np.int32), np.empty(int(rows.sum()), np.int64)
    timed = len(chunks[0][3]) > 0
    ts = np.empty((len(row_seq) if timed else 0, 2), np.int64)
    filled = np.zeros(len(names), np.int64)
    for c in chunks:
        split_rows(*c, widths, first, ids, filled, flat, row_seq, ts)
    out = {}
    for i in np.flatnonzero(rows).tolist():
        lo, k, n = int(first[i]), int(rows[i]), int(widths[i])
        out[names[i]] = Matches(row_seq[lo: lo + k], rows=flat[ids[i]: ids[i] + k * n].reshape(k, n),
                                ts=ts[lo: lo + k] if timed else None)
    return out


def merged(parts: list[dict[str, Matches]]) -> dict[str, Matches]:
    """Each query's matches from several searches' dicts in one Matches: ordered where a single
    piece, itself ordered, holds them (a query's pieces together are in no order)."""
    if len(parts) == 1:
        return parts[0]
    pieces: dict[str, list[Matches]] = {}
    for part in parts:
        for name, m in part.items():
            pieces.setdefault(name, []).append(m)
    cat = np.concatenate
    return {name: ms[0] if len(ms) == 1 else
            Matches(cat([m.seq for m in ms]), rows=cat([m.rows for m in ms]),
                    ts=None if ms[0].ts is None else cat([m.ts for m in ms]))
            for name, ms in pieces.items()}


@njit(cache=True, nogil=True)
def split_rows(rows, row_q, row_op, row_ts, seq, width, first, ids, filled, out, out_seq, out_ts):
    """One chunk's rows (rows, row_q, row_op and row_ts, empty without event time, as
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
