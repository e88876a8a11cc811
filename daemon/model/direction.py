"""Directed graphs on the undirected machinery: one adjacency entry per vertex pair.

A directed graph may hold u->v and v->u (reciprocal transfers), each with its own label. Every
engine keeps one entry per neighbour (the version rules, the searches' binary searches and
their injectivity counts rely on it), so a directed pair is one entry whose label is a *code*
holding both arcs as the entry's owner sees them:

    bits  0..13  the label of the arc owner -> neighbour ("out"),  bit 14 set when it exists
    bits 15..28  the label of the arc neighbour -> owner ("in"),   bit 29 set when it exists

The neighbour's entry for the owner holds the same code with its halves swapped (`flip`).
An undirected graph's entry label is the plain edge label: code and label are the same.

A query edge is matched by testing a data code against the query pair's code: in a directed
graph only the arcs the query asks for are compared (non-induced: a data pair with both arcs
matches a query pair with one), so a test is a (mask, value) pair packed into one int64
(`label_test`); an undirected test compares the whole label.
"""

from __future__ import annotations

import numpy as np

LABEL_BITS = 14
MAX_DIRECTED_LABEL = (1 << LABEL_BITS) - 1  # edge labels of a directed graph: 0 .. 16383
PRESENT = 1 << LABEL_BITS  # the arc exists
HALF = 15  # bits per half
HALF_MASK = (1 << HALF) - 1
ALL = 0xFFFFFFFF  # an undirected test: every bit of the label


def arc_code(label, out):
    """The code of one arc u->v as u sees it (out) or as v sees it (not out); vectorized."""
    part = PRESENT | np.asarray(label, np.int64)
    return np.where(out, part, part << HALF).astype(np.int32)


def flip(code):
    """The code as the other end of the pair sees it; vectorized."""
    c = np.asarray(code, np.int64)
    return (((c & HALF_MASK) << HALF) | (c >> HALF)).astype(np.int32)


def arcs_of(a, b, code):
    """The arcs (src, dst, label) that the codes of pairs (a, b) (as a sees them) hold: out
    halves first, then in halves, each in the pairs' order."""
    c = np.asarray(code, np.int64)
    out = (c & PRESENT) != 0
    inn = ((c >> HALF) & PRESENT) != 0
    src = np.concatenate([a[out], b[inn]])
    dst = np.concatenate([b[out], a[inn]])
    lab = np.concatenate([c[out] & MAX_DIRECTED_LABEL, (c[inn] >> HALF) & MAX_DIRECTED_LABEL]).astype(np.int32)
    return src, dst, lab


def label_test(code, directed: bool):
    """The packed test (mask << 32 | value) a data label must pass to match a query pair whose
    code (as the data entry's owner's image sees it) is `code`; vectorized."""
    c = np.asarray(code, np.int64)
    if not directed:
        return (np.int64(ALL) << 32) | c
    mask = ((c >> LABEL_BITS) & 1) * HALF_MASK | ((c >> (HALF + LABEL_BITS)) & 1) * (HALF_MASK << HALF)
    return (mask << 32) | c


def passes(label, test):
    """Does a data label pass a packed test? (numpy; the compiled searches inline the same test)"""
    return (np.asarray(label, np.int64) & (test >> 32)) == (test & ALL)


def seed_ways(code, test, directed: bool):
    """How an update's edge can be a query pair's anchor edge: bit 0 with the anchor's first vertex
    on the update's a, bit 1 on its b. code: the pair's code with the update's edge, as a sees
    it (a directed update's edge is a -> b); test: the anchor pair's packed test (as its first
    vertex sees it). Directed, the anchor must also hold the arc that becomes a -> b (its out
    half for bit 0, its in half for bit 1): the deltas are the matches that contain the edge."""
    c = np.asarray(code, np.int64)
    if not directed:
        return passes(c, test) * 3
    q = test & ALL
    fwd = ((q >> LABEL_BITS) & 1) * passes(c, test)
    rev = ((q >> (HALF + LABEL_BITS)) & 1) * passes(flip(c), test)
    return fwd | (rev << 1)


def device_label(code, directed: bool):
    """A query pair's label as the device kernels test it (label_ok, gpu/layout.cuh): undirected,
    the label; directed, its code with bit 31 set (int32), so that one int says both."""
    c = np.asarray(code, np.int64)
    return (c | (1 << 31)).astype(np.uint32).view(np.int32) if directed else c.astype(np.int32)
