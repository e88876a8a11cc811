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
// Candidate graph (daemon/model/estimate.py's CandidateGraph, uploaded): rows[j * n + v] is
// v's row in the candidates of depth j; the local list of that row over backward edge e is
// local[indptr[ipbase[e] + row] .. indptr[ipbase[e] + row + 1]), sorted by vertex id.
#include "layout.cuh"

// ---- Philox4x64-10, as numpy (and Random123) compute it ----
struct U4 {
    u64 v[4];
};

__device__ __forceinline__ double philox_uniform(u64 k0, u64 k1, u64 rnd, u64 index) {
    // numpy advances the counter before each block of 4 outputs: block b has counter b + 1
    u64 c0 = (index >> 2) + 1, c1 = 0, c2 = rnd, c3 = 0;
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
    const unsigned w = (unsigned)(index & 3);
    const u64 out = w == 0 ? c0 : w == 1 ? c1 : w == 2 ? c2 : c3;
    return (double)(out >> 11) * (1.0 / 9007199254740992.0);  // numpy's next_double
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

// Depth i of one walk with uniform r: sets M[i], multiplies w by the size of the set it
// chose from; false when the walk failed.
__device__ __forceinline__ bool extend(const SamplePlan& P, const Cand& cg, int* M, int i, double r, double* w) {
    int piv = -1;
    i64 start = 0, size = 0;
    for (int e = P.ebeg[i]; e < P.ebeg[i + 1]; ++e) {
        i64 s, z;
        cg.list(e, P.ej[e], M[P.ej[e]], &s, &z);
        if (piv < 0 || z < size) piv = e, start = s, size = z;
    }
    if (P.method == METHOD_WJ) {
        // pick from the pivot's list, then check the other edges: a failed check kills the walk
        if (size == 0) return false;
        *w *= (double)size;
        M[i] = __ldg(cg.local + start + pick(r, size));
        return fits(P, cg, M, i, piv, M[i]);
    }
    // Alley: the intersection of all lists, less the used vertices: count it, then take its k-th member
    i64 count = 0;
    for (i64 t = start; t < start + size; ++t) count += fits(P, cg, M, i, piv, __ldg(cg.local + t));
    if (count == 0) return false;
    *w *= (double)count;
    i64 k = pick(r, count);
    for (i64 t = start;; ++t) {
        const int x = __ldg(cg.local + t);
        if (fits(P, cg, M, i, piv, x) && k-- == 0) {
            M[i] = x;
            return true;
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
// for l < lanes. plan is a SamplePlan in global memory, copied to shared memory per block.
// A warp walks 32 consecutive lanes together (all in step, for inheritance).
extern "C" __global__ void __launch_bounds__(256) sample(const int* __restrict__ plan, const int* __restrict__ first,
                                                         const int* __restrict__ rows, i64 n,
                                                         const i64* __restrict__ ipbase,
                                                         const i64* __restrict__ indptr,
                                                         const int* __restrict__ local, u64 k0, u64 k1, u64 rnd,
                                                         i64 lanes, double* __restrict__ weights) {
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
        for (int i = 1; i < P.depth && __any_sync(FULL_MASK, alive); ++i) {
            if (alive) alive = extend(P, cg, M, i, philox_uniform(k0, k1, rnd, (u64)i * lanes + l), &w);
            if (P.inherit && i + 1 < P.depth) inherit(M, i, &w, &alive, real);
        }
        if (real) weights[l] = alive ? w : 0.0;
    }
}

// The SamplePlan's size and field offsets, in the order gpu/sampler.py names them (NVRTC has no offsetof).
#define OFFSET(T, f) ((i64)((const char*)&((const T*)0)->f - (const char*)0))
extern "C" __global__ void layout(i64* out) {
    const i64 v[] = {sizeof(SamplePlan), OFFSET(SamplePlan, ebeg), OFFSET(SamplePlan, ej), OFFSET(SamplePlan, same)};
    for (int i = 0; i < (int)(sizeof(v) / sizeof(v[0])); ++i) out[i] = v[i];
}
