"""Depth-first matching compiled with numba: the compiled CPU engine's search kernels.

One search body serves static and incremental matching, reading the multi-version
graph at one timestamp per search (arena.py). At each depth the label-grouped
neighbour range of every backward neighbour's image is found once; the smallest one
gives the candidates and the others are binary searched for each candidate (the
ranges are sorted by neighbour), so a backward check costs one search, never a label
test or a scan. Count-only searches multiply the counts of independent segments and
memoise them (plans.py); a segment of one depth with one backward edge is counted from
that edge's range, not candidate by candidate (_direct). The search is an explicit stack
in a `State`, so a static search can stop (output buffer full, candidate budget spent
for a time-limit check, --limit reached) and resume where it stopped.
"""

from __future__ import annotations

import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from csmd.cpu.arena import find_entry, group_range, hot, label_ok, seed_ways
from csmd.cpu.plans import BACKWARD, GREATER, LESS, ORDER, SAME_LABEL, new_state
from csmd.model.time_constraints import NO_TS

LATEST = np.iinfo(np.int64).max  # tlo before any edge with a ts

# why a search stopped
DONE, FULL, BUDGET, LIMIT = range(4)

# A hot kernel inlined where it is called: a count found without a search costs a few loads, and
# a call (its NamedTuples of arrays passed member by member) cost more than that (sparse_16_7:
# 2.5 s -> 1.8 s). Not for the per-candidate kernels: inlining those made the search slower.
inline = njit(cache=True, nogil=True, _nrt=False, inline="always")


# ---- the search ----------------------------------------------------------------------------------
@hot
def _open(gv, ps, r, d, t, st):
    """Enter depth d (plan row r): find every backward range, walk the smallest."""
    lo, hi = ps.chk[r, BACKWARD], ps.chk[r, BACKWARD + 1]
    best, size = 0, -1
    for k in range(hi - lo):
        s, e = group_range(gv.cur, gv.ct_min, gv.prev, gv.v_gs, gv.v_ge, gv.g_key, gv.g_start, gv.g_end,
                           st.m[ps.chk_j[lo + k]], ps.qlab[r], t)
        st.rs[d, k], st.re[d, k] = s, e
        if size < 0 or e - s < size:
            best, size = k, e - s
        if size == 0:
            break
    st.piv[d] = best
    st.pos[d] = st.rs[d, best]
    st.end[d] = st.rs[d, best] + size


@inline
def _ordered(chk, chk_j, m, r, c):
    """Does image c at plan row r keep the row's symmetry constraints with the earlier images m?"""
    for x in range(chk[r, LESS], chk[r, LESS + 1]):
        if not m[chk_j[x]] < c:
            return False
    for x in range(chk[r, GREATER], chk[r, GREATER + 1]):
        if not m[chk_j[x]] > c:
            return False
    return True


@hot
def _accept(e_nbr, e_el, e_ct, e_dt, chk, chk_j, chk_test, cand, m, rs, re, hit, piv, r, d, t, i):
    """Is entry i of depth d's candidate range (plan row r, walked from backward range piv) an
    image for that depth? The arrays are GraphView's, PlanSet's and State's; hit[d] gets the
    entry each backward check found (the edges' ts are read from them: _timely)."""
    if not (e_ct[i] < t and t <= e_dt[i]):
        return False
    c = e_nbr[i]
    lo = chk[r, BACKWARD]
    if not label_ok(e_el[i], chk_test[lo + piv]):
        return False
    if cand.shape[0] and not cand[r, c]:
        return False
    for x in range(chk[r, SAME_LABEL], chk[r, SAME_LABEL + 1]):
        if m[chk_j[x]] == c:
            return False
    if not _ordered(chk, chk_j, m, r, c):
        return False
    hit[d, piv] = i
    for k in range(chk[r, BACKWARD + 1] - lo):
        if k != piv:
            j = find_entry(e_nbr, e_ct, e_dt, rs[d, k], re[d, k], c, t)
            if j < 0 or not label_ok(e_el[j], chk_test[lo + k]):
                return False
            hit[d, k] = j
    return True


# ---- time constraints (model/time_constraints.py) -------------------------------------------------
@inline
def _arc(ets, x, t, lo, hi):
    """Query edge x (-1: none) is matched by an arc with ts t: keep it, widen (lo, hi)."""
    if x < 0:
        return lo, hi
    ets[x] = t
    if t == NO_TS:  # an edge without a ts constrains nothing
        return lo, hi
    return min(lo, t), max(hi, t)


@hot
def _in_time(ps, st, r, d, p, lo, hi):
    """Do depth d's edges (their ts in st.ets, the span so far (lo, hi)) keep plan p's span and
    row r's order pairs? If so, (lo, hi) is depth d's."""
    span = ps.span[p]
    # as unsigned: the difference of two int64 ts may not fit an int64
    if span >= 0 and hi != NO_TS and np.uint64(hi - lo) > np.uint64(span):
        return False
    for x in range(ps.chk[r, ORDER], ps.chk[r, ORDER + 1]):
        a, b = st.ets[ps.chk_j[x]], st.ets[ps.chk_test[x]]
        if a != NO_TS and b != NO_TS and not a < b:
            return False
    st.tlo[d], st.thi[d] = lo, hi
    return True


@hot
def _timely(gv, ps, st, r, d, p):
    """Does the candidate _accept took at depth d keep the time constraints? Reads the ts of the
    entries its backward checks found."""
    lo, hi = st.tlo[d - 1], st.thi[d - 1]
    b = ps.chk[r, BACKWARD]
    for k in range(ps.chk[r, BACKWARD + 1] - b):
        j = st.hit[d, k]
        lo, hi = _arc(st.ets, ps.chk_out[b + k], gv.e_ts[j], lo, hi)
        lo, hi = _arc(st.ets, ps.chk_back[b + k], gv.e_tsin[j], lo, hi)
    return _in_time(ps, st, r, d, p, lo, hi)


@hot
def _timely_seed(ps, st, r, p, t_out, t_back):
    """Does a seed (depths 0 and 1, plan row r of depth 1) whose arcs have these ts keep them?"""
    st.tlo[0], st.thi[0] = LATEST, NO_TS
    b = ps.chk[r, BACKWARD]
    lo, hi = _arc(st.ets, ps.chk_out[b], t_out, LATEST, NO_TS)
    lo, hi = _arc(st.ets, ps.chk_back[b], t_back, lo, hi)
    return _in_time(ps, st, r, 1, p, lo, hi)


@hot
def _write_ts(st, d, out_ts, n):
    """Row n of out_ts: the smallest and the largest ts of the match ending at depth d."""
    out_ts[n, 0] = st.tlo[d] if st.thi[d] != NO_TS else NO_TS
    out_ts[n, 1] = st.thi[d]


@inline
def _recall(bound, stamp, count, m, y, sid):
    """(whether known, count) of the segment at depth y; bound is y's row of PlanSet.memo."""
    if bound < 0 or stamp.shape[0] == 0:
        return False, 0
    v = m[bound]
    if stamp[y, v] != sid:
        return False, 0
    return True, count[y, v]


@inline
def _direct(gv, ps, r, d, t, st, cand, memo, sid):
    """(whether countable, count) of the one-depth segment at depth d (plan row r) without testing
    its candidates one by one: with one backward edge and no symmetry check, its images are the
    backward image's range entries that pass the edge-label, lifetime and candidate tests (their
    number depends on that image alone, so memo row d keeps it by that image) less the earlier
    same-label images among them: a few binary searches instead of a test per candidate."""
    lo = ps.chk[r, BACKWARD]
    if (ps.seg[r] != d + 1 or ps.chk[r, BACKWARD + 1] - lo != 1 or ps.chk[r, LESS] != ps.chk[r, LESS + 1]
            or ps.chk[r, GREATER] != ps.chk[r, GREATER + 1]):
        return False, 0
    m, stamp, count = st.m, memo.stamp, memo.count
    e_nbr, e_el, e_ct, e_dt = gv.e_nbr, gv.e_el, gv.e_ct, gv.e_dt
    v, test = m[ps.chk_j[lo]], ps.chk_test[lo]
    same, same_end = ps.chk[r, SAME_LABEL], ps.chk[r, SAME_LABEL + 1]
    remembered = stamp.shape[0] > 0 and stamp[d, v] == sid
    if remembered and same == same_end:
        return True, count[d, v]
    s, e = group_range(gv.cur, gv.ct_min, gv.prev, gv.v_gs, gv.v_ge, gv.g_key, gv.g_start, gv.g_end, v, ps.qlab[r], t)
    if remembered:
        n = count[d, v]
    else:
        n = 0
        for i in range(s, e):
            if e_ct[i] < t and t <= e_dt[i] and label_ok(e_el[i], test) and (cand.shape[0] == 0 or cand[r, e_nbr[i]]):
                n += 1
        st.at[2] += e - s
        if stamp.shape[0]:
            stamp[d, v], count[d, v] = sid, n
    for x in range(same, same_end):
        c = m[ps.chk_j[x]]
        if cand.shape[0] == 0 or cand[r, c]:
            j = find_entry(e_nbr, e_ct, e_dt, s, e, c, t)
            if j >= 0 and label_ok(e_el[j], test):
                n -= 1
    return True, n


@inline
def _known(gv, ps, off, y, t, st, cand, memo, sid):
    """(whether known without a search, count) of the segment at depth y: memoised, or counted directly."""
    known, v = _recall(ps.memo[off + y], memo.stamp, memo.count, st.m, y, sid)
    if known:
        return known, v
    return _direct(gv, ps, off + y, y, t, st, cand, memo, sid)


@hot
def _chain(gv, ps, off, p, y, t, st, cand, memo, sid):
    """Go on along depth p's current candidate: the segments y, seg[y], ... up to p's segment end
    multiply. Returns the first segment that must be searched, or -1 when the chain is done
    (its product then added to p's count)."""
    seg, prod = ps.seg, st.prod
    e = seg[off + p]
    while y < e:
        known, v = _known(gv, ps, off, y, t, st, cand, memo, sid)
        if not known:
            return y
        prod[p] *= v
        if v == 0:
            return -1
        y = seg[off + y]
    st.acc[p] += prod[p]
    return -1


@hot
def _segment_count(gv, ps, off, y0, t, st, cand, memo, sid):
    """The completions of the segment [y0, seg[y0]) given the images above y0: the sum over y0's
    candidates of the product of the segments below it (an explicit stack: one frame per open
    segment)."""
    seg, bound, stamp, count = ps.seg, ps.memo, memo.stamp, memo.count
    m, pos, end, acc, prod, stack = st.m, st.pos, st.end, st.acc, st.prod, st.stack
    known, v = _known(gv, ps, off, y0, t, st, cand, memo, sid)
    if known:
        return v
    sp = 0
    stack[0] = y0
    acc[y0] = 0
    _open(gv, ps, off + y0, y0, t, st)
    st.at[2] += end[y0] - pos[y0]
    while True:
        d = stack[sp]
        r = off + d
        nxt = -1
        while pos[d] < end[d] and nxt < 0:
            i = pos[d]
            pos[d] = i + 1
            if _accept(gv.e_nbr, gv.e_el, gv.e_ct, gv.e_dt, ps.chk, ps.chk_j, ps.chk_test, cand, m, st.rs, st.re,
                       st.hit, st.piv[d], r, d, t, i):
                m[d] = gv.e_nbr[i]
                if d + 1 == seg[r]:  # a segment of one depth: one completion per candidate
                    acc[d] += 1
                else:
                    prod[d] = 1
                    nxt = _chain(gv, ps, off, d, d + 1, t, st, cand, memo, sid)
        if nxt < 0:  # d's candidates are exhausted: its segment's count is known
            v = acc[d]
            if bound[r] >= 0 and stamp.shape[0]:
                stamp[d, m[bound[r]]] = sid
                count[d, m[bound[r]]] = v
            if sp == 0:
                return v
            sp -= 1
            p = stack[sp]
            prod[p] *= v
            nxt = _chain(gv, ps, off, p, seg[r], t, st, cand, memo, sid) if v else -1
            if nxt < 0:
                continue
        # open the next segment of the current candidate
        sp += 1
        stack[sp] = nxt
        acc[nxt] = 0
        _open(gv, ps, off + nxt, nxt, t, st)
        st.at[2] += end[nxt] - pos[nxt]


@hot
def _count(gv, ps, off, d, end, t, st, cand, memo, sid):
    """The completions of depths [d, end) given the images above d (count-only; nothing from end
    on refers into [d, end)): the product of its segments' counts."""
    total = 1
    while d < end and total:
        total *= _segment_count(gv, ps, off, d, t, st, cand, memo, sid)
        d = ps.seg[off + d]
    return total


@hot
def _write(ps, off, k, m, out, n):
    """Row n of out: the images in query-vertex order."""
    for j in range(k):
        out[n, ps.order[off + j]] = m[j]


@hot
def _run(gv, ps, p, t, cand, memo, sid, st, d0, out, out_ts, n_out, materialize, budget, limit):
    """Continue plan p's search below depth d0 - 1 (fixed images) until it is exhausted (DONE), out
    is full (FULL), `budget` candidates were looked at (BUDGET, -1: none) or `limit` matches were
    found (LIMIT, -1: none). Returns (why, rows in out, matches found, budget left). out_ts (no
    rows: none wanted) gets each row's smallest and largest ts; the edges' ts are followed when
    it is wanted or the plan has time constraints."""
    timely = ps.timed[p] or (materialize and out_ts.shape[0] > 0)
    off, k = ps.off[p], ps.depth[p]
    d = st.at[0]
    found = 0
    why = DONE
    while d >= d0:
        i = st.pos[d]
        if i >= st.end[d]:
            d -= 1
            continue
        if budget == 0:
            why = BUDGET
            break
        budget -= 1
        r = off + d
        if not _accept(gv.e_nbr, gv.e_el, gv.e_ct, gv.e_dt, ps.chk, ps.chk_j, ps.chk_test, cand, st.m, st.rs, st.re,
                       st.hit, st.piv[d], r, d, t, i) or (timely and not _timely(gv, ps, st, r, d, p)):
            st.pos[d] = i + 1
            continue
        st.at[3] += 1
        if d + 1 < k:
            st.pos[d] = i + 1
            st.m[d] = gv.e_nbr[i]
            if d + 1 == ps.tail[p] and not materialize:
                looked = st.at[2]
                found += _count(gv, ps, off, d + 1, k, t, st, cand, memo, sid)
                budget = max(budget - (st.at[2] - looked), 0) if budget > 0 else budget
                if limit >= 0 and found >= limit:
                    found = limit
                    why = LIMIT
                    break
                continue
            d += 1
            _open(gv, ps, off + d, d, t, st)
            continue
        if materialize:
            if n_out == out.shape[0]:
                why = FULL  # this candidate is looked at again on resumption
                break
            st.m[d] = gv.e_nbr[i]
            _write(ps, off, k, st.m, out, n_out)
            if timely and out_ts.shape[0]:
                _write_ts(st, d, out_ts, n_out)
            n_out += 1
        st.pos[d] = i + 1
        found += 1
        if found == limit:
            why = LIMIT
            break
    st.at[0] = d
    return why, n_out, found, budget


@hot
def static_step(gv, ps, cand, memo, roots, st, out, no_ts, materialize, budget, limit):
    """Search plan 0 from roots[st.at[1]:] until done, out full, budget spent or limit reached.
    Returns (why, rows in out, matches found); st holds where to resume. The memo's search id is
    1: the graph does not change. no_ts: an empty (0, 2) array (no row's ts is wanted)."""
    k = ps.depth[0]
    n_out, found = 0, 0
    while True:
        if st.at[0] < 1:  # no root in progress: take the next
            if st.at[1] == len(roots):
                return DONE, n_out, found
            if k == 1 and materialize and n_out == out.shape[0]:
                return FULL, n_out, found
            st.m[0] = roots[st.at[1]]
            st.at[1] += 1
            if k == 1:
                if materialize:
                    _write(ps, 0, 1, st.m, out, n_out)
                    n_out += 1
                found += 1
                if found == limit:
                    return LIMIT, n_out, found
                continue
            if ps.tail[0] == 1 and not materialize:
                looked = st.at[2]
                found += _count(gv, ps, 0, 1, k, 0, st, cand, memo, 1)
                if limit >= 0 and found >= limit:
                    return LIMIT, n_out, limit
                budget -= st.at[2] - looked
                if budget <= 0:
                    return BUDGET, n_out, found
                continue
            st.tlo[0], st.thi[0] = LATEST, NO_TS
            _open(gv, ps, 1, 1, 0, st)
            st.at[0] = 1
        why, n_out, f, budget = _run(gv, ps, 0, 0, cand, memo, 1, st, 1, out, no_ts, n_out, materialize,
                                     budget, -1 if limit < 0 else limit - found)
        found += f
        if why != DONE:
            return why, n_out, found


@intrinsic
def _fetch_add(typingctx, counter, index, value):
    """counter[index] += value atomically; the value before (the threads of a search share
    its unit counter and its counts)."""
    sig = types.int64(types.Array(types.int64, 1, "C"), types.int64, types.int64)

    def codegen(context, builder, signature, args):
        arr, idx, val = args
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, arr)
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [idx])
        return builder.atomic_rmw("add", ptr, val, "monotonic")

    return sig, codegen


@njit(cache=True, nogil=True)
def plan_units(labels, e_a, e_b, e_el, keys, by_key, plan_test, plan_query, select, directed):
    """The units of a batch's search, in op order: (op, plan p) for every plan of a selected
    query whose anchor edge the op can be (its end labels in either orientation, its edge
    label; directed, its direction); no other op is searched. keys: the plans' anchor keys
    (label << 32 | label) sorted; by_key: the plan of each. select: no rows (every query) or
    select[query, op]. Returns the ops searched (positions in the batch's edge ops) and, per
    unit, its op's index among them, its plan and the orientations it may seed (seed_ways)."""
    chosen = select.shape[0] > 0
    unit_e = np.empty(4 * len(e_a) + 16, np.int64)
    unit_p = np.empty_like(unit_e)
    unit_w = np.empty_like(unit_e)
    ops = np.empty(len(e_a), np.int64)
    k = n_ops = 0
    for e in range(len(e_a)):
        first = k
        la, lb = np.int64(labels[e_a[e]]), np.int64(labels[e_b[e]])
        for o in range(2 if la != lb else 1):  # equal end labels: one key, both orientations in one unit
            key = (la << 32) | lb if o == 0 else (lb << 32) | la
            j = np.searchsorted(keys, key)
            while j < len(keys) and keys[j] == key:
                p = by_key[j]
                j += 1
                ways = seed_ways(e_el[e], plan_test[p], directed)
                if ways == 0 or (chosen and not select[plan_query[p], e]):
                    continue
                if k == len(unit_e):
                    unit_e, unit_p, unit_w = (np.concatenate((unit_e, unit_e)), np.concatenate((unit_p, unit_p)),
                                              np.concatenate((unit_w, unit_w)))
                unit_e[k], unit_p[k], unit_w[k] = n_ops, p, ways
                k += 1
        if k > first:
            ops[n_ops] = e
            n_ops += 1
    return ops[:n_ops], unit_e[:k], unit_p[:k], unit_w[:k]


@njit(cache=True, nogil=True)
def nonzero_rows(counts, rows):
    """The nonzero entries of counts[rows], by row then column: (index into rows, column, value).
    A numpy gather and nonzero copied and scanned a hundred queries' counts of a batch's ops
    under the interpreter lock, which every stage of a cluster instance waits on."""
    n = 0
    for r in rows:
        for c in range(counts.shape[1]):
            n += counts[r, c] != 0
    which, col, val = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    n = 0
    for i in range(len(rows)):
        for c in range(counts.shape[1]):
            x = counts[rows[i], c]
            if x != 0:
                which[n], col[n], val[n] = i, c, x
                n += 1
    return which, col, val


@njit(cache=True, nogil=True)
def match_units(gv, ps, unit_e, unit_p, unit_w, e_seq, e_a, e_b, e_ts, counts, taken, grain, materialize, width,
                memo, sid):
    """Incremental matching of a batch's edge ops, unit by unit (plan_units: an op with one plan
    of a query), the units taken `grain` at a time from the counter `taken` that every thread of
    the search shares. A unit is smaller than an (op, query) pair: a pair that finds much is
    spread over its plans, so that no thread is left with a deep pair while the others idle.

    The op {a, b} at timestamp e_seq is mapped onto the plan's anchor (depths 0 and 1) in the
    orientations unit_w allows (plan_units), and the rest of the plan is searched at that timestamp. Adds the matches to
    counts[query * ops + op] (atomically: a pair's units may run on several threads) and returns,
    for the queries with materialize[q], every match this thread found: rows (query-vertex
    order, padded to width), their query and their op, and under event time (e_ts: each op's
    (a -> b, b -> a) ts; no rows: off) each row's smallest and largest ts. memo and sid: segment
    counts (Memo), and the last search id used with it; returns the new last id too, and the
    partial matches it made by enumeration (State.at[3]).
    """
    n_ops, n_units = len(e_seq), len(unit_e)
    timed = e_ts.shape[0] > 0
    out = np.zeros((64, width), np.int32)
    out_q = np.zeros(64, np.int64)
    out_op = np.zeros(64, np.int64)
    out_ts = np.zeros((64 if timed else 0, 2), np.int64)
    none = np.zeros((0, 0), np.bool_)
    n_out = 0
    st = new_state()
    while True:
        lo = _fetch_add(taken, 0, grain)
        if lo >= n_units:
            break
        for unit in range(lo, min(lo + grain, n_units)):
            e, p = unit_e[unit], unit_p[unit]
            q = ps.query[p]
            mat, t = materialize[q], e_seq[e]
            off, k = ps.off[p], ps.depth[p]
            lx, ly = ps.qlab[off], ps.qlab[off + 1]
            timely = ps.timed[p] or (mat and timed)
            sid += 1  # a new (plan, timestamp): the memo's counts so far do not hold
            found = 0
            for o in range(2):
                u0, u1 = (e_a[e], e_b[e]) if o == 0 else (e_b[e], e_a[e])
                if not (unit_w[unit] >> o) & 1 or gv.labels[u0] != lx or gv.labels[u1] != ly:
                    continue
                st.m[0], st.m[1] = u0, u1
                if not _ordered(ps.chk, ps.chk_j, st.m, off + 1, u1):  # the seed's own constraint (distinct)
                    continue
                if timely and not _timely_seed(ps, st, off + 1, p, e_ts[e, o] if timed else NO_TS,
                                               e_ts[e, 1 - o] if timed else NO_TS):
                    continue
                first = n_out
                if k == 2:
                    if mat:
                        if n_out == out.shape[0]:
                            out, out_q, out_op, out_ts = _grow(out, out_q, out_op, out_ts)
                        _write(ps, off, 2, st.m, out, n_out)
                        if timed:
                            _write_ts(st, 1, out_ts, n_out)
                        n_out += 1
                    found += 1
                elif not mat and not ps.timed[p]:
                    found += _count(gv, ps, off, 2, k, t, st, none, memo, sid)
                else:
                    _open(gv, ps, off + 2, 2, t, st)
                    st.at[0] = 2
                    while True:
                        why, n_out, f, _ = _run(gv, ps, p, t, none, memo, sid, st, 2, out, out_ts, n_out, mat, -1, -1)
                        found += f
                        if why != FULL:
                            break
                        out, out_q, out_op, out_ts = _grow(out, out_q, out_op, out_ts)
                out_q[first:n_out] = q
                out_op[first:n_out] = e
            if found:
                _fetch_add(counts, q * n_ops + e, found)
    return out[:n_out], out_q[:n_out], out_op[:n_out], out_ts[:n_out], sid, st.at[3]


@njit(cache=True, nogil=True)
def _grow(out, out_q, out_op, out_ts):
    n = out.shape[0]
    big = np.zeros((2 * n, out.shape[1]), np.int32)
    big[:n] = out
    big_q = np.zeros(2 * n, np.int64)
    big_q[:n] = out_q
    big_op = np.zeros(2 * n, np.int64)
    big_op[:n] = out_op
    big_ts = np.zeros((2 * n if out_ts.shape[0] else 0, 2), np.int64)
    big_ts[: out_ts.shape[0]] = out_ts
    return big, big_q, big_op, big_ts
