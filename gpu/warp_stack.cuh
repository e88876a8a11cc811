// The warp stack of the depth-first search kernels: levels of up to 32 nodes in shared
// memory, built from the lanes that keep a candidate (see matcher.cu for the scheme).
#pragma once
#include "layout.cuh"

__device__ __forceinline__ i64 now_ns() {
    i64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ u64 vload(u64* p) { return *(volatile u64*)p; }

// Node s of a level holding virtual index idx (offsets strictly increase: no empty node).
__device__ __forceinline__ int find_node(const Level* L, i64 idx) {
    int lo = 0, hi = L->cnt - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (L->off[mid] <= idx) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// Make level k's nodes from the lanes with `keep` (rank = order among them); returns the count.
// dealt: the node's subtree is this device's part of a split search (Level.dealt).
__device__ __forceinline__ int build_level(Level* L, bool keep, int v, int parent, i64 start, int size, int piv,
                                           bool dealt, int lane) {
    const unsigned b = __ballot_sync(FULL_MASK, keep);
    const int r = __popc(b & ((1u << lane) - 1));
    unsigned dealt_bits = keep && dealt ? 1u << r : 0u;  // OR over the warp (__reduce_or_sync needs sm_80)
    for (int o = 16; o > 0; o >>= 1) dealt_bits |= __shfl_xor_sync(FULL_MASK, dealt_bits, o);
    i64 x = keep ? size : 0;
    for (int o = 1; o < 32; o <<= 1) {
        i64 y = __shfl_up_sync(FULL_MASK, x, o);
        if (lane >= o) x += y;
    }
    if (keep) {
        L->v[r] = v;
        L->parent[r] = (unsigned char)parent;
        L->start[r] = start;
        L->size[r] = size;
        L->piv[r] = (unsigned char)piv;
        L->off[r] = x - size;
    }
    const i64 total = __shfl_sync(FULL_MASK, x, 31);
    if (lane == 0) {
        L->cnt = __popc(b);
        L->dealt = dealt_bits;
        L->total = total;
        L->cursor = 0;
    }
    return __popc(b);
}

// The warp starts on prefixes of m vertices loaded into level m - 1.
__device__ __forceinline__ void start_work(Level* lv, WarpState* ws, int m, int lane) {
    if (lane < m - 1) {  // levels under the loaded one hold prefixes only: nothing to iterate
        lv[lane].cnt = 0;
        lv[lane].total = 0;
        lv[lane].cursor = 0;
    }
    if (lane == 0) {
        ws->top = ws->base = m - 1;
        ws->active = 1;
        ws->t_start = now_ns();
    }
    __syncwarp();
}

