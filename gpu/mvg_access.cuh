// Read access to the device multi-version graph (MVG) for kernels that match at a
// timestamp while the graph updater (GU, gpu/mvg.cu) applies later batches.
//
// Layout (one pool, gpu/device_mvg.py):
//   cur[v]        v's newest version, -1: none yet (a new vertex no edge has touched)
//   version vid   ct_min, dt_max: the timestamps (ct_min, dt_max] it serves; prev: the
//                 version it replaced (-1: none); start, size: its entries in the pool;
//                 ct_hi: an upper bound of its entries' e_ct (their newest insertion)
//   entry pos     e_nbr, e_lab (the neighbour's vertex label), e_el (edge label), and
//                 the lifetime (e_ct, e_dt]: visible at T iff e_ct < T <= e_dt
//                 (e_dt = MVG_INF: alive); under event time (else null) e_ts and e_tsin, the ts
//                 of the arc to the neighbour and of the arc back (MVG_NO_TS: none; daemon/model/
//                 time_constraints.py). A version's entries are contiguous and sorted
//                 by (e_lab, e_nbr, e_ct), so a label is one range and a neighbour one
//                 binary search inside it.
//
// Coherence rules: why a kernel may read at T while the GU writes batch k+1 (all of
// whose timestamps are > T) on another stream.
//  1. cur[] and the version table change under the reader (publication, dt_max, ids
//     recycled by the GC): read them with mvg_load (volatile, not cached in L1), never
//     with __ldg, which could return a stale copy of a recycled version's fields.
//  2. The GU writes a version's entries and table fields, then __threadfence(), then
//     publishes cur[v]: a version found through cur[v] is complete.
//  3. version_at(v, T) stops at the newest version with ct_min < T. Versions made by
//     batch k+1 have ct_min > T; their prev links were published before them.
//  4. A published version's entries never change, except e_dt going from MVG_INF to a
//     timestamp later than any reader's T: either value gives the same visibility.
//     Entries (and vertex labels, written once before any edge names the vertex) are
//     therefore read through the read-only cache (MVG_ENTRY = __ldg) by a
//     kernel launched after the version was published (that cache is not kept coherent
//     with writes made while a kernel runs, and a recycled block may have been cached
//     under its old contents). A kernel that keeps running across batches (persistent
//     warps) defines MVG_PERSISTENT_READER before including this header: entries are
//     then read from L2 (__ldcg).
//  5. A version's id and block are reused only after the host GC saw every read at
//     T <= its replaced_at finish; a later read stops at a newer version first.
//  6. Pool growth (rare) synchronizes the device first; a kernel reads through the
//     MVGView it was launched with.
//  7. clean_at(vid, T): every entry of the version is visible at T. v_ct_hi is final
//     once the version is published. v_live may fall under the reader (a later batch
//     deleting in place, gu_split), but only for entries whose e_dt > T, which are
//     visible at T either way: both values of v_live give a correct answer (clean, or
//     conservatively not), and entries closed at or before T were counted out of v_live
//     before the reader was launched.
#pragma once

// label_ok
#include "layout.cuh"

#define MVG_INF 0x7fffffffffffffffLL
#define MVG_NO_TS ((i64)0x8000000000000000ULL)  // an edge without an event time

// The view's fields, defined once: the struct below and the layout check that
// gpu/device_mvg.py runs at load (mvg_view_layout) are both made from this list.
#define MVG_VIEW_FIELDS(X) \
    X(int*, cur)           \
    X(int*, labels)        \
    X(i64*, v_ct_min)      \
    X(i64*, v_dt_max)      \
    X(int*, v_prev)        \
    X(i64*, v_start)       \
    X(int*, v_size)        \
    X(int*, v_cls)         \
    X(int*, v_live)        \
    X(i64*, v_ct_hi)       \
    X(int*, e_nbr)         \
    X(int*, e_lab)         \
    X(int*, e_el)          \
    X(i64*, e_ct)          \
    X(i64*, e_dt)          \
    X(i64*, e_ts)          \
    X(i64*, e_tsin)        \
    X(i64, n)

// Device pointers of the MVG, passed by value as a kernel argument. v_cls (size class
// of the block) and v_live (entries with e_dt = MVG_INF) are the GU's bookkeeping.
struct MVGView {
#define MVG_DECLARE(type, name) type name;
    MVG_VIEW_FIELDS(MVG_DECLARE)
#undef MVG_DECLARE
};

template <class T>
__device__ __forceinline__ T mvg_load(const T* p) {
    return *(const volatile T*)p;
}

#ifdef MVG_PERSISTENT_READER
#define MVG_ENTRY(p) __ldcg(p)
#else
#define MVG_ENTRY(p) __ldg(p)
#endif

// The version of v that a read at T uses (-1: v had no version then).
__device__ __forceinline__ int version_at(const MVGView& g, int v, i64 T) {
    int vid = mvg_load(g.cur + v);
    while (vid >= 0 && mvg_load(g.v_ct_min + vid) >= T) vid = mvg_load(g.v_prev + vid);
    return vid;
}

// Is every entry of version vid visible at T? (rule 7) Then a range of it needs no scan.
__device__ __forceinline__ bool clean_at(const MVGView& g, int vid, i64 T) {
    return mvg_load(g.v_ct_hi + vid) < T && mvg_load(g.v_live + vid) == mvg_load(g.v_size + vid);
}

__device__ __forceinline__ bool visible(const MVGView& g, i64 pos, i64 T) {
    return MVG_ENTRY(g.e_ct + pos) < T && T <= MVG_ENTRY(g.e_dt + pos);
}

// The entries of v's version at T whose neighbour is labelled lab, as [start, start + size).
// Entries of the range may be invisible at T: test each with visible(pos, T).
__device__ __forceinline__ void label_range_at(const MVGView& g, int v, int lab, i64 T, i64* start, int* size) {
    const int vid = version_at(g, v, T);
    if (vid < 0) {
        *start = 0;
        *size = 0;
        return;
    }
    const i64 lo = mvg_load(g.v_start + vid);
    const int n = mvg_load(g.v_size + vid);
    int a = 0, b = n;
    while (a < b) {  // first entry with label >= lab
        const int m = (a + b) >> 1;
        if (MVG_ENTRY(g.e_lab + lo + m) < lab) a = m + 1; else b = m;
    }
    int c = a, e = n;
    while (c < e) {  // first entry with label > lab
        const int m = (c + e) >> 1;
        if (MVG_ENTRY(g.e_lab + lo + m) <= lab) c = m + 1; else e = m;
    }
    *start = lo + a;
    *size = c - a;
}

// Position of the entry of edge {a, b} visible at T (its label passing el when check_el: label_ok),
// -1 if there is none. A pair deleted and re-inserted inside one version has several
// entries, in ct order: at most one is visible at T.
__device__ __forceinline__ i64 edge_at(const MVGView& g, int a, int b, i64 T, int el, bool check_el) {
    i64 s;
    int n;
    label_range_at(g, a, MVG_ENTRY(g.labels + b), T, &s, &n);
    i64 lo = s, hi = s + n;
    while (lo < hi) {  // first entry with neighbour >= b
        const i64 m = (lo + hi) >> 1;
        if (MVG_ENTRY(g.e_nbr + m) < b) lo = m + 1; else hi = m;
    }
    for (; lo < s + n && MVG_ENTRY(g.e_nbr + lo) == b; ++lo)
        if (visible(g, lo, T)) return !check_el || label_ok(MVG_ENTRY(g.e_el + lo), el) ? lo : -1;
    return -1;
}
