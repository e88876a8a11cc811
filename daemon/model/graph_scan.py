"""The compiled reader of a data graph's text: plain lines to columns without a Python step per line.

formats.py's line parser took some 4 us a line and 200 bytes a number held in its lists: a
LiveJournal-sized graph (4.8M vertices, 38.6M edges) took 203 s and 8.7 GB to read. A plain
file is read here in two passes over its bytes (count the v and e lines, then parse them into
arrays), its ids mapped to internal ones by a sort. A plain line is one the parser would take
without doubt: `t N M`, `v id label [degree]` or `e u v [label [ts]]`, fields separated by
spaces or tabs, each an integer of at most 18 digits (so it fits int64) with an optional
minus sign, labels between 0 and 2^31-1; blank lines and `#` comments. Anything else (a bad
line, a 19-digit number, a `+`, a label name, a non-ASCII byte, a carriage return that Python
would read as a line break, a repeated vertex, an edge to an unknown vertex, a header that
disagrees) leaves the whole file to the line parser, which decides it exactly as before.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numba import njit

_MAX_DIGITS = 18
_MAX_LABEL = 2**31 - 1


@njit(cache=True, nogil=True)
def _line(buf, pos):
    """(first byte, end, next line's start) of the line from pos: spaces and tabs around it and a
    carriage return before its newline left out."""
    n = len(buf)
    end = pos
    while end < n and buf[end] != 10:
        end += 1
    e = end
    if e > pos and buf[e - 1] == 13:
        e -= 1
    s = pos
    while s < e and (buf[s] == 32 or buf[s] == 9):
        s += 1
    while e > s and (buf[e - 1] == 32 or buf[e - 1] == 9):
        e -= 1
    return s, e, end + 1


@njit(cache=True, nogil=True)
def _count(buf):
    """The v lines and the e lines (by their first byte): the columns' lengths at most."""
    nv = ne = 0
    pos = 0
    while pos < len(buf):
        s, e, pos = _line(buf, pos)
        if s < e:
            nv += buf[s] == 118
            ne += buf[s] == 101
    return nv, ne


@njit(cache=True, nogil=True)
def int_fields(buf, s, e, val, most):
    """The integers of buf[s:e] (a line after its one-byte tag, from a separator on) into val; how
    many, or -1 when a field is not a plain integer or there are more than `most` (the stream
    scanner's too: connectors/textscan.py)."""
    k = 0
    if s < e and buf[s] != 32 and buf[s] != 9:  # the tag is one byte
        return -1
    while s < e:
        while s < e and (buf[s] == 32 or buf[s] == 9):
            s += 1
        if s == e:
            break
        neg = buf[s] == 45
        s += neg
        digits = 0
        x = 0
        while s < e and 48 <= buf[s] <= 57:
            x = x * 10 + (buf[s] - 48)
            digits += 1
            s += 1
        if not (0 < digits <= _MAX_DIGITS and k < most and (s == e or buf[s] == 32 or buf[s] == 9)):
            return -1
        val[k] = -x if neg else x
        k += 1
    return k


@njit(cache=True, nogil=True)
def _scan(buf, vid, vlab, eu, ev, elab, ets, ehas, eline, head):
    """Parse every line into the columns (v lines: id, label; e lines: ends, label, ts and whether
    it has one, line number; head: has a t line, N, M, its line). Returns (vertices, edges, -1),
    or with a line number last, the first line that is not plain."""
    val = np.empty(4, np.int64)
    nv = ne = 0
    line = 0
    pos = 0
    while pos < len(buf):
        s, e, pos = _line(buf, pos)
        line += 1
        if s == e:
            continue
        tag = buf[s]
        if tag == 35:  # a comment, unless a carriage return in it is a line break to Python
            for j in range(s, e):
                if buf[j] == 13:
                    return nv, ne, line
            continue
        k = int_fields(buf, s + 1, e, val, 4)
        if tag == 118:  # v id label [degree]
            if not (k == 2 or k == 3) or not 0 <= val[1] <= _MAX_LABEL:
                return nv, ne, line
            vid[nv], vlab[nv] = val[0], val[1]
            nv += 1
        elif tag == 101:  # e u v [label [ts]]
            if not 2 <= k <= 4:
                return nv, ne, line
            label = val[2] if k >= 3 else 0
            if not 0 <= label <= _MAX_LABEL:
                return nv, ne, line
            eu[ne], ev[ne], elab[ne], eline[ne] = val[0], val[1], label, line
            ehas[ne] = k == 4
            ets[ne] = val[3] if k == 4 else 0
            ne += 1
        elif tag == 116:  # t N M, the first record
            if k != 2 or nv or ne or head[0]:
                return nv, ne, line
            head[0], head[1], head[2], head[3] = 1, val[0], val[1], line
        else:
            return nv, ne, line
    return nv, ne, -1


def scan_graph(path: Path):
    """A plain data graph file's (ext ids, labels, src, dst, edge labels, edge lines, (u, v, ts) of
    the edges with a ts or None), src and dst internal; None when the line parser must read it."""
    try:
        buf = np.fromfile(path, np.uint8)
    except OSError:
        return None  # the line parser says why
    nv, ne = _count(buf)
    vid, vlab = np.empty(nv, np.int64), np.empty(nv, np.int32)
    eu, ev, ets = np.empty(ne, np.int64), np.empty(ne, np.int64), np.empty(ne, np.int64)
    elab, ehas, eline = np.empty(ne, np.int32), np.empty(ne, np.bool_), np.empty(ne, np.int64)
    head = np.zeros(4, np.int64)
    nv, ne, stop = _scan(buf, vid, vlab, eu, ev, elab, ets, ehas, eline, head)
    del buf
    if stop >= 0 or not nv or (head[0] and (head[1] != nv or head[2] != ne)):
        return None
    timed = (eu[ehas], ev[ehas], ets[ehas]) if ehas.any() else None  # ext ids, taken before they are mapped
    if vid[0] == 0 and vid[-1] == nv - 1 and (vid[1:] > vid[:-1]).all():  # ids 0 .. n-1 in order, the usual
        if not ((eu >= 0) & (eu < nv) & (ev >= 0) & (ev < nv)).all():  # an unknown vertex
            return None
        return vid, vlab, eu, ev, elab, eline, timed
    by_id = np.argsort(vid, kind="stable")
    ids = vid[by_id]
    if (ids[1:] == ids[:-1]).any():  # a repeated vertex
        return None
    ends = []
    for x in (eu, ev):
        at = np.minimum(np.searchsorted(ids, x), nv - 1)
        if not (ids[at] == x).all():  # an unknown vertex
            return None
        ends.append(by_id[at])
    return vid, vlab, ends[0], ends[1], elab, eline, timed
