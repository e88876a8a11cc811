// Candidate filtering on the device for a batch of queries: one thread per data vertex and
// query, one bit per query vertex.
//
// cbits[i][v] bit u  <=>  v is a candidate of vertex u of query i. LDF + NLF first, then
// rounds of arc consistency; the final kernel renumbers the bits by matching depth and
// gathers the root candidates (depth 0) for the search.
#include "graph_access.cuh"

// Fill the offset rows of the hubs (one thread per hub and label; label num_labels = end).
extern "C" __global__ void label_index(i64 nh, const int* __restrict__ hubs, int num_labels,
                                       const i64* __restrict__ indptr, const int* __restrict__ gadj,
                                       const int* __restrict__ vlabel, int* tab) {
    const i64 total = nh * (num_labels + 1);
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
        const i64 k = i / (num_labels + 1);
        const int lab = (int)(i % (num_labels + 1)), v = hubs[k];
        i64 a = indptr[v], b = indptr[v + 1];
        const i64 lo = a;
        while (a < b) {
            i64 m = (a + b) >> 1;
            if (vlabel[gadj[m]] < lab) a = m + 1; else b = m;
        }
        tab[i] = (int)(a - lo);
    }
}

// A batch of queries, one per blockIdx.y: query i has qn[i] vertices, labels qlab[i][u],
// neighbour masks qnbr[i][u] (bit w: edge u-w) and, with edge labels, qel[i][u][w].
// cbits holds one row of n words per query (MAXQ: layout.cuh).

struct QueryView {
    int n;
    int lab[MAXQ];
    unsigned nbr[MAXQ];
};

// The block's query, in shared memory.
__device__ __forceinline__ void load_query(QueryView* s, const int* qn, const int* qlab, const unsigned* qnbr) {
    const int qi = blockIdx.y;
    if (threadIdx.x == 0) s->n = qn[qi];
    if (threadIdx.x < MAXQ) {
        s->lab[threadIdx.x] = qlab[qi * MAXQ + threadIdx.x];
        s->nbr[threadIdx.x] = qnbr[qi * MAXQ + threadIdx.x];
    }
    __syncthreads();
}

// LDF (label, degree) and NLF: for each label among u's neighbours, v has at least as many
// neighbours with that label (counted once, at the lowest neighbour carrying it).
extern "C" __global__ void ldf_nlf(i64 n, const i64* __restrict__ indptr, const int* __restrict__ gadj,
                                   const int* __restrict__ vlabel, const int* hub_of, const int* hub_tab,
                                   int num_labels, int single_label, const int* qn, const int* qlab,
                                   const unsigned* qnbr, unsigned* __restrict__ cbits) {
    __shared__ QueryView Q;
    load_query(&Q, qn, qlab, qnbr);
    const LabelIndex li{hub_of, hub_tab, num_labels, single_label};
    unsigned* cb = cbits + (i64)blockIdx.y * n;
    for (i64 v = blockIdx.x * (i64)blockDim.x + threadIdx.x; v < n; v += (i64)gridDim.x * blockDim.x) {
        const int lab = vlabel[v];
        const i64 deg = indptr[v + 1] - indptr[v];
        unsigned bits = 0;
        for (int u = 0; u < Q.n; ++u) {
            const unsigned nb = Q.nbr[u];
            if (Q.lab[u] != lab || deg < __popc(nb)) continue;
            bool ok = true;
            for (unsigned rest = nb; rest && ok; rest &= rest - 1) {
                const int w = __ffs(rest) - 1, wl = Q.lab[w];
                int need = 0;
                bool first = true;
                for (unsigned r2 = nb; r2; r2 &= r2 - 1) {
                    const int x = __ffs(r2) - 1;
                    if (Q.lab[x] == wl) {
                        ++need;
                        first &= x >= w;
                    }
                }
                if (!first) continue;
                i64 s;
                int size;
                label_range(indptr, gadj, vlabel, li, (int)v, wl, &s, &size);
                ok = size >= need;
            }
            if (ok) bits |= 1u << u;
        }
        cb[v] = bits;
    }
}

// One round of arc consistency: v stays a candidate of u only if, for every query edge
// (u, w), some neighbour x of v with w's label is a candidate of w over an edge with the
// query edge's label. Bits are cleared in place; a concurrent reader sees a bit either set
// or cleared, and both are sound (a cleared bit had no support among a superset of the
// final candidates).
extern "C" __global__ void refine(i64 n, const i64* __restrict__ indptr, const int* __restrict__ gadj,
                                  const int* __restrict__ gadj_el, const int* __restrict__ vlabel,
                                  const int* hub_of, const int* hub_tab, int num_labels, int single_label,
                                  int check_el, const int* qn, const int* qlab, const unsigned* qnbr,
                                  const int* __restrict__ qel, unsigned* cbits, int* changed) {
    __shared__ QueryView Q;
    load_query(&Q, qn, qlab, qnbr);
    const LabelIndex li{hub_of, hub_tab, num_labels, single_label};
    unsigned* cb = cbits + (i64)blockIdx.y * n;
    const int* el = qel + (i64)blockIdx.y * MAXQ * MAXQ;
    for (i64 v = blockIdx.x * (i64)blockDim.x + threadIdx.x; v < n; v += (i64)gridDim.x * blockDim.x) {
        const unsigned bits = cb[v];
        unsigned keep = bits;
        for (unsigned rest = bits; rest; rest &= rest - 1) {
            const int u = __ffs(rest) - 1;
            for (unsigned arcs = Q.nbr[u]; arcs; arcs &= arcs - 1) {
                const int w = __ffs(arcs) - 1;
                const int e = check_el ? el[u * MAXQ + w] : 0;
                i64 s;
                int size;
                label_range(indptr, gadj, vlabel, li, (int)v, Q.lab[w], &s, &size);
                const unsigned wbit = 1u << w;
                bool found = false;
                for (i64 p = s; p < s + size && !found; ++p)
                    found = (((volatile unsigned*)cb)[gadj[p]] & wbit) && (!check_el || label_ok(gadj_el[p], e));
                if (!found) {
                    keep &= ~(1u << u);
                    break;
                }
            }
        }
        if (keep != bits) {
            cb[v] = keep;
            *changed = 1;
        }
    }
}

// Candidates per query vertex, and their adjacency volume (the sum of their degrees: what
// the search scans when it extends from them). Block-local sums first: one global atomic
// per bit per block.
extern "C" __global__ void count_bits(i64 n, const i64* __restrict__ indptr, const unsigned* __restrict__ cbits,
                                      u64* sizes, u64* volume) {
    __shared__ u64 local[MAXQ], vol[MAXQ];
    if (threadIdx.x < MAXQ) local[threadIdx.x] = vol[threadIdx.x] = 0;
    __syncthreads();
    const unsigned* cb = cbits + (i64)blockIdx.y * n;
    for (i64 v = blockIdx.x * (i64)blockDim.x + threadIdx.x; v < n; v += (i64)gridDim.x * blockDim.x) {
        const unsigned bits = cb[v];
        if (!bits) continue;
        const u64 deg = (u64)(indptr[v + 1] - indptr[v]);
        for (unsigned rest = bits; rest; rest &= rest - 1) {
            atomicAdd(&local[__ffs(rest) - 1], 1ull);
            atomicAdd(&vol[__ffs(rest) - 1], deg);
        }
    }
    __syncthreads();
    if (threadIdx.x < MAXQ && local[threadIdx.x]) {
        atomicAdd(&sizes[blockIdx.y * MAXQ + threadIdx.x], local[threadIdx.x]);
        atomicAdd(&volume[blockIdx.y * MAXQ + threadIdx.x], vol[threadIdx.x]);
    }
}

// Renumber the bits from query vertex to matching depth (bit d <=> candidate of order[d]) and
// write the depth-0 candidates of query i into its segment of the root pool, from pool_at[i]
// (warp-aggregated: one atomic per warp).
extern "C" __global__ void by_depth(i64 n, unsigned* cbits, const int* __restrict__ order, const int* qn,
                                    const i64* __restrict__ pool_at, int* __restrict__ pool, u64* filled) {
    const int lane = threadIdx.x & 31, qi = blockIdx.y, nq = qn[qi];
    const int* ord = order + qi * MAXQ;
    unsigned* cb = cbits + (i64)qi * n;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 base = blockIdx.x * (i64)blockDim.x; base < n; base += stride) {
        const i64 v = base + threadIdx.x;
        unsigned out = 0;
        if (v < n) {
            const unsigned bits = cb[v];
            for (int d = 0; d < nq; ++d) out |= ((bits >> ord[d]) & 1u) << d;
            cb[v] = out;
        }
        const unsigned m = __ballot_sync(0xffffffffu, out & 1u);
        if (!m) continue;
        u64 first = 0;
        if (lane == __ffs(m) - 1) first = atomicAdd(&filled[qi], (u64)__popc(m));
        first = __shfl_sync(0xffffffffu, first, __ffs(m) - 1);
        if (out & 1u) pool[pool_at[qi] + first + __popc(m & ((1u << lane) - 1))] = (int)v;
    }
}
