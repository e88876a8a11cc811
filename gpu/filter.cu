// Candidate filtering on the device: one thread per data vertex, one bit per query vertex.
//
// cbits[v] bit u  <=>  v is a candidate of query vertex u. LDF + NLF first, then rounds of
// arc consistency; the final kernel renumbers the bits by matching depth and gathers the
// root candidates (depth 0) for the search.
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

// LDF (label, degree) and NLF (per neighbour label, at least as many neighbours as u has).
// nlf_ptr[u]..nlf_ptr[u+1] indexes u's (neighbour label, count) pairs.
extern "C" __global__ void ldf_nlf(i64 n, const i64* __restrict__ indptr, const int* __restrict__ gadj,
                                   const int* __restrict__ vlabel, const int* hub_of, const int* hub_tab,
                                   int num_labels, int single_label, int nq,
                                   const int* __restrict__ qlabel, const int* __restrict__ qdeg,
                                   const int* __restrict__ nlf_ptr, const int* __restrict__ nlf_lab,
                                   const int* __restrict__ nlf_cnt, unsigned* __restrict__ cbits) {
    const LabelIndex li{hub_of, hub_tab, num_labels, single_label};
    for (i64 v = blockIdx.x * (i64)blockDim.x + threadIdx.x; v < n; v += (i64)gridDim.x * blockDim.x) {
        int lab = vlabel[v];
        i64 deg = indptr[v + 1] - indptr[v];
        unsigned bits = 0;
        for (int u = 0; u < nq; ++u) {
            if (qlabel[u] != lab || deg < qdeg[u]) continue;
            bool ok = true;
            for (int k = nlf_ptr[u]; k < nlf_ptr[u + 1] && ok; ++k) {
                i64 s;
                int size;
                label_range(indptr, gadj, vlabel, li, (int)v, nlf_lab[k], &s, &size);
                ok = size >= nlf_cnt[k];
            }
            if (ok) bits |= 1u << u;
        }
        cbits[v] = bits;
    }
}

// One round of arc consistency: v stays a candidate of u only if, for every query edge
// (u, w, el), some neighbour x of v with w's label is a candidate of w over an edge labelled
// el. Bits are cleared in place; a concurrent reader sees a bit either set or cleared, and
// both are sound (a cleared bit had no support among a superset of the final candidates).
// arc_ptr[u]..arc_ptr[u+1] indexes u's arcs (arc_w, arc_el, arc_wlabel).
extern "C" __global__ void refine(i64 n, const i64* __restrict__ indptr, const int* __restrict__ gadj,
                                  const int* __restrict__ gadj_el, const int* __restrict__ vlabel,
                                  const int* hub_of, const int* hub_tab, int num_labels, int single_label,
                                  int check_el, const int* __restrict__ arc_ptr,
                                  const int* __restrict__ arc_w, const int* __restrict__ arc_el,
                                  const int* __restrict__ arc_wlabel, unsigned* cbits, int* changed) {
    const LabelIndex li{hub_of, hub_tab, num_labels, single_label};
    for (i64 v = blockIdx.x * (i64)blockDim.x + threadIdx.x; v < n; v += (i64)gridDim.x * blockDim.x) {
        unsigned bits = cbits[v], keep = bits;
        for (unsigned rest = bits; rest; rest &= rest - 1) {
            int u = __ffs(rest) - 1;
            for (int a = arc_ptr[u]; a < arc_ptr[u + 1]; ++a) {
                i64 s;
                int size;
                label_range(indptr, gadj, vlabel, li, (int)v, arc_wlabel[a], &s, &size);
                unsigned wbit = 1u << arc_w[a];
                bool found = false;
                for (i64 p = s; p < s + size && !found; ++p)
                    found = (((volatile unsigned*)cbits)[gadj[p]] & wbit) && (!check_el || gadj_el[p] == arc_el[a]);
                if (!found) {
                    keep &= ~(1u << u);
                    break;
                }
            }
        }
        if (keep != bits) {
            cbits[v] = keep;
            *changed = 1;
        }
    }
}

// Candidates per query vertex (block-local counts first: one global atomic per bit per block).
extern "C" __global__ void count_bits(i64 n, const unsigned* __restrict__ cbits, int nq, u64* sizes) {
    __shared__ u64 local[32];
    if (threadIdx.x < 32) local[threadIdx.x] = 0;
    __syncthreads();
    for (i64 v = blockIdx.x * (i64)blockDim.x + threadIdx.x; v < n; v += (i64)gridDim.x * blockDim.x)
        for (unsigned rest = cbits[v]; rest; rest &= rest - 1) atomicAdd(&local[__ffs(rest) - 1], 1ull);
    __syncthreads();
    if (threadIdx.x < nq && local[threadIdx.x]) atomicAdd(&sizes[threadIdx.x], local[threadIdx.x]);
}

// Renumber the bits from query vertex to matching depth (bit d <=> candidate of order[d]) and
// gather the depth-0 candidates into roots (warp-aggregated: one atomic per warp).
extern "C" __global__ void by_depth(i64 n, unsigned* cbits, const int* __restrict__ order, int nq,
                                    int* __restrict__ roots, u64* roots_n) {
    const int lane = threadIdx.x & 31;
    const i64 stride = (i64)gridDim.x * blockDim.x;
    for (i64 base = blockIdx.x * (i64)blockDim.x; base < n; base += stride) {
        i64 v = base + threadIdx.x;
        unsigned out = 0;
        if (v < n) {
            unsigned bits = cbits[v];
            for (int d = 0; d < nq; ++d) out |= ((bits >> order[d]) & 1u) << d;
            cbits[v] = out;
        }
        unsigned m = __ballot_sync(0xffffffffu, out & 1u);
        if (!m) continue;
        u64 first = 0;
        if (lane == __ffs(m) - 1) first = atomicAdd(roots_n, (u64)__popc(m));
        first = __shfl_sync(0xffffffffu, first, __ffs(m) - 1);
        if (out & 1u) roots[first + __popc(m & ((1u << lane) - 1))] = (int)v;
    }
}
