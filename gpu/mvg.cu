// The device multi-version graph: bulk build, the graph updater (GU), the pool's free
// lists, and the batched reads behind DeviceMVG (gpu/device_mvg.py drives the launches;
// the semantics are csmd.mvg's, the read rules are in mvg_access.cuh).
//
// Storage: a version's entries live in one block of the entry pool. Blocks come in size
// classes: class 0 holds nothing (a vertex without edges), class c >= 1 holds 32 << (c-1)
// entries. A released version keeps its block and goes to the free list of its class as
// the key (class << 32 | vid): a later version of that class takes id and block together.
//
// Every step is a grid-stride loop with no block-level cooperation (the one-block kernels of
// small batches and the prefix sum of gu_mid_flags/gu_mid_incl are the exceptions, below,
// and gu_plan sums its counters per warp). Rows of a batch are
// the ops seen from each endpoint (2 per op), sorted by (vertex, op): a vertex's rows form
// a segment. Copies are load-balanced over a prefix sum of the copied arrays' sizes: the
// 32 lanes of a warp take 32 consecutive entries, so one warp copies several small arrays
// at once and a hub's array is spread over many warps.
#include "block_ops.cuh"
#include "mvg_access.cuh"

#define GRID_STRIDE(i, n) for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

#define LOW32 0xffffffffLL

// A step of the graph updater: the device function NAME_step, which the fused small-batch
// kernels run in their one block, and the kernel NAME, which runs it over a whole grid
// (large batches: one launch per step, a CuPy sort or prefix sum between them).
#define GU_STEP(name, params, args)                              \
    __device__ __forceinline__ void name##_step params;           \
    extern "C" __global__ void name params { name##_step args; }  \
    __device__ __forceinline__ void name##_step params

// counters of an applied batch, read back by the host once per batch (device_mvg.py parses
// this enum). S_MAX_SIZE: the largest new version, which bounds a later batch's allocation.
// S_WRITTEN: gu_small_apply wrote the batch itself (the gu_mid_* launches after it do nothing);
// S_DONE: the blocks of gu_mid_flags that are done.
enum { S_NEW, S_REPLACED, S_EMPTY, S_REPLACED_AT, S_FRESH, S_FRESH_ENTRIES, S_COPY, S_MAX_SIZE, S_WRITTEN, S_DONE,
       S_COUNT };

__device__ __forceinline__ int size_class(i64 size) {
    if (!size) return 0;
    int c = 1;
    for (i64 cap = 32; cap < size; cap <<= 1) ++c;
    return c;
}

__device__ __forceinline__ i64 class_capacity(int c) { return c ? (i64)32 << (c - 1) : 0; }

// First i in [0, n) with a[i] >= x (lower) or a[i] > x (upper); n if none. a ascends.
__device__ __forceinline__ i64 lower_bound(const i64* a, i64 n, i64 x) {
    i64 lo = 0, hi = n;
    while (lo < hi) {
        const i64 m = (lo + hi) >> 1;
        if (a[m] < x) lo = m + 1; else hi = m;
    }
    return lo;
}

__device__ __forceinline__ i64 upper_bound(const i64* a, i64 n, i64 x) {
    i64 lo = 0, hi = n;
    while (lo < hi) {
        const i64 m = (lo + hi) >> 1;
        if (a[m] <= x) lo = m + 1; else hi = m;
    }
    return lo;
}

// (neighbour label, neighbour) as one ordered key; labels and ids are non-negative int32
__device__ __forceinline__ i64 pair_key(int lab, int nbr) { return (i64)lab << 32 | (unsigned)nbr; }

// Offset in the version's entries [st, st + n) of the first entry whose pair key > key.
__device__ __forceinline__ int pairs_upper(const MVGView& g, i64 st, int n, i64 key) {
    int lo = 0, hi = n;
    while (lo < hi) {
        const int m = (lo + hi) >> 1;
        if (pair_key(g.e_lab[st + m], g.e_nbr[st + m]) <= key) lo = m + 1; else hi = m;
    }
    return lo;
}

// Offset of the first entry whose (pair key, ct) >= (key, ct).
__device__ __forceinline__ int triples_lower(const MVGView& g, i64 st, int n, i64 key, i64 ct) {
    int lo = 0, hi = n;
    while (lo < hi) {
        const int m = (lo + hi) >> 1;
        const i64 k = pair_key(g.e_lab[st + m], g.e_nbr[st + m]);
        if (k < key || (k == key && g.e_ct[st + m] < ct)) lo = m + 1; else hi = m;
    }
    return lo;
}

// ---- layout check ------------------------------------------------------------------------
// sizeof(MVGView), then (offset, size) of each field in MVG_VIEW_FIELDS order.
extern "C" __global__ void mvg_view_layout(i64* out) {
    MVGView probe;  // NVRTC has no offsetof
    int i = 0;
    out[i++] = sizeof(MVGView);
#define MVG_OFFSET(type, name)                                \
    out[i++] = (const char*)&probe.name - (const char*)&probe; \
    out[i++] = sizeof(type);
    MVG_VIEW_FIELDS(MVG_OFFSET)
#undef MVG_OFFSET
}

// ---- bulk build ----------------------------------------------------------------------------
// Initial version v of vertex v: size class and block capacity from the degree.
extern "C" __global__ void mvg_build_plan(MVGView g, const i64* indptr, i64* cap) {
    GRID_STRIDE(v, g.n) {
        g.v_cls[v] = size_class(indptr[v + 1] - indptr[v]);
        cap[v] = class_capacity(g.v_cls[v]);
    }
}

// cap_end: inclusive prefix sum of the capacities, so blocks are laid out vertex after vertex.
extern "C" __global__ void mvg_build_versions(MVGView g, const i64* indptr, const i64* cap_end) {
    GRID_STRIDE(v, g.n) {
        const int d = (int)(indptr[v + 1] - indptr[v]);
        g.cur[v] = (int)v;
        g.v_ct_min[v] = -1;  // the initial graph is older than every update
        g.v_dt_max[v] = MVG_INF;
        g.v_prev[v] = -1;
        g.v_start[v] = cap_end[v] - class_capacity(g.v_cls[v]);
        g.v_size[v] = d;
        g.v_live[v] = d;
        g.v_ct_hi[v] = -1;
    }
}

// Entry k of the label-grouped CSR (nbrs, els; els null: edge label 0) into its block; under
// event time its arcs' ts (ts: 2 rows of m, the arc to the neighbour then the arc back).
extern "C" __global__ void mvg_build_entries(MVGView g, i64 m, const i64* indptr, const int* nbrs, const int* els,
                                             const i64* ts) {
    GRID_STRIDE(k, m) {
        const i64 v = upper_bound(indptr + 1, g.n, k);
        const i64 dst = g.v_start[v] + k - indptr[v];
        const int w = nbrs[k];
        g.e_nbr[dst] = w;
        g.e_lab[dst] = g.labels[w];
        g.e_el[dst] = els ? els[k] : 0;
        g.e_ct[dst] = -1;
        g.e_dt[dst] = MVG_INF;
        if (g.e_ts) {
            g.e_ts[dst] = ts[k];
            g.e_tsin[dst] = ts[m + k];
        }
    }
}

// ---- graph updater -------------------------------------------------------------------------
// A batch is uploaded as 5 rows of k int64: seq, a, b, edge label, sign (> 0: insert).
struct Op {
    int own, nbr, el;
    i64 ts;
    bool ins;
};

// Row key: own << 32 | op index. Ops are in time order, so sorting the keys orders each
// vertex's rows by time. The batch's rows: seq, a, b, label (as a sees the edge), sign, label as
// b sees it (a directed pair's code with its halves swapped: daemon/model/direction.py); under
// event time then the ts of the arcs a -> b and b -> a.
__device__ __forceinline__ Op row_op(const i64* batch, i64 k, i64 key) {
    const i64 i = key & LOW32;
    const int own = (int)(key >> 32), a = (int)batch[k + i], b = (int)batch[2 * k + i];
    return Op{own, a == own ? b : a, (int)batch[(a == own ? 3 : 5) * k + i], batch[i], batch[4 * k + i] > 0};
}

// Under event time: the new entry of a row gets the ts of the arc from its owner, then of the arc back.
__device__ __forceinline__ void row_ts(const MVGView& g, const i64* batch, i64 k, i64 key, i64 dst) {
    const i64 i = key & LOW32;
    const bool from_a = (int)batch[k + i] == (int)(key >> 32);
    g.e_ts[dst] = batch[(from_a ? 6 : 7) * k + i];
    g.e_tsin[dst] = batch[(from_a ? 7 : 6) * k + i];
}

// Also zeroes the batch's counters (one launch less).
GU_STEP(gu_keys, (i64 k, const i64* batch, i64* keys, i64* stats),
        (k, batch, keys, stats)) {
    if (blockIdx.x == 0 && threadIdx.x == 0)
        for (int i = 0; i < S_COUNT; ++i) stats[i] = 0;
    GRID_STRIDE(i, k) {
        keys[i] = batch[k + i] << 32 | i;
        keys[k + i] = batch[2 * k + i] << 32 | i;
    }
}

// head[r]: row r starts a vertex's segment; ins[r]: row r is an insertion.
GU_STEP(gu_rows, (i64 R, i64 k, const i64* batch, const i64* keys, int* head, int* ins),
        (R, k, batch, keys, head, ins)) {
    GRID_STRIDE(r, R) {
        head[r] = r == 0 || (keys[r - 1] >> 32) != (keys[r] >> 32);
        ins[r] = batch[4 * k + (keys[r] & LOW32)] > 0;
    }
}

// seg: inclusive prefix sum of head (segment of row r = seg[r] - 1). row0[s]: first row
// of segment s; row0[n_seg] = R closes the last one. ts0[s] = MVG_INF until gu_split
// finds the segment's first insertion.
GU_STEP(gu_segments, (i64 R, const int* head, const int* seg, int* row0, i64* ts0),
        (R, head, seg, row0, ts0)) {
    GRID_STRIDE(r, R) {
        if (head[r]) {
            row0[seg[r] - 1] = (int)r;
            ts0[seg[r] - 1] = MVG_INF;
        }
        if (r == R - 1) row0[seg[r]] = (int)R;
    }
}

// Number of insertion rows before row r in its segment (insc: inclusive prefix sum of ins).
__device__ __forceinline__ int ins_before(const int* insc, const int* ins, int r0, i64 r) {
    return (insc[r] - ins[r]) - (insc[r0] - ins[r0]);
}

// Rows before a vertex's first insertion are deletions applied in place: they close the
// live entry of the current version (the last entry of the pair: entries of a pair are in
// ct order and only the newest can be alive). The first insertion splits the vertex:
// ts0[s] and first[s] get its timestamp and row.
GU_STEP(gu_split, (MVGView g, i64 R, i64 k, const i64* batch, const i64* keys, const int* seg, const int* insc,
        const int* ins, const int* row0, i64* ts0, int* first),
        (g, R, k, batch, keys, seg, insc, ins, row0, ts0, first)) {
    GRID_STRIDE(r, R) {
        const int s = seg[r] - 1;
        if (ins_before(insc, ins, row0[s], r)) continue;
        const Op o = row_op(batch, k, keys[r]);
        if (o.ins) {
            ts0[s] = o.ts;
            first[s] = (int)r;
            continue;
        }
        const int vid = g.cur[o.own];
        const i64 st = g.v_start[vid];
        const int p = pairs_upper(g, st, g.v_size[vid], pair_key(g.labels[o.nbr], o.nbr));
        g.e_dt[st + p - 1] = o.ts;
        atomicSub(g.v_live + vid, 1);
    }
}

// Per segment that has an insertion: the new version's size (live entries of the current
// version + insertions), its late deletions, and the allocation request
// class << 32 | segment (MVG_INF for the other segments, so that they sort last).
GU_STEP(gu_plan, (MVGView g, i64 R, const i64* keys, const int* seg, const int* insc, const int* ins, const int* row0,
        const i64* ts0, const int* first, i64* req, int* s_old, int* s_size, int* s_ndel, i64* stats),
        (g, R, keys, seg, insc, ins, row0, ts0, first, req, s_old, s_size, s_ndel, stats)) {
    const int n_seg = seg[R - 1], lane = threadIdx.x & 31;
    // warp by warp, so that the counters take one atomic per warp, not one per segment (all of
    // them hit the same words: thousands of them took a one-block plan some 0.1 ms)
    for (i64 w = blockIdx.x * (i64)blockDim.x + threadIdx.x - lane; w < R; w += (i64)gridDim.x * blockDim.x) {
        const i64 s = w + lane;
        unsigned long long made = 0, replaced = 0, empty = 0;
        i64 max_size = 0, at = -1;
        if (s < R && (s >= n_seg || ts0[s] == MVG_INF)) {
            req[s] = MVG_INF;
        } else if (s < R) {
            const int r0 = row0[s], r1 = row0[s + 1];
            const int n_ins = insc[r1 - 1] - (insc[r0] - ins[r0]);
            const int old = g.cur[keys[r0] >> 32];
            const int size = (old >= 0 ? g.v_live[old] : 0) + n_ins;
            s_old[s] = old;
            s_size[s] = size;
            s_ndel[s] = (r1 - first[s]) - n_ins;
            req[s] = (i64)size_class(size) << 32 | s;
            made = 1;
            max_size = size;
            if (old >= 0) {
                (g.v_cls[old] ? replaced : empty) = 1;
                at = ts0[s];
            }
        }
        for (int d = 16; d; d >>= 1) {
            made += __shfl_xor_sync(0xffffffffu, made, d);
            replaced += __shfl_xor_sync(0xffffffffu, replaced, d);
            empty += __shfl_xor_sync(0xffffffffu, empty, d);
            max_size = max(max_size, __shfl_xor_sync(0xffffffffu, max_size, d));
            at = max(at, __shfl_xor_sync(0xffffffffu, at, d));
        }
        if (lane || !made) continue;
        atomicAdd((unsigned long long*)(stats + S_NEW), made);
        atomicMax(stats + S_MAX_SIZE, max_size);
        if (replaced) atomicAdd((unsigned long long*)(stats + S_REPLACED), replaced);
        if (empty) atomicAdd((unsigned long long*)(stats + S_EMPTY), empty);
        if (at >= 0) atomicMax(stats + S_REPLACED_AT, at);
    }
}

// req sorted: requests of a class are consecutive. The rank-th request of class c takes the
// rank-th free block of c from the top of its free-list segment (pos), or a fresh block
// from the bump pointer (pos = -1, fresh = 1, fresh_size = its capacity). sizes holds 3
// rows of R, prefix-summed next in one call: fresh, fresh_size, and old_size (the size of
// the version that request j copies).
GU_STEP(gu_alloc_rank, (MVGView g, i64 R, const i64* req, const i64* free_keys, i64 n_free, const int* s_old,
        i64* pos, i64* sizes),
        (g, R, req, free_keys, n_free, s_old, pos, sizes)) {
    i64 *fresh = sizes, *fresh_size = sizes + R, *old_size = sizes + 2 * R;
    GRID_STRIDE(j, R) {
        pos[j] = -1;
        fresh[j] = 0;
        fresh_size[j] = 0;
        old_size[j] = 0;
        if (req[j] == MVG_INF) continue;
        const int old = s_old[req[j] & LOW32];
        if (old >= 0) old_size[j] = g.v_size[old];
        const i64 c = req[j] >> 32;
        const i64 rank = j - lower_bound(req, R, c << 32);
        const i64 lo = lower_bound(free_keys, n_free, c << 32), hi = lower_bound(free_keys, n_free, (c + 1) << 32);
        if (rank < hi - lo) {
            pos[j] = hi - 1 - rank;
        } else {
            fresh[j] = 1;
            fresh_size[j] = class_capacity((int)c);
        }
    }
}

// Ids and blocks of the new versions: from the free list (marked taken with MVG_INF, sorted
// out before the next allocation) or fresh: ids after n_versions, blocks after bump
// (fresh_n, fresh_end: inclusive prefix sums of fresh, fresh_size).
GU_STEP(gu_alloc, (MVGView g, i64 R, const i64* req, i64* free_keys, const i64* pos, const i64* fresh_n,
        const i64* fresh_end, const i64* sizes, i64 n_versions, i64 bump, const int* s_old, int* s_slot, int* q_vid,
        i64* q_start, int* q_old),
        (g, R, req, free_keys, pos, fresh_n, fresh_end, sizes, n_versions, bump, s_old, s_slot, q_vid, q_start,
        q_old)) {
    const i64* fresh_size = sizes + R;
    GRID_STRIDE(j, R) {
        if (req[j] == MVG_INF) continue;
        const int s = (int)(req[j] & LOW32);
        int vid;
        i64 start;
        if (pos[j] >= 0) {
            vid = (int)(free_keys[pos[j]] & LOW32);
            start = g.v_start[vid];
            free_keys[pos[j]] = MVG_INF;
        } else {
            vid = (int)(n_versions + fresh_n[j] - 1);
            start = bump + fresh_end[j] - fresh_size[j];
        }
        s_slot[s] = (int)j;
        q_vid[j] = vid;
        q_start[j] = start;
        q_old[j] = s_old[s];
    }
}

// The batch's counters that the host needs before the copy (one read-back per batch).
// ends: the prefix sums of gu_alloc_rank's sizes.
GU_STEP(gu_stats, (i64 R, const i64* ends, i64* stats),
        (R, ends, stats)) {
    GRID_STRIDE(i, 1) {
        stats[S_FRESH] = ends[R - 1];
        stats[S_FRESH_ENTRIES] = ends[2 * R - 1];
        stats[S_COPY] = ends[3 * R - 1];
    }
}

// The version table rows of the new versions (not yet reachable: cur still names the old).
GU_STEP(gu_versions, (MVGView g, i64 n_new, const i64* req, const int* q_vid, const i64* q_start, const i64* ts0,
        const int* s_old, const int* s_size, const int* s_ndel),
        (g, n_new, req, q_vid, q_start, ts0, s_old, s_size, s_ndel)) {
    GRID_STRIDE(j, n_new) {
        const int s = (int)(req[j] & LOW32), vid = q_vid[j];
        g.v_ct_min[vid] = ts0[s];
        g.v_dt_max[vid] = MVG_INF;
        g.v_prev[vid] = s_old[s];
        g.v_start[vid] = q_start[j];
        g.v_size[vid] = s_size[s];
        g.v_cls[vid] = (int)(req[j] >> 32);
        g.v_live[vid] = s_size[s] - s_ndel[s];
        // the copied entries are older than ts0, which every read of this version is after;
        // gu_insert raises it to the newest insertion
        g.v_ct_hi[vid] = -1;
    }
}

// Sort keys of the insertion rows: by (neighbour label, neighbour) first, then (stably) by
// (insertion first, vertex): the rows of a vertex then come in entry order, ties in time order.
GU_STEP(gu_ins_keys, (MVGView g, i64 R, i64 k, const i64* batch, const i64* keys, i64* pair, i64* owner),
        (g, R, k, batch, keys, pair, owner)) {
    GRID_STRIDE(r, R) {
        const Op o = row_op(batch, k, keys[r]);
        pair[r] = pair_key(g.labels[o.nbr], o.nbr);
        owner[r] = (i64)!o.ins << 62 | o.own;
    }
}

// The copy space: the old versions' arrays one after another (old_end: inclusive prefix
// sum of their sizes). live[k]: entry k is still alive and is copied (live[total] = 0).
__device__ __forceinline__ i64 copy_source(const MVGView& g, i64 n_new, const i64* old_end, const int* q_old, i64 k,
                                           i64* j, i64* o) {
    *j = upper_bound(old_end, n_new, k);
    *o = *j ? old_end[*j - 1] : 0;
    return g.v_start[q_old[*j]] + k - *o;
}

GU_STEP(gu_copy_flags, (MVGView g, i64 total, i64 n_new, const i64* old_end, const int* q_old, int* live),
        (g, total, n_new, old_end, q_old, live)) {
    if (blockIdx.x == 0 && threadIdx.x == 0) live[total] = 0;
    GRID_STRIDE(k, total) {
        i64 j, o;
        live[k] = g.e_dt[copy_source(g, n_new, old_end, q_old, k, &j, &o)] == MVG_INF;
    }
}

// Live entries of the copy space before position x (incl: inclusive prefix sum of live).
__device__ __forceinline__ i64 live_before(const int* live, const i64* incl, i64 x) { return incl[x] - live[x]; }

// The insertions of segment s in the sorted insertion arrays: [lo, hi).
__device__ __forceinline__ void seg_inserts(const int* row0, const int* insc, const int* ins, int s, i64* lo, i64* hi) {
    const int r0 = row0[s], r1 = row0[s + 1];
    *lo = insc[r0] - ins[r0];
    *hi = insc[r1 - 1];
}

// Merge, old side: a live entry lands after the live entries before it and after the
// insertions with a smaller pair (on an equal pair the old entry is older, so first).
GU_STEP(gu_copy, (MVGView g, i64 total, i64 n_new, const i64* old_end, const int* q_old, const i64* q_start,
        const i64* req, const int* live, const i64* incl, const int* row0, const int* insc, const int* ins,
        const i64* i_pair),
        (g, total, n_new, old_end, q_old, q_start, req, live, incl, row0, insc, ins, i_pair)) {
    GRID_STRIDE(k, total) {
        if (!live[k]) continue;
        i64 j, o, lo, hi;
        const i64 src = copy_source(g, n_new, old_end, q_old, k, &j, &o);
        seg_inserts(row0, insc, ins, (int)(req[j] & LOW32), &lo, &hi);
        const i64 key = pair_key(g.e_lab[src], g.e_nbr[src]);
        const i64 dst = q_start[j] + live_before(live, incl, k) - live_before(live, incl, o) +
                        lower_bound(i_pair + lo, hi - lo, key);
        g.e_nbr[dst] = g.e_nbr[src];
        g.e_lab[dst] = g.e_lab[src];
        g.e_el[dst] = g.e_el[src];
        g.e_ct[dst] = g.e_ct[src];
        g.e_dt[dst] = MVG_INF;
        if (g.e_ts) {
            g.e_ts[dst] = g.e_ts[src];
            g.e_tsin[dst] = g.e_tsin[src];
        }
    }
}

// Merge, insertion side: the q-th sorted insertion row lands after the earlier insertions
// of its vertex and after the live old entries whose pair is <= its pair; the version's
// ct_hi becomes its newest insertion.
GU_STEP(gu_insert, (MVGView g, i64 n_ins, i64 k, const i64* batch, const i64* keys, const i64* perm,
        const i64* i_pair, const int* seg, const int* row0, const int* insc, const int* ins, const int* s_slot,
        const i64* old_end, const int* q_old, const int* q_vid, const i64* q_start, const int* live, const i64* incl),
        (g, n_ins, k, batch, keys, perm, i_pair, seg, row0, insc, ins, s_slot, old_end, q_old, q_vid, q_start, live,
        incl)) {
    GRID_STRIDE(q, n_ins) {
        const i64 r = perm[q];
        const Op o = row_op(batch, k, keys[r]);
        const int s = seg[r] - 1, j = s_slot[s], old = q_old[j];
        i64 lo, hi, before = 0;
        seg_inserts(row0, insc, ins, s, &lo, &hi);
        if (old >= 0) {
            const i64 o0 = j ? old_end[j - 1] : 0;
            const int p = pairs_upper(g, g.v_start[old], g.v_size[old], i_pair[q]);
            before = live_before(live, incl, o0 + p) - live_before(live, incl, o0);
        }
        const i64 dst = q_start[j] + (q - lo) + before;
        g.e_nbr[dst] = o.nbr;
        g.e_lab[dst] = (int)(i_pair[q] >> 32);
        g.e_el[dst] = o.el;
        g.e_ct[dst] = o.ts;
        g.e_dt[dst] = MVG_INF;
        if (g.e_ts) row_ts(g, batch, k, keys[r], dst);
        atomicMax(g.v_ct_hi + q_vid[j], o.ts);
    }
}

// A deletion from the first insertion on closes, in the new version, the entry of its pair
// that is alive at its timestamp: the last one created before it.
GU_STEP(gu_close, (MVGView g, i64 R, i64 k, const i64* batch, const i64* keys, const int* seg, const i64* ts0,
        const int* first, const int* s_slot, const i64* q_start, const int* s_size),
        (g, R, k, batch, keys, seg, ts0, first, s_slot, q_start, s_size)) {
    GRID_STRIDE(r, R) {
        const int s = seg[r] - 1;
        if (ts0[s] == MVG_INF || r < first[s]) continue;
        const Op o = row_op(batch, k, keys[r]);
        if (o.ins) continue;
        const i64 st = q_start[s_slot[s]];
        const int p = triples_lower(g, st, s_size[s], pair_key(g.labels[o.nbr], o.nbr), o.ts);
        g.e_dt[st + p - 1] = o.ts;
    }
}

// Publication, last: the replaced version stops at ts0, the new one becomes current.
GU_STEP(gu_publish, (MVGView g, i64 n_new, const i64* req, const i64* keys, const int* row0, const i64* ts0,
        const int* q_vid, const int* q_old),
        (g, n_new, req, keys, row0, ts0, q_vid, q_old)) {
    GRID_STRIDE(j, n_new) {
        const int s = (int)(req[j] & LOW32);
        if (q_old[j] >= 0) g.v_dt_max[q_old[j]] = ts0[s];
        __threadfence();
        *(volatile int*)(g.cur + (keys[row0[s]] >> 32)) = q_vid[j];
    }
}

// ---- batches of up to GU_SMALL_ROWS rows -------------------------------------------------------
// Such a batch is planned in one block: small_plan runs the steps above up to the allocation
// in order, with block-wide sorts and prefix sums between them (in shared memory: 8 bytes per
// row, rounded up to a power of two, given at launch). What follows, the copy and the merge,
// is bound by the copied arrays, not by the rows: one block copies some 150 entries a
// microsecond, and a grid-wide write costs five launches (gu_mid_*, some 60 us of host time),
// so gu_small_apply writes the batch in the same block where it copies at most fused_copy
// entries (GU_FUSED_COPY unless the host says otherwise), and the gu_mid_* launches, which
// read the sizes from the counters on the device, do it otherwise. The host launches those
// only where the batch's worst case copies more than it leaves to one block whatever the copy
// (DeviceMVG.solo_copy: a single op next to a hub of an R-MAT graph copies a million
// entries, 10 ms in one block), and passes fused_copy = MVG_INF where it does not. Either way the host needs no
// counter before the copy where it could make room for the batch's worst case beforehand
// (DeviceMVG._apply_small): the counters are written to pinned memory and read at the next
// apply. Else gu_small_plan runs alone and the host reads them back before the write.
// Scratch arrays are carved from one arena of GU_SMALL_ARENA words that the host allocates
// once. device_mvg.py reads these constants through gu_small_layout.
#define GU_SMALL_ROWS 16384
#define GU_FUSED_COPY 8192
#define GU_SMALL_THREADS 1024
#define GU_SMALL_ARENA (15 * GU_SMALL_ROWS + 6 * (GU_SMALL_ROWS + 1))

struct GuSmall {
    i64 *keys, *ts0, *req, *pos, *q_start, *pair, *owner, *perm, *i_pair, *sizes, *ends;
    int *head, *ins, *seg, *insc, *row0, *first, *s_old, *s_size, *s_ndel, *s_slot, *q_vid, *q_old;

    __device__ explicit GuSmall(i64* arena) {
        const int N = GU_SMALL_ROWS;
        keys = arena, ts0 = keys + N, req = ts0 + N, pos = req + N, q_start = pos + N, pair = q_start + N;
        owner = pair + N, perm = owner + N, i_pair = perm + N, sizes = i_pair + N, ends = sizes + 3 * N;
        head = (int*)(ends + 3 * N), ins = head + N + 1, seg = ins + N + 1, insc = seg + N + 1;
        row0 = insc + N + 1, first = row0 + N + 1, s_old = first + N + 1, s_size = s_old + N + 1;
        s_ndel = s_size + N + 1, s_slot = s_ndel + N + 1, q_vid = s_slot + N + 1, q_old = q_vid + N + 1;
    }
};

// out: GU_SMALL_ROWS, GU_FUSED_COPY, GU_SMALL_THREADS, GU_SMALL_ARENA (read by the host once).
extern "C" __global__ void gu_small_layout(i64* out) {
    out[0] = GU_SMALL_ROWS;
    out[1] = GU_FUSED_COPY;
    out[2] = GU_SMALL_THREADS;
    out[3] = GU_SMALL_ARENA;
}

// The insertion rows in entry order per vertex, as gu_ins_keys and two stable argsorts give them
// on the grid path: perm[0, n_ins) and their pair keys i_pair. Rows are sorted by (vertex, op),
// so segment order is vertex order; one sort of the pairs in shared memory ranks them, and one
// sort of (segment, pair rank, row) keys (21 bits each: R <= 2^21) orders the insertion rows.
__device__ __forceinline__ void small_ins_order(const MVGView& g, i64 R, i64 k, const i64* batch, const GuSmall& s,
                                                i64* sh) {
    const int P = pow2_at_least(R);
    for (i64 r = threadIdx.x; r < P; r += blockDim.x) {
        i64 key = MVG_INF;
        if (r < R) {
            const Op o = row_op(batch, k, s.keys[r]);
            key = s.pair[r] = pair_key(g.labels[o.nbr], o.nbr);
        }
        sh[r] = key;
    }
    __syncthreads();
    block_sort_shared(sh, P);
    for (i64 r = threadIdx.x; r < R; r += blockDim.x)
        s.owner[r] = s.ins[r] ? (i64)(s.seg[r] - 1) << 42 | lower_bound(sh, R, s.pair[r]) << 21 | r : MVG_INF;
    __syncthreads();
    block_sort(s.owner, R, sh);
    for (i64 q = threadIdx.x; q < R; q += blockDim.x) {
        if (s.owner[q] == MVG_INF) break;
        s.perm[q] = s.owner[q] & ((1 << 21) - 1);
        s.i_pair[q] = s.pair[s.perm[q]];
    }
    __syncthreads();
}

// sort_free > 0: the free list's first sort_free keys are sorted first (at most GU_SMALL_ROWS).
// sh: 8 * pow2_at_least(max(R, sort_free)) bytes.
__device__ __forceinline__ void small_plan(const MVGView& g, i64 R, i64 k, const i64* batch, const GuSmall& s,
                                           i64* stats, i64* free_keys, i64 n_free, i64 sort_free, i64 n_versions,
                                           i64 bump, i64* sh) {
    gu_keys_step(k, batch, s.keys, stats);
    __syncthreads();
    block_sort(s.keys, R, sh);
    gu_rows_step(R, k, batch, s.keys, s.head, s.ins);
    __syncthreads();
    block_scan(s.head, s.seg, R);
    block_scan(s.ins, s.insc, R);
    gu_segments_step(R, s.head, s.seg, s.row0, s.ts0);
    __syncthreads();
    gu_split_step(g, R, k, batch, s.keys, s.seg, s.insc, s.ins, s.row0, s.ts0, s.first);
    __syncthreads();
    gu_plan_step(g, R, s.keys, s.seg, s.insc, s.ins, s.row0, s.ts0, s.first, s.req, s.s_old, s.s_size, s.s_ndel,
                 stats);
    __syncthreads();
    block_sort(s.req, R, sh);
    if (sort_free) block_sort(free_keys, sort_free, sh);
    gu_alloc_rank_step(g, R, s.req, free_keys, n_free, s.s_old, s.pos, s.sizes);
    __syncthreads();
    for (int row = 0; row < 3; ++row) block_scan(s.sizes + row * R, s.ends + row * R, R);
    gu_alloc_step(g, R, s.req, free_keys, s.pos, s.ends, s.ends + R, s.sizes, n_versions, bump, s.s_old, s.s_slot,
                  s.q_vid, s.q_start, s.q_old);
    __syncthreads();
    gu_stats_step(R, s.ends, stats);
    small_ins_order(g, R, k, batch, s, sh);
}

// live, incl: room for stats[S_COPY] + 1 items; vids: room for stats[S_NEW] (the replaced
// versions, for the GC).
__device__ __forceinline__ void small_write(const MVGView& g, i64 R, i64 k, const i64* batch, const GuSmall& s,
                                            const i64* stats, i64 n_ins, int* live, i64* incl, int* vids) {
    const i64 n_new = stats[S_NEW], total = stats[S_COPY], *old_end = s.ends + 2 * R;
    gu_versions_step(g, n_new, s.req, s.q_vid, s.q_start, s.ts0, s.s_old, s.s_size, s.s_ndel);
    gu_copy_flags_step(g, total, n_new, old_end, s.q_old, live);
    __syncthreads();
    block_scan(live, incl, total + 1);
    // the old side and the insertion side of the merge write disjoint entries
    gu_copy_step(g, total, n_new, old_end, s.q_old, s.q_start, s.req, live, incl, s.row0, s.insc, s.ins, s.i_pair);
    gu_insert_step(g, n_ins, k, batch, s.keys, s.perm, s.i_pair, s.seg, s.row0, s.insc, s.ins, s.s_slot, old_end,
                   s.q_old, s.q_vid, s.q_start, live, incl);
    __syncthreads();
    gu_close_step(g, R, k, batch, s.keys, s.seg, s.ts0, s.first, s.s_slot, s.q_start, s.s_size);
    __syncthreads();
    gu_publish_step(g, n_new, s.req, s.keys, s.row0, s.ts0, s.q_vid, s.q_old);
    for (i64 j = threadIdx.x; j < n_new; j += blockDim.x) vids[j] = s.q_old[j];
}

// out: where the counters also go (pinned host memory, read by the host later with no copy
// to enqueue), or null.
extern "C" __global__ void __launch_bounds__(GU_SMALL_THREADS)
gu_small_plan(MVGView g, i64 R, i64 k, const i64* batch, i64* arena, i64* stats, i64* free_keys, i64 n_free,
              i64 sort_free, i64 n_versions, i64 bump, i64* out) {
    extern __shared__ i64 sh[];
    small_plan(g, R, k, batch, GuSmall(arena), stats, free_keys, n_free, sort_free, n_versions, bump, sh);
    if (out && threadIdx.x < S_COUNT) out[threadIdx.x] = stats[threadIdx.x];
}

extern "C" __global__ void __launch_bounds__(GU_SMALL_THREADS)
gu_small_write(MVGView g, i64 R, i64 k, const i64* batch, i64* arena, const i64* stats, i64 n_ins, int* live,
               i64* incl, int* vids) {
    small_write(g, R, k, batch, GuSmall(arena), stats, n_ins, live, incl, vids);
}

// Both in one launch, where the host made room for the batch's worst case beforehand; the write
// only if it copies at most fused_copy entries (else the gu_mid_* launches that follow do it).
extern "C" __global__ void __launch_bounds__(GU_SMALL_THREADS)
gu_small_apply(MVGView g, i64 R, i64 k, const i64* batch, i64* arena, i64* stats, i64* free_keys, i64 n_free,
               i64 sort_free, i64 n_versions, i64 bump, i64 n_ins, i64 fused_copy, int* live, i64* incl, int* vids,
               i64* out) {
    extern __shared__ i64 sh[];
    const GuSmall s(arena);
    small_plan(g, R, k, batch, s, stats, free_keys, n_free, sort_free, n_versions, bump, sh);
    if (threadIdx.x < S_COUNT) out[threadIdx.x] = stats[threadIdx.x];
    if (stats[S_COPY] > fused_copy) return;
    small_write(g, R, k, batch, s, stats, n_ins, live, incl, vids);
    if (threadIdx.x == 0) stats[S_WRITTEN] = 1;
}

// The write of a planned batch over the grid, in the order of small_write, one launch per
// barrier. Each launch takes its sizes from the counters (the host may know only bounds), and
// does nothing where gu_small_apply wrote the batch.
// gu_mid_flags: the new versions' rows and the copy flags; tiles[t] gets the live entries of
// items [t B, (t + 1) B) of the copy space's total + 1 (B = blockDim.x), and the last block
// to finish turns tiles into their inclusive prefix sum. gu_mid_incl (same block size)
// completes incl from it.
extern "C" __global__ void gu_mid_flags(MVGView g, i64 R, i64* arena, i64* stats, int* live, i64* tiles) {
    if (stats[S_WRITTEN]) return;
    const GuSmall s(arena);
    const i64 n_new = stats[S_NEW], total = stats[S_COPY], *old_end = s.ends + 2 * R;
    gu_versions_step(g, n_new, s.req, s.q_vid, s.q_start, s.ts0, s.s_old, s.s_size, s.s_ndel);
    for (i64 base = (i64)blockIdx.x * blockDim.x; base <= total; base += (i64)gridDim.x * blockDim.x) {
        const i64 x = base + threadIdx.x;
        int f = 0;
        if (x < total) {
            i64 j, o;
            f = g.e_dt[copy_source(g, n_new, old_end, s.q_old, x, &j, &o)] == MVG_INF;
        }
        if (x <= total) live[x] = f;
        const int c = __syncthreads_count(f);
        if (threadIdx.x == 0) tiles[base / blockDim.x] = c;
    }
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0)
        last = atomicAdd((unsigned long long*)(stats + S_DONE), 1ull) == gridDim.x - 1;
    __syncthreads();
    if (last) {  // every other block's tiles are written (and bypass this SM's L1: volatile)
        __threadfence();
        block_scan((const volatile i64*)tiles, tiles, total / blockDim.x + 1);
    }
}

extern "C" __global__ void gu_mid_incl(const i64* stats, const int* live, const i64* tiles, i64* incl) {
    if (stats[S_WRITTEN]) return;
    const i64 total = stats[S_COPY];
    for (i64 base = (i64)blockIdx.x * blockDim.x; base <= total; base += (i64)gridDim.x * blockDim.x) {
        const i64 x = base + threadIdx.x, t = base / blockDim.x;
        i64 sum;
        const i64 v = block_incl<i64>(x <= total ? live[x] : 0, &sum);
        if (x <= total) incl[x] = v + (t ? tiles[t - 1] : 0);
    }
}

extern "C" __global__ void gu_mid_copy(MVGView g, i64 R, i64 k, const i64* batch, i64* arena, const i64* stats,
                                       i64 n_ins, const int* live, const i64* incl) {
    if (stats[S_WRITTEN]) return;
    const GuSmall s(arena);
    const i64 n_new = stats[S_NEW], total = stats[S_COPY], *old_end = s.ends + 2 * R;
    gu_copy_step(g, total, n_new, old_end, s.q_old, s.q_start, s.req, live, incl, s.row0, s.insc, s.ins, s.i_pair);
    gu_insert_step(g, n_ins, k, batch, s.keys, s.perm, s.i_pair, s.seg, s.row0, s.insc, s.ins, s.s_slot, old_end,
                   s.q_old, s.q_vid, s.q_start, live, incl);
}

extern "C" __global__ void gu_mid_close(MVGView g, i64 R, i64 k, const i64* batch, i64* arena, const i64* stats) {
    if (stats[S_WRITTEN]) return;
    const GuSmall s(arena);
    gu_close_step(g, R, k, batch, s.keys, s.seg, s.ts0, s.first, s.s_slot, s.q_start, s.s_size);
}

extern "C" __global__ void gu_mid_publish(MVGView g, i64* arena, const i64* stats, int* vids) {
    if (stats[S_WRITTEN]) return;
    const GuSmall s(arena);
    const i64 n_new = stats[S_NEW];
    gu_publish_step(g, n_new, s.req, s.keys, s.row0, s.ts0, s.q_vid, s.q_old);
    GRID_STRIDE(j, n_new) vids[j] = s.q_old[j];
}

// ---- garbage collection -----------------------------------------------------------------------
// Released versions as free-list keys (class << 32 | vid; MVG_INF: nothing to free: no
// version, or an empty one, which owns no block and whose id is not reused).
extern "C" __global__ void mvg_release(MVGView g, i64 m, const int* vids, i64* out) {
    GRID_STRIDE(i, m) {
        const int vid = vids[i];
        out[i] = vid >= 0 && g.v_cls[vid] ? (i64)g.v_cls[vid] << 32 | vid : MVG_INF;
    }
}

// ---- batched reads (the host-facing queries and the tests of mvg_access.cuh) -------------------
extern "C" __global__ void mvg_versions_at(MVGView g, i64 m, const int* v, const i64* T, int* vid) {
    GRID_STRIDE(i, m) vid[i] = version_at(g, v[i], T[i]);
}

extern "C" __global__ void mvg_label_ranges_at(MVGView g, i64 m, const int* v, const int* lab, const i64* T,
                                               i64* start, int* size) {
    GRID_STRIDE(i, m) label_range_at(g, v[i], lab[i], T[i], start + i, size + i);
}

// q: the rows a, b, T, el of m look-ups, one upload. out[i]: the entry of {a, b} visible at T
// (-1: none); out[m + i]: its edge label (-1: none), one read-back.
extern "C" __global__ void mvg_edges_at(MVGView g, i64 m, const i64* q, int check_el, i64* out) {
    GRID_STRIDE(i, m) {
        const i64 pos = edge_at(g, (int)q[i], (int)q[m + i], q[2 * m + i], (int)q[3 * m + i], check_el);
        out[i] = pos;
        out[m + i] = pos >= 0 ? g.e_el[pos] : -1;
    }
}

// The current versions' entries as a copy space over vertices (end: inclusive prefix sum of
// their sizes): each undirected edge alive now, once (src < dst); src = -1 elsewhere.
extern "C" __global__ void mvg_live_edges(MVGView g, i64 total, const i64* end, i64* src, i64* dst, int* label) {
    GRID_STRIDE(k, total) {
        const i64 v = upper_bound(end, g.n, k);
        const i64 pos = g.v_start[g.cur[v]] + k - (end[v] - g.v_size[g.cur[v]]);
        const int w = g.e_nbr[pos];
        const bool keep = g.e_dt[pos] == MVG_INF && v < w;
        src[k] = keep ? v : -1;
        dst[k] = w;
        label[k] = g.e_el[pos];
    }
}
