// Approximate counting: WanderJoin and Alley walks on the candidate graph, one sample per thread.
//
// Without inheritance, the walks, the pivot choice (the shortest local list, the first on
// ties), the picks and the random numbers are those of the numpy sampler
// (daemon/cpu/sampler.py) bit for bit:
// depth i of lane l of a round reads uniform number i * lanes + l of numpy's Philox4x64-10
// stream keyed by the seed with counter (0, 0, round, 0). A thread computes that number
// from its index alone (a counter-based RNG needs no state), so a round's weights depend
// on (seed, round) only and equal the CPU sampler's: the CPU sampler is the GPU's
// reference, sample by sample.
//
// Candidate graph (daemon/model/estimate.py's CandidateGraph, built by candidate_lists below or
// uploaded): rows[j * n + v] is v's row in the candidates of depth j; backward edge e's rows are
// indptr rows ipbase[e] .. ipbase[e + 1] - 1 (one indptr for all edges), and the local list of
// row r is local[indptr[r] .. indptr[r + 1]), sorted by vertex id.
//
// Warp streaming: an Alley refine set of at least P.stream entries is scanned by the whole warp,
// 32 entries a step, and one member is chosen by weighted reservoir sampling over the steps
// (stream_pick). Its random numbers come from Philox counters numpy's stream never reaches
// (second word non-zero), so the walk is still a function of (seed, round, lane).
#include "layout.cuh"

// ---- Philox4x64-10, as numpy (and Random123) compute it ----
// one block of Philox4x64-10 (Random123's, as numpy computes it), as a uniform double from word w
__device__ __forceinline__ double philox(u64 k0, u64 k1, u64 c0, u64 c1, u64 c2, u64 c3, unsigned w) {
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r) {
            k0 += 0x9E3779B97F4A7C15ull;
            k1 += 0xBB67AE8584CAA73Bull;
        }
        const u64 lo0 = 0xD2E7470EE14C6C93ull * c0, hi0 = __umul64hi(0xD2E7470EE14C6C93ull, c0);
        const u64 lo1 = 0xCA5A826395121157ull * c2, hi1 = __umul64hi(0xCA5A826395121157ull, c2);
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
    }
    const u64 out = w == 0 ? c0 : w == 1 ? c1 : w == 2 ? c2 : c3;
    return (double)(out >> 11) * (1.0 / 9007199254740992.0);  // numpy's next_double
}

// uniform number `index` of numpy's stream for round rnd: numpy advances the counter before each
// block of 4 outputs, so block b has counter (b + 1, 0, rnd, 0)
__device__ __forceinline__ double philox_uniform(u64 k0, u64 k1, u64 rnd, u64 index) {
    return philox(k0, k1, (index >> 2) + 1, 0, rnd, 0, (unsigned)(index & 3));
}

// floor(r * size), kept below size where rounding would reach it (sampler.py's _pick)
__device__ __forceinline__ i64 pick(double r, i64 size) {
    const i64 k = (i64)(r * (double)size);
    return k < size - 1 ? k : size - 1;
}

struct Cand {
    const int* __restrict__ rows;
    i64 n;
    const i64* __restrict__ ipbase;
    const i64* __restrict__ indptr;
    const int* __restrict__ local;

    // the local list of edge e at image v of its earlier depth j
    __device__ __forceinline__ void list(int e, int j, int v, i64* start, i64* size) const {
        const i64 at = __ldg(ipbase + e) + __ldg(rows + j * n + v);
        *start = __ldg(indptr + at);
        *size = __ldg(indptr + at + 1) - *start;
    }

    __device__ __forceinline__ bool contains(i64 start, i64 size, int x) const {
        i64 lo = start, hi = start + size;
        while (lo < hi) {
            const i64 m = (lo + hi) >> 1;
            if (__ldg(local + m) < x) lo = m + 1; else hi = m;
        }
        return lo < start + size && __ldg(local + lo) == x;
    }
};

// Whether x may be depth i's image: in every backward list but the pivot's (the pivot's
// list holds it), and not the image of an earlier same-label depth.
__device__ __forceinline__ bool fits(const SamplePlan& P, const Cand& cg, const int* M, int i, int piv, int x) {
    for (unsigned s = P.same[i]; s; s &= s - 1)
        if (M[__ffs(s) - 1] == x) return false;
    for (int e = P.ebeg[i]; e < P.ebeg[i + 1]; ++e) {
        if (e == piv) continue;
        i64 start, size;
        cg.list(e, P.ej[e], M[P.ej[e]], &start, &size);
        if (!cg.contains(start, size, x)) return false;
    }
    return true;
}

struct Pivot {
    int e;  // the backward edge with the shortest local list (the first on ties), as the numpy sampler
    i64 start, size;
};

__device__ __forceinline__ Pivot pivot(const SamplePlan& P, const Cand& cg, const int* M, int i) {
    Pivot p{-1, 0, 0};
    for (int e = P.ebeg[i]; e < P.ebeg[i + 1]; ++e) {
        i64 s, z;
        cg.list(e, P.ej[e], M[P.ej[e]], &s, &z);
        if (p.e < 0 || z < p.size) p = Pivot{e, s, z};
    }
    return p;
}

// WanderJoin's depth i with uniform r: pick from the pivot's list, then check the other edges (a
// failed check kills the walk). Sets M[i], multiplies w by the list's size; false when the walk failed.
__device__ __forceinline__ bool wj_step(const SamplePlan& P, const Cand& cg, int* M, int i, const Pivot& p,
                                        double r, double* w) {
    if (p.size == 0) return false;
    *w *= (double)p.size;
    M[i] = __ldg(cg.local + p.start + pick(r, p.size));
    return fits(P, cg, M, i, p.e, M[i]);
}

// Alley's depth i by one lane: the intersection of all lists, less the used vertices: count it,
// then take its k-th member
__device__ __forceinline__ bool alley_step(const SamplePlan& P, const Cand& cg, int* M, int i, const Pivot& p,
                                           double r, double* w) {
    i64 count = 0;
    for (i64 t = p.start; t < p.start + p.size; ++t) count += fits(P, cg, M, i, p.e, __ldg(cg.local + t));
    if (count == 0) return false;
    *w *= (double)count;
    i64 k = pick(r, count);
    for (i64 t = p.start;; ++t) {
        const int x = __ldg(cg.local + t);
        if (fits(P, cg, M, i, p.e, x) && k-- == 0) {
            M[i] = x;
            return true;
        }
    }
}

// Warp streaming, called by all 32 lanes together: lane src's Alley refine set at depth i, scanned
// 32 entries a step. Step s has c_s members among its entries; with T the members seen so far
// (this step's included), the step replaces the pick with one of its own members with probability
// c_s / T, each equally likely: one uniform u does both (u * T < c_s, then member floor(u * T)).
// A member of step s ends up chosen with probability (1 / T_s) * prod_{s' > s} (1 - c_s' / T_s')
// = 1 / T_final: uniform, as one lane's count-then-pick, in one pass. Returns the member count,
// the pick in *chosen (meaningful when the count is > 0). idx numbers the walk's depth
// (i * lanes + lane) for the random numbers.
__device__ i64 stream_pick(const SamplePlan& P, const Cand& cg, const int* M, int i, const Pivot& mine, int src,
                           u64 k0, u64 k1, u64 rnd, u64 idx, int* chosen) {
    int W[MAXQ];  // src's prefix, which fits() reads
    for (int j = 0; j < i; ++j) W[j] = __shfl_sync(FULL_MASK, M[j], src);
    const int e = __shfl_sync(FULL_MASK, mine.e, src);
    const i64 start = __shfl_sync(FULL_MASK, mine.start, src), size = __shfl_sync(FULL_MASK, mine.size, src);
    idx = __shfl_sync(FULL_MASK, idx, src);
    const unsigned lane = threadIdx.x & 31;
    i64 total = 0;
    for (i64 t = 0; t < size; t += 32) {
        const bool in = t + lane < size;
        const int x = in ? __ldg(cg.local + start + t + lane) : 0;
        unsigned b = __ballot_sync(FULL_MASK, in && fits(P, cg, W, i, e, x));
        if (!b) continue;
        const int c = __popc(b);
        total += c;
        const double u = philox(k0, k1, idx, (u64)(t >> 5) + 1, rnd, 0, 0);
        i64 k = (i64)(u * (double)total);
        if (k < c) {
            for (; k; --k) b &= b - 1;
            *chosen = __shfl_sync(FULL_MASK, x, __ffs(b) - 1);
        }
    }
    return total;
}

// Depth i of one living walk with uniform r
__device__ __forceinline__ bool lane_step(const SamplePlan& P, const Cand& cg, int* M, int i, double r, double* w) {
    const Pivot p = pivot(P, cg, M, i);
    return P.method == METHOD_WJ ? wj_step(P, cg, M, i, p, r, w) : alley_step(P, cg, M, i, p, r, w);
}

// Alley's depth i of every lane of the warp (called by all 32 together), uniform r for this lane's
// walk; the refine sets of at least P.stream entries streamed by the warp, one walk at a time.
__device__ __forceinline__ bool streamed_step(const SamplePlan& P, const Cand& cg, int* M, int i, bool alive,
                                              double r, double* w, u64 k0, u64 k1, u64 rnd, u64 idx) {
    Pivot p{-1, 0, 0};
    if (alive) p = pivot(P, cg, M, i);
    const bool big = alive && P.stream && p.size >= P.stream;
    i64 count = 0;
    int x = 0;
    for (unsigned b = __ballot_sync(FULL_MASK, big); b; b &= b - 1) {
        const int src = __ffs(b) - 1;
        int got = 0;
        const i64 c = stream_pick(P, cg, M, i, p, src, k0, k1, rnd, idx, &got);
        if ((int)(threadIdx.x & 31) == src) count = c, x = got;
    }
    if (!alive) return false;
    if (!big) return alley_step(P, cg, M, i, p, r, w);
    if (count == 0) return false;
    *w *= (double)count;
    M[i] = x;
    return true;
}

// Trawling: the number of ways to extend the sampled prefix M[0 .. P.walk - 1] to every depth,
// by a depth-first search over the refine sets. Exact: a depth's refine set holds every candidate
// adjacent to the placed images over the query's edges, and filtering never drops a true match.
__device__ double completions(const SamplePlan& P, const Cand& cg, int* M) {
    i64 at[MAXQ], end[MAXQ];
    int piv[MAXQ];
    double total = 0;
    int d = P.walk;
    for (bool down = true;;) {
        if (down) {
            const Pivot p = pivot(P, cg, M, d);
            at[d] = p.start, end[d] = p.start + p.size, piv[d] = p.e;
            down = false;
        }
        if (at[d] == end[d]) {
            if (d-- == P.walk) return total;
            continue;
        }
        const int x = __ldg(cg.local + at[d]++);
        if (!fits(P, cg, M, d, piv[d], x)) continue;
        if (d + 1 == P.depth) {
            total += 1.0;
        } else {
            M[d++] = x;
            down = true;
        }
    }
}

// Sample inheritance (gSWORD): after depth i, each lane of the warp whose walk died takes over
// a living lane's prefix M[0..i], dead lanes of rank k, k + nl, k + 2 nl, ... the living lane
// of rank k; the c lanes that then share a prefix carry its weight / c each and continue
// independently (their own random numbers). The expected sum of their final weights is the
// prefix's weight times its expected completion factor, as without inheritance, so the warp's
// sum stays unbiased; its lanes are no longer independent, the warps are (blocks of the
// statistics are whole warps).
__device__ __forceinline__ void inherit(int* M, int i, double* w, bool* alive, bool real) {
    const unsigned live = __ballot_sync(FULL_MASK, *alive), dead = __ballot_sync(FULL_MASK, real && !*alive);
    if (!live || !dead) return;
    const unsigned me = threadIdx.x & 31, below = (1u << me) - 1;
    const int nl = __popc(live), nd = __popc(dead);
    int src = me;
    if (dead >> me & 1) {
        unsigned m = live;
        for (int k = __popc(dead & below) % nl; k; --k) m &= m - 1;
        src = __ffs(m) - 1;
    } else if (*alive) {
        const int k = __popc(live & below);
        *w /= (double)(1 + nd / nl + (k < nd % nl));
    }
    for (int j = 0; j <= i; ++j) M[j] = __shfl_sync(FULL_MASK, M[j], src);
    *w = __shfl_sync(FULL_MASK, *w, src);
    *alive = *alive || (dead >> me & 1);
}

// weights[l] = the Horvitz-Thompson weight of sample l of round `rnd` (0: the walk failed),
// for l < lanes; with trawling, times the number of completions of its prefix. plan is a
// SamplePlan in global memory, copied to shared memory per block. A warp walks 32 consecutive
// lanes together (all in step, for inheritance and streaming). Three instances (kernels below):
// the features a launch does not use cost registers, so occupancy, when compiled in.
template <bool STREAM, bool TRAWL>
__device__ __forceinline__ void sample_all(const int* __restrict__ plan, const int* __restrict__ first,
                                           const int* __restrict__ rows, i64 n, const i64* __restrict__ ipbase,
                                           const i64* __restrict__ indptr, const int* __restrict__ local, u64 k0,
                                           u64 k1, u64 rnd, i64 lanes, double* __restrict__ weights) {
    __shared__ SamplePlan P;
    for (int t = threadIdx.x; t < (int)(sizeof(SamplePlan) / 4); t += blockDim.x) ((int*)&P)[t] = plan[t];
    __syncthreads();
    const Cand cg{rows, n, ipbase, indptr, local};
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 base = blockIdx.x * (i64)blockDim.x + (threadIdx.x & ~31); base < lanes; base += stride) {
        const i64 l = base + (threadIdx.x & 31);
        const bool real = l < lanes;
        int M[MAXQ];
        double w = P.nfirst;
        bool alive = real;
        if (real) M[0] = __ldg(first + pick(philox_uniform(k0, k1, rnd, l), P.nfirst));
        for (int i = 1; i < P.walk && __any_sync(FULL_MASK, alive); ++i) {
            const u64 idx = (u64)i * lanes + l;
            if (STREAM && P.method == METHOD_ALLEY)
                alive = streamed_step(P, cg, M, i, alive, real ? philox_uniform(k0, k1, rnd, idx) : 0.0, &w, k0, k1,
                                      rnd, idx);
            else if (alive)
                alive = lane_step(P, cg, M, i, philox_uniform(k0, k1, rnd, idx), &w);
            if (P.inherit && i + 1 < P.walk) inherit(M, i, &w, &alive, real);
        }
        if (TRAWL && alive && P.walk < P.depth) w *= completions(P, cg, M);
        if (real) weights[l] = alive ? w : 0.0;
    }
}

#define SAMPLE_KERNEL(name, STREAM, TRAWL, BLOCKS)                                                              \
    extern "C" __global__ void __launch_bounds__(256, BLOCKS)                                                  \
        name(const int* __restrict__ plan, const int* __restrict__ first, const int* __restrict__ rows, i64 n,  \
             const i64* __restrict__ ipbase, const i64* __restrict__ indptr, const int* __restrict__ local,    \
             u64 k0, u64 k1, u64 rnd, i64 lanes, double* __restrict__ weights) {                               \
        sample_all<STREAM, TRAWL>(plan, first, rows, n, ipbase, indptr, local, k0, k1, rnd, lanes, weights);   \
    }
// BLOCKS: blocks an SM must hold at once, so at most 65536 / (256 * BLOCKS) registers a thread
// (plain walks at 8 blocks, 32 registers, gain more by occupancy than they lose by spills)
SAMPLE_KERNEL(sample, false, false, 8)        // WanderJoin, and Alley without streaming
SAMPLE_KERNEL(sample_stream, true, false, 5)  // Alley with warp streaming
SAMPLE_KERNEL(sample_trawl, true, true, 4)    // trawling (streaming as P.stream says)

// The candidate graph on the device, in two passes over its R rows (one warp a row): pass 0 writes
// row r's list length to indptr[r + 1], the caller scans indptr, pass 1 writes the lists. Row r
// belongs to backward edge e (ebase[e] <= r < ebase[e + 1], edge e from depth ei[e] back to depth
// ej[e] with edge label eel[e]) and stands for candidate verts[vbase[ej[e]] + r - ebase[e]] of
// depth ej[e] (flat indices j * n + v, ascending in v); its list holds v's neighbours x that are
// candidates of depth ei[e] (rows[ei[e] * n + x] >= 0) over an edge labelled eel[e]. The graph's
// neighbours are sorted by id and a warp keeps their order, so each list comes out sorted.
extern "C" __global__ void candidate_lists(i64 R, int E, const i64* __restrict__ ebase, const int* __restrict__ ei,
                                           const int* __restrict__ ej, const int* __restrict__ eel,
                                           const i64* __restrict__ vbase, const i64* __restrict__ verts,
                                           const int* __restrict__ rows, i64 n, const i64* __restrict__ gptr,
                                           const int* __restrict__ adj, const int* __restrict__ adj_el, int has_el,
                                           int fill, i64* __restrict__ indptr, int* __restrict__ local) {
    const unsigned lane = threadIdx.x & 31;
    const i64 warps = (i64)gridDim.x * blockDim.x / 32;
    for (i64 r = (blockIdx.x * (i64)blockDim.x + threadIdx.x) / 32; r < R; r += warps) {
        int e = 0;  // the last edge with ebase[e] <= r (edges without rows are skipped over)
        for (int hi = E; hi - e > 1;) {
            const int m = (e + hi) / 2;
            if (ebase[m] <= r) e = m; else hi = m;
        }
        const i64 v = verts[vbase[ej[e]] + r - ebase[e]] - (i64)ej[e] * n;
        const int* cand = rows + (i64)ei[e] * n;
        i64 at = fill ? indptr[r] : 0;
        for (i64 t = gptr[v]; t < gptr[v + 1]; t += 32) {
            const i64 k = t + lane;
            const int x = k < gptr[v + 1] ? adj[k] : 0;
            const bool ok = k < gptr[v + 1] && cand[x] >= 0 && (has_el ? adj_el[k] : 0) == eel[e];
            const unsigned b = __ballot_sync(FULL_MASK, ok);
            if (fill && ok) local[at + __popc(b & ((1u << lane) - 1))] = x;
            at += __popc(b);
        }
        if (!fill && lane == 0) indptr[r + 1] = at;
    }
}

// The SamplePlan's size and field offsets, in the order gpu/sampler.py names them (NVRTC has no offsetof).
#define OFFSET(T, f) ((i64)((const char*)&((const T*)0)->f - (const char*)0))
extern "C" __global__ void layout(i64* out) {
    const i64 v[] = {sizeof(SamplePlan),         OFFSET(SamplePlan, depth), OFFSET(SamplePlan, method),
                     OFFSET(SamplePlan, nfirst), OFFSET(SamplePlan, inherit), OFFSET(SamplePlan, walk),
                     OFFSET(SamplePlan, stream), OFFSET(SamplePlan, ebeg),  OFFSET(SamplePlan, ej),
                     OFFSET(SamplePlan, same)};
    for (int i = 0; i < (int)(sizeof(v) / sizeof(v[0])); ++i) out[i] = v[i];
}
