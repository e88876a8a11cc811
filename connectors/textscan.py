"""The compiled reader of update-stream text: plain lines to columns without a Python step per line.

A plain line is what FileSource.poll and parse_update would turn into one Update without
doubt: after stripping ASCII whitespace, `e`, `-e`, `v` or `-v` and its fields, separated by
spaces or tabs, each an integer of at most 18 digits (so it fits int64), labels between 0 and
2^31-1. Blank and `#` lines are skipped as poll skips them. Any other line (a bad one, a
19-digit id, a `+`, a non-ASCII byte, a form feed that splitlines would cut at) stops the scan
and is left to the line-by-line path, which decides it exactly as before. scan_records
reads a Kafka poll's records the same way, each record one or more lines (connectors/records.py).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from csmd.model.graph_scan import int_fields

_MAX_LABEL = 2**31 - 1
# fields of each op (its index in formats.OPS): fewest, most
FIELDS = np.array([[2, 3], [2, 3], [2, 2], [1, 1]], np.int64)


@njit(cache=True, nogil=True)
def _is_space(c):  # what bytes.strip() removes
    return c == 32 or 9 <= c <= 13


@njit(cache=True, nogil=True)
def _plain(buf, s, e, val):
    """The op (an index into formats.OPS) of the line buf[s:e] (stripped, not blank, not a
    comment) if it is plain, its fields in val[:3] and its label in val[3]; -1 if not plain."""
    op = -1
    if buf[s] == 45:  # '-'
        s += 1
        op = 1 if s < e and buf[s] == 101 else 3 if s < e and buf[s] == 118 else -1
    else:
        op = 0 if buf[s] == 101 else 2 if buf[s] == 118 else -1
    s += 1
    if op < 0 or s == e:
        return -1
    k = int_fields(buf, s, e, val, 3)  # -1 (not plain) fails the check below
    if not FIELDS[op, 0] <= k <= FIELDS[op, 1]:
        return -1
    label = val[k - 1] if k == 3 or op == 2 else 0
    if label < 0 or label > _MAX_LABEL:
        return -1
    val[3] = label
    return op


@njit(cache=True, nogil=True)
def _stripped(buf, s, e):
    while s < e and _is_space(buf[s]):
        s += 1
    while e > s and _is_space(buf[e - 1]):
        e -= 1
    return s, e


@njit(cache=True, nogil=True)
def _row(buf, pos, end, val, rows, line, at, op, u, v, label):
    """The line buf[pos:end] (number `line`) into row `rows` of the columns at, op, u, v, label:
    returns rows + 1 for a plain update line, rows for a blank line or a comment, -1 for any
    other line."""
    s, e = _stripped(buf, pos, end)
    if s == e or buf[s] == 35:
        return rows
    o = _plain(buf, s, e, val)
    if o < 0:
        return -1
    at[rows], op[rows], u[rows] = line, o, val[0]
    v[rows] = val[1] if o < 2 else -1
    label[rows] = val[3]
    return rows + 1


@njit(cache=True, nogil=True)
def scan(buf, pos, lineno):
    """The plain lines of buf[pos:] up to the first other one. buf holds whole lines (the last
    may lack its newline); lineno is the number of the line at pos. Returns (rows, where the
    scan stopped, the number of the line there, then per row: line number, op, u, v, label).
    The scan stops at the end of buf or at the start of a line that is not plain."""
    n = len(buf)
    cap = 16
    for i in range(pos, n):  # at most one row per line
        cap += buf[i] == 10
    out_line = np.empty(cap, np.int64)
    out_op = np.empty(cap, np.int8)
    out_u = np.empty(cap, np.int64)
    out_v = np.empty(cap, np.int64)
    out_label = np.empty(cap, np.int64)
    val = np.zeros(4, np.int64)
    rows = 0
    while pos < n:
        end = pos
        while end < n and buf[end] != 10:
            end += 1
        got = _row(buf, pos, end, val, rows, lineno, out_line, out_op, out_u, out_v, out_label)
        if got < 0:
            break
        rows = got
        pos = end + 1
        lineno += 1
    return (rows, pos, lineno, out_line[:rows], out_op[:rows], out_u[:rows], out_v[:rows], out_label[:rows])


@njit(cache=True, nogil=True)
def _splittable(buf, s, e):
    """Whether cutting buf[s:e] at '\n' gives the lines str.splitlines() gives: no other byte it
    breaks at (\v, \f, \x1c-\x1e, a '\r' before anything but '\n' or the end) and no non-ASCII
    byte (\x85 and U+2028/2029 break lines too)."""
    for i in range(s, e):
        c = buf[i]
        if c == 11 or c == 12 or 28 <= c <= 30 or c >= 128 or (c == 13 and i + 1 < e and buf[i + 1] != 10):
            return False
    return True


@njit(cache=True, nogil=True)
def scan_records(buf, ends):
    """Input records of plain text lines: buf holds the records' bytes one after the other,
    record i ending at ends[i]. A record is taken when every line of it that is not blank or a
    comment is plain and it has at least one; anything else (empty, comments only, a line that
    is not plain, a byte that would cut lines elsewhere) is left to decode_updates.
    Returns per record its number of updates (-1: not taken), then per update (a record's
    together, in record order): its line in the record (0 where it is the record's only update, which the record names:
    as decode_updates names it), op, u, v and label."""
    n = len(ends)
    cap = n
    for i in range(len(buf)):
        cap += buf[i] == 10
    count = np.full(n, -1, np.int64)
    part = np.empty(cap, np.int64)
    op = np.empty(cap, np.int8)
    u = np.empty(cap, np.int64)
    v = np.empty(cap, np.int64)
    label = np.empty(cap, np.int64)
    val = np.zeros(4, np.int64)
    rows = 0
    start = 0
    for i in range(n):
        pos, stop = start, ends[i]
        start = stop
        first = rows
        ok = _splittable(buf, pos, stop)
        line = 0
        while ok and pos < stop:
            end = pos
            while end < stop and buf[end] != 10:
                end += 1
            line += 1
            got = _row(buf, pos, end, val, rows, line, part, op, u, v, label)
            if got < 0:
                ok = False
                break
            rows = got
            pos = end + 1
        if not ok or rows == first:
            rows = first
        else:
            count[i] = rows - first
            if rows - first == 1:
                part[first] = 0
    return count, part[:rows], op[:rows], u[:rows], v[:rows], label[:rows]
