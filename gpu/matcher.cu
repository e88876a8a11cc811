// Static subgraph enumeration: depth-first per warp over fine-grained tasks (gMatch), with a
// global task queue fed by time-based offload for skewed search trees (BUG). One launch
// searches a batch of queries: every root-pool chunk and task names its query, and a warp
// copies that query's table into its own shared memory when it switches.
//
// Each warp keeps a stack of levels in shared memory. Level k holds up to 32 nodes: partial
// matches whose vertex at depth k is v[s] and whose prefix continues at parent[s] on level
// k - 1. Each node carries the candidate range for depth k + 1: the label-grouped neighbours
// of its cheapest backward neighbour (depth piv[s]). The ranges of all nodes of a level are
// one virtual list (exclusive offsets off[]); the warp consumes it 32 entries at a time, so
// a batch mixes candidates of several parents and lanes never idle on small ranges.
// Candidate sets are never materialized; the other backward edges are binary searches.
//
// Survivors of a batch form the next level, and the warp descends at once (depth-first, so
// memory is |V(q)| x 32 nodes per warp whatever the number of matches). At the last depth
// matches are counted, or written to a bounded output buffer: when it is full the warp
// leaves its cursor where it was and the kernel returns; the host drains the buffer and
// relaunches with the saved stacks, which recompute the same batch (no loss, no duplicate).
//
// One search body, two graph views (the template parameter View):
//   StaticView     the static CSR: candidates are the label-grouped neighbours whose
//                  candidate bit (filtering) is set, reached over the right edge label;
//   VersionedView  the multi-version graph at the work's timestamp T (mvg_access.cuh):
//                  candidates are the entries visible at T with the right edge label
//                  (label-only candidates: the graph changes under the filter).
// A work id (WarpState.q, Task.q) names a query in the static search and a seed (one
// update, one anchor, one orientation) in the versioned one: the seeds' rows give its
// prefix, timestamp and table, and counts are kept per work id.
#include "graph_access.cuh"
#include "mvg_access.cuh"
#include "task_ring.cuh"

// The query a warp works on: its table (in the warp's shared memory), its candidate bits
// (static view), its edge labels by depth ([d][j], read only with check_el), its count_last
// prefix sums (static view), the timestamp it reads at (versioned view) and under event time
// its time words (layout.cuh; null: the search keeps no ts) and span (-1: none).
struct Query {
    const QueryTable* t;
    const unsigned* __restrict__ cbits;
    const int* __restrict__ el;
    const int* __restrict__ prefix;
    i64 T;
    const int* __restrict__ tt;
    i64 span;
    i64 t_out, t_back;  // under event time, a seed's own arcs' ts: depth 0's image -> depth 1's, and back
};

struct StaticView {
    static constexpr bool versioned = false;
    const i64* __restrict__ indptr;
    const int* __restrict__ adj;
    const int* __restrict__ adj_el;
    const int* __restrict__ gadj;
    const int* __restrict__ gadj_el;
    const int* __restrict__ vlabel;
    LabelIndex li;
    int check_el;

    // The entries that may hold v's neighbours labelled lab, as [start, start + size).
    __device__ __forceinline__ void range(const Query&, int v, int lab, i64* start, int* size) const {
        label_range(indptr, gadj, vlabel, li, v, lab, start, size);
    }
    // The vertex at entry pos, and whether it is a candidate of depth d reached over label el.
    __device__ __forceinline__ bool candidate(const Query& qc, i64 pos, int d, int el, int* c) const {
        *c = __ldg(gadj + pos);
        bool pass = (__ldg(qc.cbits + *c) >> d) & 1u;
        if (pass && check_el) pass = label_ok(__ldg(gadj_el + pos), el);
        return pass;
    }
    __device__ __forceinline__ bool edge(const Query&, int v, int w, int el) const {
        return has_edge(indptr, adj, adj_el, check_el, v, w, el);
    }
    __device__ __forceinline__ int nbr(i64 pos) const { return __ldg(gadj + pos); }
};

// Edge labels are always compared (the MVG stores 0 where the graph has none); plain: no
// edge of the graph has a label yet (DeviceMVG.has_edge_labels), so that a query asking for
// label 0 may count a clean range without reading them (count_suffix_at).
struct VersionedView {
    static constexpr bool versioned = true;
    static constexpr int check_el = 1;
    MVGView m;
    int plain;

    __device__ __forceinline__ void range(const Query& qc, int v, int lab, i64* start, int* size) const {
        label_range_at(m, v, lab, qc.T, start, size);
    }
    __device__ __forceinline__ bool candidate(const Query& qc, i64 pos, int, int el, int* c) const {
        *c = MVG_ENTRY(m.e_nbr + pos);
        return visible(m, pos, qc.T) && label_ok(MVG_ENTRY(m.e_el + pos), el);
    }
    __device__ __forceinline__ bool edge(const Query& qc, int v, int w, int el) const {
        return edge_at(m, v, w, qc.T, el, true) >= 0;
    }
    __device__ __forceinline__ int nbr(i64 pos) const { return MVG_ENTRY(m.e_nbr + pos); }
};

struct Batch {
    const QueryTable* __restrict__ tabs;
    const unsigned* __restrict__ cbits;  // static: per table, n words
    const int* __restrict__ el;
    const int* __restrict__ prefix;
    const i64* __restrict__ prefix_at;  // per table: offset into prefix, -1 none (static)
    const int* __restrict__ chunk_q;    // work id of each root-pool chunk (static)
    const i64* __restrict__ seeds;      // versioned: rows a, b, T, table (under event time also the ts
                                        // of the arcs a -> b, b -> a) of the n_seeds work ids
    i64 n, n_seeds;
    const int* __restrict__ tt;         // versioned, under event time: TT_WORDS per table (else null)
    const i64* __restrict__ tspan;      // and the span of each table (-1: none)
    int split_n, split_i;               // a search split over split_n > 1 devices: this one's part, and
    int split_range;                    // the ranges it deals out where it can (deal_at)
};

enum { SEED_A, SEED_B, SEED_T, SEED_TAB, SEED_TS_OUT, SEED_TS_BACK };

__device__ __forceinline__ i64 seed(const Batch& b, int row, int q) { return __ldg(b.seeds + row * b.n_seeds + q); }

__device__ __forceinline__ int table_of(const Batch& b, int q) { return b.seeds ? (int)seed(b, SEED_TAB, q) : q; }

__device__ __forceinline__ Query query_of(const Batch& b, const QueryTable* t, int q) {
    const int tab = table_of(b, q);
    const i64 at = b.prefix_at ? __ldg(b.prefix_at + tab) : -1;
    const int* tt = b.tt && __ldg(b.tt + (i64)tab * TT_WORDS) ? b.tt + (i64)tab * TT_WORDS : nullptr;
    return {t, b.cbits ? b.cbits + (i64)tab * b.n : nullptr, b.el + (i64)tab * MAXQ * MAXQ,
            at < 0 ? nullptr : b.prefix + at, b.seeds ? seed(b, SEED_T, q) : 0, tt, tt ? __ldg(b.tspan + tab) : -1,
            tt ? seed(b, SEED_TS_OUT, q) : 0, tt ? seed(b, SEED_TS_BACK, q) : 0};
}

// A search split over devices (gpu/replicas.py, and the static one of gpu/engine.py on_devices)
// deals out the subtrees under each seed or root. Every device takes every seed and root (the
// same pool on every device); along each prefix, the first node whose candidate range is for depth D
// (the last depth enumerated: n - 1, or the last before the tail that count_suffix_at counts at
// once), or holds at least split_range entries, keeps only this device's share of the range
// (my_share), and the subtrees of its candidates are the device's alone (Level.dealt, inherited
// by every node under it; an offloaded node carries it in its task). The ranges above D are
// searched on every device: dealing out an earlier range sends a hub in it, and its whole subtree,
// to one device (matcher.py DEAL_RANGE). Seeds and roots of a query of fewer than 4 vertices, or
// with a tail counted at once from depth 2, are dealt out whole (mine_whole): their work is one
// range or less a seed.
__device__ __forceinline__ int deal_depth(const QueryTable* Q, int emit) {
    return emit || !Q->fast ? Q->n - 1 : Q->n - Q->fast - 1;
}

__device__ __forceinline__ bool below_seed(const Batch& b, const QueryTable* Q, int emit) {
    return b.split_n > 1 && Q->n >= 4 && deal_depth(Q, emit) >= 2;
}

// This device's share of a candidate range [*st, *st + *len): the entries whose vertex lies in its
// share of the range's values, cut before the entries at evenly spaced positions. A range is a
// label range of a version, sorted by neighbour (a re-inserted pair's entries side by side), with
// the same entries on every replica: the shares of all devices partition it. The static graph's
// label ranges are sorted by id, and the same on every device.
template <class View>
__device__ void my_share(const View& g, const Batch& b, i64* st, int* len) {
    const i64 s = *st, n = *len;
    auto cut = [&](int i) -> i64 {
        if (i == 0) return s;
        if (i == b.split_n) return s + n;
        const int v = g.nbr(s + n * i / b.split_n);
        i64 lo = s, hi = s + n * i / b.split_n;  // first entry with neighbour >= v
        while (lo < hi) {
            const i64 m = (lo + hi) >> 1;
            if (g.nbr(m) < v) lo = m + 1; else hi = m;
        }
        return lo;
    };
    const i64 lo = cut(b.split_i);
    *len = (int)(cut(b.split_i + 1) - lo);
    *st = lo;
}

// A node whose prefix is not dealt yet, with the range [*st, *st + *size) for depth d: deal it out
// here (keeping this device's share) or not. Returns whether it did.
template <class View>
__device__ __forceinline__ bool deal_at(const View& g, const Batch& b, const QueryTable* Q, int emit, int d, i64* st,
                                        int* size) {
    const int D = deal_depth(Q, emit);
    if (!below_seed(b, Q, emit) || d > D || (d < D && *size < b.split_range)) return false;
    my_share(g, b, st, size);
    return true;
}

// Is a seed or root row dealt out whole this device's? Seed q is device q % split_n's (the seeds'
// order is the host's, the same for every device); a root row, whose place in the pool may differ
// between devices (the widening pre-pass writes its rows in no set order), goes by a hash of its
// vertices.
__device__ __forceinline__ bool mine_whole(const Batch& b, int q, const int* pool, i64 i, int m) {
    if (b.seeds) return q % b.split_n == b.split_i;
    unsigned h = 0;
    for (int j = 0; j < m; ++j) h = (h ^ (unsigned)__ldg(pool + i * m + j)) * 0x9E3779B1u;
    return (int)__umulhi(h, (unsigned)b.split_n) == b.split_i;
}

// Does the query hold time constraints (a span or an order pair)?
__device__ __forceinline__ bool constrained(const Query& qc) { return qc.tt && (qc.span >= 0 || __ldg(qc.tt + 1)); }

// Under event time: the ts of the query edges of the prefix that candidate c at depth d (parent
// slot s on level d - 1) completes, read from the MVG at the work's timestamp (the seed's own
// pair, depths 0 and 1, from the seed: an inserted edge is not visible at its own timestamp);
// their smallest and largest (lo, hi; an edge without a ts counts in neither), and whether they
// keep the span and the order pairs that depth d completes (daemon/model/time_constraints.py).
__device__ bool in_time(const VersionedView& g, const Query& qc, const Level* lv, int d, int c, int s, i64* lo,
                        i64* hi) {
    const int* tt = qc.tt;
    int img[MAXQ];
    img[d] = c;
    for (int j = d - 1, slot = s; j >= 0; --j) {
        img[j] = lv[j].v[slot];
        slot = lv[j].parent[slot];
    }
    const int n = __ldg(tt + TT_EEND + d), no = __ldg(tt + 1);
    i64 ts[TMAXE];
    *lo = MVG_INF;
    *hi = MVG_NO_TS;
    for (int e = 0; e < n; ++e) {
        const int w = __ldg(tt + TT_EDGES + e), j = w & 0xff, k = (w >> 8) & 0xff;
        i64 t;
        if (j == 0 && k == 1) {
            t = (w >> 16) ? qc.t_back : qc.t_out;
        } else {
            const i64 pos = edge_at(g.m, img[j], img[k], qc.T, 0, false);
            t = pos < 0 ? MVG_NO_TS : MVG_ENTRY(((w >> 16) ? g.m.e_tsin : g.m.e_ts) + pos);
        }
        ts[e] = t;
        if (t != MVG_NO_TS) {
            *lo = min(*lo, t);
            *hi = max(*hi, t);
        }
    }
    // as unsigned: the difference of two int64 ts may not fit an int64
    if (qc.span >= 0 && *hi != MVG_NO_TS && (unsigned long long)(*hi - *lo) > (unsigned long long)qc.span)
        return false;
    for (int o = 0; o < no; ++o) {
        const int w = __ldg(tt + TT_ORDERS + o);
        if (((w >> 16) & 0xff) != d) continue;
        const i64 a = ts[w & 0xff], b = ts[(w >> 8) & 0xff];
        if (a != MVG_NO_TS && b != MVG_NO_TS && !(a < b)) return false;
    }
    return true;
}

// Make work q the warp's (copying its table) unless it already is.
__device__ __forceinline__ void switch_query(QueryTable* Q, WarpState* ws, const Batch& b, int q, int lane) {
    if (ws->q == q) return;
    __syncwarp();
    const int* tab = (const int*)(b.tabs + table_of(b, q));
    for (int i = lane; i < (int)(sizeof(QueryTable) / 4); i += 32) ((int*)Q)[i] = tab[i];
    __syncwarp();
    if (lane == 0) ws->q = q;
    __syncwarp();
}

// All checks of candidate c at depth d against its prefix (parent slot s on level d - 1),
// except its label, candidate bit and the pivot edge, which the caller checked.
template <class View>
__device__ bool check_path(const View& g, const Query& qc, const Level* lv, int d, int c, int s, int piv) {
    const QueryTable* Q = qc.t;
    const unsigned back = Q->back[d] & ~(1u << piv), same = Q->same[d], less = Q->less[d], greater = Q->greater[d];
    unsigned need = back | same | less | greater;
    int slot = s;
    for (int j = d - 1; j >= 0 && need; --j) {
        const unsigned bit = 1u << j;
        const int v = lv[j].v[slot];
        if (need & bit) {
            if ((same & bit) && v == c) return false;
            if ((less & bit) && !(v < c)) return false;
            if ((greater & bit) && !(v > c)) return false;
            if ((back & bit) && !g.edge(qc, v, c, g.check_el ? qc.el[d * MAXQ + j] : 0)) return false;
            need &= ~bit;
        }
        slot = lv[j].parent[slot];
    }
    return true;
}

// Candidate range for depth e = d + 1 of node c at depth d (parent slot s on level d - 1):
// the smallest label-grouped range among the backward neighbours of e. size 0 = dead node.
template <class View>
__device__ void node_range(const View& g, const Query& qc, const Level* lv, int d, int c, int s,
                           i64* start, int* size, int* piv) {
    const QueryTable* Q = qc.t;
    const int e = d + 1, lab = Q->label[e];
    unsigned need = Q->back[e];
    *size = 0x7fffffff;
    *start = 0;
    *piv = 0;
    int v = c, slot = s;
    for (int j = d; j >= 0 && need; --j) {
        if (j < d) {
            v = lv[j].v[slot];
            slot = lv[j].parent[slot];
        }
        const unsigned bit = 1u << j;
        if (!(need & bit)) continue;
        need &= ~bit;
        i64 st;
        int sz;
        g.range(qc, v, lab, &st, &sz);
        if (sz < *size) {
            *size = sz;
            *start = st;
            *piv = j;
            if (sz == 0) return;
        }
    }
}

// Take a chunk of 32 prefixes from the root pool (pool_m vertices each; -1 pads a query's
// last chunk); false when it is empty. The versioned search's pool is its seeds: chunk q
// (32 positions of pool_n) is seed q, its prefix (a, b) in lane 0; a search split over
// devices skips the seeds and roots that another device takes whole (below_seed).
template <class View>
__device__ bool take_roots(const View& g, QueryTable* Q, Level* lv, WarpState* ws, const Batch& b, u64* ctl,
                           const int* pool, i64 pool_n, int pool_m, int emit, int lane) {
    while (true) {
        u64 p = 0;
        if (lane == 0) p = vload(&ctl[CTL_POOL]) < (u64)pool_n ? atomicAdd(&ctl[CTL_POOL], 32ull) : (u64)pool_n;
        p = __shfl_sync(FULL_MASK, p, 0);
        if (p >= (u64)pool_n) return false;
        const int q = b.seeds ? (int)(p / 32) : __ldg(b.chunk_q + p / 32);
        switch_query(Q, ws, b, q, lane);
        const i64 i = (i64)p + lane;
        auto root = [&](int j) { return b.seeds ? (int)seed(b, SEED_A + j, q) : pool[i * pool_m + j]; };
        bool have = b.seeds ? lane == 0 : __ldg(pool + i * pool_m) >= 0;
        if (have && b.split_n > 1 && !below_seed(b, Q, emit) && !mine_whole(b, q, pool, i, pool_m)) have = false;
        int v = 0;
        if (have) {
            for (int j = 0; j < pool_m - 1; ++j) {
                lv[j].v[lane] = root(j);
                lv[j].parent[lane] = (unsigned char)lane;
            }
            v = root(pool_m - 1);
        }
        i64 start = 0;
        int size = 0, piv = 0;
        bool dealt = false;
        const Query qc = query_of(b, Q, ws->q);
        if constexpr (View::versioned) {
            i64 lo, hi;  // a seed's own constraints (an order between the two arcs of its pair)
            if (have && constrained(qc)) have = in_time(g, qc, lv, pool_m - 1, v, lane, &lo, &hi);
        }
        if (have) node_range(g, qc, lv, pool_m - 1, v, lane, &start, &size, &piv);
        if (have && size > 0) dealt = deal_at(g, b, Q, emit, pool_m, &start, &size);
        if (build_level(&lv[pool_m - 1], have && size > 0, v, lane, start, size, piv, dealt, lane)) {
            start_work(lv, ws, pool_m, lane);
            return true;
        }
    }
}

__device__ __forceinline__ i64 lower_bound(const int* __restrict__ a, i64 lo, i64 hi, int x) {
    while (lo < hi) {
        const i64 m = (lo + hi) >> 1;
        if (__ldg(a + m) < x) lo = m + 1; else hi = m;
    }
    return lo;
}

// Is entry p of a last-depth candidate range counted by the prefix sums? (as last_flags)
__device__ __forceinline__ bool counted(const StaticView& g, const Query& qc, int p, int d, int el) {
    return ((__ldg(qc.cbits + __ldg(g.gadj + p)) >> d) & 1u) && (!g.check_el || label_ok(__ldg(g.gadj_el + p), el));
}

// Matches of node s of level d - 1 when depth d is the last and has one backward edge:
// the counted entries of its range (prefix sums), narrowed to the ids that the symmetry
// constraints allow, minus the earlier same-label vertices inside it (injectivity).
__device__ i64 count_last(const StaticView& g, const Query& qc, const Level* lv, int d, int s, i64 cursor) {
    const QueryTable* Q = qc.t;
    const int* __restrict__ prefix = qc.prefix;
    const Level* L = &lv[d - 1];
    i64 st = L->start[s], en = st + L->size[s];
    const i64 used = cursor - L->off[s];
    if (used > 0) st += used;
    const unsigned less = Q->less[d], greater = Q->greater[d], same = Q->same[d];
    int lo = -1, hi = 0x7fffffff;  // lo < c < hi
    for (int j = d - 1, slot = s; j >= 0; slot = lv[j].parent[slot], --j) {
        const int v = lv[j].v[slot];
        if ((less >> j) & 1u) lo = max(lo, v);
        if ((greater >> j) & 1u) hi = min(hi, v);
    }
    if (lo >= 0) st = lower_bound(g.gadj, st, en, lo + 1);
    if (hi < 0x7fffffff) en = lower_bound(g.gadj, st, en, hi);
    if (st >= en) return 0;
    const int el = g.check_el ? qc.el[d * MAXQ + L->piv[s]] : 0;
    i64 n = __ldg(prefix + en) - __ldg(prefix + st);
    for (int j = d - 1, slot = s; j >= 0; slot = lv[j].parent[slot], --j) {
        const int v = lv[j].v[slot];
        if (((same >> j) & 1u) && v > lo && v < hi) {
            const i64 p = lower_bound(g.gadj, st, en, v);
            if (p < en && __ldg(g.gadj + p) == v && counted(g, qc, (int)p, d, el)) --n;
        }
    }
    return n;
}

// The image at depth p of node s of level top (p <= top).
__device__ __forceinline__ int image_at(const Level* lv, int top, int s, int p) {
    for (int j = top; j > p; --j) s = lv[j].parent[s];
    return lv[p].v[s];
}

// Is c none of the images of node s of level top at the depths of `same`?
__device__ __forceinline__ bool distinct_from(const Level* lv, int top, int s, unsigned same, int c) {
    for (int j = top, slot = s; j >= 0 && same; slot = lv[j].parent[slot], --j) {
        if (((same >> j) & 1u) && lv[j].v[slot] == c) return false;
        same &= ~(1u << j);
    }
    return true;
}

// One factor of count_suffix_at for every node of level top at once (lane s: node s): the
// entries of its range [st, st + len) visible at T with edge label el whose vertex is none of
// the node's images at the depths of `same` (injectivity; all of them <= top). A clean range
// (every entry visible, no edge label to test) counts whole, less the images found in it by
// binary search (its neighbours are distinct: a pair's older entry is closed, which makes the
// version unclean). The entries of the other ranges are one virtual list that the warp checks
// 32 at a time, each lane then taking the hits of its own range's part of the batch.
__device__ i64 range_count(const VersionedView& g, const Level* lv, int top, unsigned same, i64 T, i64 st,
                           int len, int el, bool clean, int lane) {
    i64 n = 0;
    if (clean) {
        n = len;
        for (int j = top, slot = lane; j >= 0; slot = lv[j].parent[slot], --j) {
            if (!((same >> j) & 1u)) continue;
            const int v = lv[j].v[slot];
            const i64 p = lower_bound(g.m.e_nbr, st, st + len, v);
            if (p < st + len && MVG_ENTRY(g.m.e_nbr + p) == v) --n;
        }
    }
    const int mine = clean ? 0 : len;
    i64 off = mine;  // exclusive offsets of the ranges left to check, lane by lane
    for (int o = 1; o < 32; o <<= 1) {
        const i64 y = __shfl_up_sync(FULL_MASK, off, o);
        if (lane >= o) off += y;
    }
    const i64 total = __shfl_sync(FULL_MASK, off, 31);
    off -= mine;
    for (i64 base = 0; base < total; base += 32) {
        const i64 idx = base + lane;
        int s = 0;  // the last node whose offset is <= idx: it has entries left (the ones after share its end)
        for (int step = 16; step > 0; step >>= 1)
            if (__shfl_sync(FULL_MASK, off, s + step) <= idx) s += step;
        const i64 pos = __shfl_sync(FULL_MASK, st, s) + idx - __shfl_sync(FULL_MASK, off, s);
        const int e = __shfl_sync(FULL_MASK, el, s);
        bool hit = false;
        if (idx < total) {
            const int c = MVG_ENTRY(g.m.e_nbr + pos);
            hit = visible(g.m, pos, T) && label_ok(MVG_ENTRY(g.m.e_el + pos), e) && distinct_from(lv, top, s, same, c);
        }
        const unsigned hits = __ballot_sync(FULL_MASK, hit);
        const i64 lo = min(max(off - base, 0ll), 32ll), hi = min(max(off + mine - base, 0ll), 32ll);
        n += __popcll((unsigned long long)hits & (((1ull << hi) - 1) & ~((1ull << lo) - 1)));
    }
    return n;
}

// The matches of the whole level d0 - 1 at once (lane s: node s), counting only, when the
// depths d0 .. n - 1 are independent given the prefix (the table's `fast` = n - d0): each has
// one backward edge, to a depth under d0, no symmetry constraint, and no same-label depth
// among them (executor.py _fast). A node's matches are then the product of its numbers of
// candidates at those depths (range_count): the leaves of a tree query are counted, not
// enumerated, and a leaf without candidates ends its prefix at once. Depth d0's range is the
// node's own (what is left of it after the cursor); the others are label ranges of the
// images of their backward neighbours. Returns each lane's part.
__device__ i64 count_suffix_at(const VersionedView& g, const Query& qc, const Level* lv, int d0, i64 cursor,
                               int lane) {
    const QueryTable* Q = qc.t;
    const int top = d0 - 1;
    const Level* L = &lv[top];
    i64 prod = lane < L->cnt ? 1 : 0;
    for (int e = d0; e < Q->n; ++e) {
        if (!__any_sync(FULL_MASK, prod != 0)) return 0;
        i64 st = 0;
        int len = 0, p = 0, v = 0;
        if (prod) {
            if (e == d0) {
                const i64 used = max(cursor - L->off[lane], 0ll);
                len = (int)max((i64)L->size[lane] - used, 0ll);
                st = L->start[lane] + used;
                p = L->piv[lane];
                v = image_at(lv, top, lane, p);
            } else {
                p = __ffs(Q->back[e]) - 1;
                v = image_at(lv, top, lane, p);
                label_range_at(g.m, v, Q->label[e], qc.T, &st, &len);
            }
        }
        const int el = qc.el[e * MAXQ + p];
        const bool clean = len > 0 && g.plain && el == 0 && clean_at(g.m, version_at(g.m, v, qc.T), qc.T);
        prod *= range_count(g, lv, top, Q->same[e], qc.T, st, len, el, clean, lane);
    }
    return prod;
}

// Flags of the prefix sums of count_last, one row of m2 per query of the list `which`
// (blockIdx.y): entry p of the label-grouped adjacency is a candidate of the query's last
// depth bit[i] reached over an edge labelled el[i].
extern "C" __global__ void last_flags(i64 n, i64 m2, const int* gadj, const int* gadj_el, int check_el,
                                      const int* which, const int* el, const int* bit, const unsigned* cbits,
                                      int* flags) {
    const int i = blockIdx.y, b = bit[i], e = el[i];
    const unsigned* cb = cbits + (i64)which[i] * n;
    int* f = flags + (i64)i * m2;
    for (i64 p = blockIdx.x * (i64)blockDim.x + threadIdx.x; p < m2; p += (i64)gridDim.x * blockDim.x)
        f[p] = ((cb[gadj[p]] >> b) & 1u) && (!check_el || label_ok(gadj_el[p], e));
}

// Reserve k output rows (lane 0). Returns rows granted (<= k; fewer only at the limit), or
// -1 when the buffer is full (nothing granted: the batch is redone after the drain).
__device__ int reserve_rows(u64* ctl, int k, i64 out_cap, i64 limit_left, u64* first) {
    u64 old = vload(&ctl[CTL_OUTN]);
    while (true) {
        if ((i64)old >= limit_left) {
            atomicMax(&ctl[CTL_STOP], (u64)STOP_LIMIT);
            return 0;
        }
        i64 take = k;
        const bool at_limit = (i64)old + k > limit_left;
        if (at_limit) take = limit_left - (i64)old;
        if ((i64)old + take > out_cap) {
            atomicMax(&ctl[CTL_STOP], (u64)STOP_FULL);
            return -1;
        }
        u64 prev = atomicCAS(&ctl[CTL_OUTN], old, old + (u64)take);
        if (prev == old) {
            if (at_limit) atomicMax(&ctl[CTL_STOP], (u64)STOP_LIMIT);
            *first = old;
            return (int)take;
        }
        old = prev;
    }
}

// Flush the warp's count into its query's total (when its work ends, and at exit).
__device__ __forceinline__ void flush_count(WarpState* ws, u64* counts, int lane) {
    if (lane == 0 && ws->count) {
        atomicAdd(&counts[ws->q], ws->count);
        ws->count = 0;
    }
    __syncwarp();
}

// What one launch does besides the graph and the queries: the root pool, the task queue,
// the saved warp stacks, counts (per work id) and the output buffer.
struct Run {
    int nmax;
    const int* __restrict__ pool;
    i64 pool_n;
    int pool_m;
    u64* ctl;
    Task* queue;
    int* ready;
    i64 queue_cap;
    u64* state;
    u64* counts;
    int resume, emit;
    int* out;
    i64 out_cap, limit_left;
    u64 count_limit;
    i64 budget_ns, offload_ns;
};

// The search body of both kernels below (one per graph view).
template <class View>
__device__ __forceinline__ void search(const View& g, const Batch& b, const Run& r) {
    const int nmax = r.nmax, pool_m = r.pool_m, resume = r.resume, emit = r.emit;
    const int* __restrict__ pool = r.pool;
    const i64 pool_n = r.pool_n, queue_cap = r.queue_cap, out_cap = r.out_cap, limit_left = r.limit_left;
    const i64 budget_ns = r.budget_ns, offload_ns = r.offload_ns;
    const u64 count_limit = r.count_limit;
    u64 *ctl = r.ctl, *state = r.state, *counts = r.counts;
    Task* queue = r.queue;
    int *ready = r.ready, *out = r.out;
    extern __shared__ __align__(16) unsigned char smem[];
    const int lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
    const int nwarp_block = blockDim.x >> 5;
    const i64 gw = (i64)blockIdx.x * nwarp_block + wib;
    // per warp: its query's table, its state, then the levels of the deepest query
    const int wwords = (int)((sizeof(QueryTable) + sizeof(WarpState) + (nmax - 1) * sizeof(Level)) / 8);
    QueryTable* Q = (QueryTable*)(smem + (size_t)wib * wwords * 8);
    WarpState* ws = (WarpState*)(Q + 1);
    Level* lv = (Level*)(ws + 1);
    u64* saved = state + gw * wwords;
    if (resume) {
        for (int i = lane; i < wwords; i += 32) ((u64*)Q)[i] = saved[i];
    } else if (lane == 0) {
        ws->active = 0;
        ws->q = -1;
        ws->count = 0;
        ws->batches = 0;
    }
    if (lane == 0) atomicAdd(&ctl[CTL_STARTED], 1ull);
    __syncwarp();
    const i64 deadline = budget_ns > 0 ? now_ns() + budget_ns : 0x7fffffffffffffffll;
    unsigned iter = 0;
    bool idle_counted = false;

    while (true) {
        if (!ws->active) {
            if (take_roots(g, Q, lv, ws, b, ctl, pool, pool_n, pool_m, emit, lane)) continue;
            if (!idle_counted) {
                if (lane == 0) atomicAdd(&ctl[CTL_IDLE], 1ull);
                idle_counted = true;
            }
            int verdict = 0;  // 0 keep waiting, 1 got work, 2 finished
            while (!verdict) {
                if (take_group(lv, ws, ctl, queue, ready, queue_cap, lane, [&](int q) { switch_query(Q, ws, b, q, lane); })) {
                    verdict = 1;
                    break;
                }
                if (lane == 0) {
                    if (vload(&ctl[CTL_STOP]) || now_ns() > deadline) verdict = 2;
                    else if (vload(&ctl[CTL_HEAD]) >= vload(&ctl[CTL_TAIL]) &&
                             vload(&ctl[CTL_IDLE]) == vload(&ctl[CTL_STARTED])) verdict = 2;
                    else __nanosleep(2000);
                }
                verdict = __shfl_sync(FULL_MASK, verdict, 0);
            }
            __syncwarp();
            if (verdict == 2) break;
            idle_counted = false;  // take_group left the idle count
            continue;
        }
        if ((++iter & 7) == 0) {
            int act = 0;  // 1 stop, 2 offload
            if (lane == 0) {
                const i64 t = now_ns();
                if (t > deadline) atomicMax(&ctl[CTL_STOP], (u64)STOP_TIME);
                if (vload(&ctl[CTL_STOP])) act = 1;
                else if (offload_ns > 0 && t - ws->t_start > (View::versioned ? offload_ns / 4 : offload_ns)) {
                    // only while idle warps outnumber the queued groups (about 32 tasks each); on the
                    // MVG already after a quarter of offload_ns while three quarters of the warps are
                    // idle (a launch of few seeds, or its last long ones)
                    const u64 idle = vload(&ctl[CTL_IDLE]);
                    const bool due = t - ws->t_start > offload_ns || 4 * idle >= 3 * vload(&ctl[CTL_STARTED]);
                    if (due && idle > 0 && vload(&ctl[CTL_TAIL]) - vload(&ctl[CTL_HEAD]) < 32 * idle) act = 2;
                }
            }
            act = __shfl_sync(FULL_MASK, act, 0);
            if (act == 1) break;
            if (act == 2) {
                offload(lv, ws, ctl, queue, ready, queue_cap, lane);
                continue;
            }
        }
        const Query qc = query_of(b, Q, ws->q);
        const int last = Q->n - 1;
        const int top = ws->top;
        Level* L = &lv[top];
        const i64 cursor = L->cursor, total = L->total;
        if (cursor >= total) {
            __syncwarp();
            const bool done = top == ws->base;
            if (lane == 0) {
                if (done) ws->active = 0;
                else ws->top = top - 1;
            }
            __syncwarp();
            if (done) flush_count(ws, counts, lane);
            continue;
        }
        if (lane == 0) ws->batches++;
        const int d = top + 1;
        // count the whole level at once (counting only): the last depth (static), the last `fast` (MVG)
        if (Q->fast && d == (View::versioned ? Q->n - Q->fast : last) && !emit) {
            i64 part;
            if constexpr (View::versioned) part = count_suffix_at(g, qc, lv, d, cursor, lane);
            else part = lane < L->cnt ? count_last(g, qc, lv, d, lane, cursor) : 0;
            for (int o = 16; o > 0; o >>= 1) part += __shfl_down_sync(FULL_MASK, part, o);
            if (lane == 0) {
                if (count_limit) {
                    const u64 old = atomicAdd(&ctl[CTL_GCOUNT], (u64)part);
                    if (old + part >= count_limit) atomicMax(&ctl[CTL_STOP], (u64)STOP_LIMIT);
                } else {
                    ws->count += part;
                }
                L->cursor = total;
            }
            __syncwarp();
            continue;
        }
        const i64 idx = cursor + lane;
        bool pass = false;
        int c = 0, s = 0, piv = 0;
        if (idx < total) {
            s = find_node(L, idx);
            piv = L->piv[s];
            const i64 pos = L->start[s] + (idx - L->off[s]);
            pass = g.candidate(qc, pos, d, g.check_el ? qc.el[d * MAXQ + piv] : 0, &c);
            if (pass) pass = check_path(g, qc, lv, d, c, s, piv);
        }
        i64 tlo = 0, thi = 0;  // under event time: the match's smallest and largest ts (emitted rows)
        if constexpr (View::versioned) {
            if (pass && qc.tt && (constrained(qc) || (d == last && emit))) pass = in_time(g, qc, lv, d, c, s, &tlo, &thi);
        }
        if (d == last) {
            const unsigned bal = __ballot_sync(FULL_MASK, pass);
            const int k = __popc(bal);
            if (emit && k) {
                int take = 0;
                u64 first = 0;
                if (lane == 0) take = reserve_rows(ctl, k, out_cap, limit_left, &first);
                take = __shfl_sync(FULL_MASK, take, 0);
                if (take < 0) break;  // buffer full: this batch is redone after the drain
                first = __shfl_sync(FULL_MASK, first, 0);
                const int r = __popc(bal & ((1u << lane) - 1));
                if (pass && r < take) {
                    int* row = out + (i64)(first + r) * Q->width;
                    row[Q->outpos[d]] = c;
                    int slot = s;
                    for (int j = d - 1; j >= 0; --j) {
                        row[Q->outpos[j]] = lv[j].v[slot];
                        slot = lv[j].parent[slot];
                    }
                    if constexpr (View::versioned) {
                        row[Q->width - 1] = ws->q;  // the seed of the row
                        if (qc.tt) {  // before it, the match's ts: lo then hi, each as (low, high) words
                            if (thi == MVG_NO_TS) tlo = MVG_NO_TS;
                            row[Q->width - 5] = (int)(tlo & 0xffffffffLL);
                            row[Q->width - 4] = (int)((unsigned long long)tlo >> 32);
                            row[Q->width - 3] = (int)(thi & 0xffffffffLL);
                            row[Q->width - 2] = (int)((unsigned long long)thi >> 32);
                        }
                    }
                }
                if (lane == 0) ws->count += take;
                if (take < k) break;  // limit reached
            } else if (count_limit && k) {
                if (lane == 0) {
                    const u64 old = atomicAdd(&ctl[CTL_GCOUNT], (u64)k);
                    if (old + k >= count_limit) atomicMax(&ctl[CTL_STOP], (u64)STOP_LIMIT);
                }
            } else if (lane == 0) {
                ws->count += k;
            }
            __syncwarp();
            if (lane == 0) L->cursor = cursor + 32;
        } else {
            i64 start = 0;
            int size = 0, npiv = 0;
            if (pass) {
                node_range(g, qc, lv, d, c, s, &start, &size, &npiv);
                pass = size > 0;
            }
            bool dealt = (L->dealt >> s) & 1u;
            if (pass && !dealt) {
                dealt = deal_at(g, b, Q, emit, d + 1, &start, &size);
                pass = size > 0;
            }
            const int k = build_level(&lv[d], pass, c, s, start, size, npiv, dealt, lane);
            __syncwarp();
            if (lane == 0) {
                L->cursor = cursor + 32;
                if (k) ws->top = d;
            }
        }
        __syncwarp();
    }
    __syncwarp();
    if (ws->q >= 0) flush_count(ws, counts, lane);
    for (int i = lane; i < wwords; i += 32) saved[i] = ((u64*)Q)[i];
}

extern "C" __global__ void match(const i64* indptr, const int* adj, const int* adj_el, const int* gadj,
                                 const int* gadj_el, const int* vlabel, const int* hub_of, const int* hub_tab,
                                 int num_labels, int single_label, i64 n, int check_el, int nmax,
                                 const QueryTable* __restrict__ qtabs, const unsigned* cbits, const int* qel,
                                 const int* last_prefix, const i64* prefix_at, const int* __restrict__ pool,
                                 const int* __restrict__ chunk_q, i64 pool_n, int pool_m, u64* ctl, Task* queue,
                                 int* ready, i64 queue_cap, u64* state, u64* counts, int resume, int emit, int* out,
                                 i64 out_cap, i64 limit_left, u64 count_limit, i64 budget_ns, i64 offload_ns,
                                 int split_n, int split_i, int split_range) {
    const StaticView g{indptr, adj, adj_el, gadj, gadj_el, vlabel, {hub_of, hub_tab, num_labels, single_label},
                       check_el};
    const Batch b{qtabs, cbits, qel, last_prefix, prefix_at, chunk_q, nullptr, n, 0, nullptr, nullptr, split_n, split_i,
                  split_range};
    search(g, b, Run{nmax, pool, pool_n, pool_m, ctl, queue, ready, queue_cap, state, counts, resume, emit, out,
                     out_cap, limit_left, count_limit, budget_ns, offload_ns});
}

// Incremental matching on the MVG: work id i is seed i, the column i of the rows a, b, T,
// table of `seeds` (its prefix (a, b), timestamp and table); counts[i] its matches. Emitted
// rows end with the seed (column width - 1 of every table), under event time after the match's
// smallest and largest ts (4 columns before it). A table's `fast` (count-only searches) is the
// number of last depths count_suffix_at counts at once, plain says that no edge has a label;
// tt and tspan (null: no event time) the tables' time words and spans; split_n > 1: the part
// split_i of a search split over split_n devices, which deals out each prefix's range for the last
// depth it enumerates, or an earlier one of split_range entries or more (deal_at).
extern "C" __global__ void match_at(MVGView mvg, int plain, int nmax, const QueryTable* __restrict__ qtabs,
                                    const int* qel, const i64* seeds, i64 n_seeds, u64* ctl, Task* queue, int* ready,
                                    i64 queue_cap, u64* state, u64* counts, int resume, int emit, int* out,
                                    i64 out_cap, i64 budget_ns, i64 offload_ns, const int* tt, const i64* tspan,
                                    int split_n, int split_i, int split_range) {
    const VersionedView g{mvg, plain};
    const Batch b{qtabs, nullptr, qel, nullptr, nullptr, nullptr, seeds, 0, n_seeds, tt, tspan, split_n, split_i,
                  split_range};
    search(g, b, Run{nmax, nullptr, 32 * n_seeds, 2, ctl, queue, ready, queue_cap, state, counts, resume, emit, out,
                     out_cap, (i64)1 << 62, 0, budget_ns, offload_ns});
}

// The struct sizes and field offsets the driver needs, in the order gpu/layout.py names them
// (NVRTC has no offsetof).
#define OFFSET(T, f) ((i64)((const char*)&((const T*)0)->f - (const char*)0))
extern "C" __global__ void layout(i64* out) {
    const i64 v[] = {sizeof(QueryTable), OFFSET(QueryTable, outpos), OFFSET(QueryTable, label), OFFSET(QueryTable, back),
                     OFFSET(QueryTable, same), OFFSET(QueryTable, less), OFFSET(QueryTable, greater), sizeof(Level),
                     sizeof(WarpState), OFFSET(WarpState, active), OFFSET(WarpState, batches), sizeof(Task),
                     OFFSET(Task, q)};
    for (int i = 0; i < (int)(sizeof(v) / sizeof(v[0])); ++i) out[i] = v[i];
}
