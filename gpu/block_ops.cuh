// Whole-block primitives for kernels that run as one block (the graph updater's fused
// small-batch kernels, gpu/mvg.cu): a prefix sum and a bitonic sort in shared memory.
// Every thread of the block calls them; they end with __syncthreads(), so their results
// are visible to the whole block on return.
#pragma once

typedef long long i64;

// The inclusive prefix sum over the block of one value per thread (blockDim.x a multiple of
// 32), and in *total the block's sum: 32 lanes by shuffles, the warps' totals by the first warp.
template <class T>
__device__ T block_incl(T v, T* total) {
    __shared__ T warp_sum[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int d = 1; d < 32; d <<= 1) {
        const T u = __shfl_up_sync(0xffffffffu, v, d);
        if (lane >= d) v += u;
    }
    if (lane == 31) warp_sum[w] = v;
    __syncthreads();
    if (w == 0) {
        T t = lane < nw ? warp_sum[lane] : (T)0;
        for (int d = 1; d < 32; d <<= 1) {
            const T u = __shfl_up_sync(0xffffffffu, t, d);
            if (lane >= d) t += u;
        }
        if (lane < nw) warp_sum[lane] = t;
    }
    __syncthreads();
    v += w ? warp_sum[w - 1] : (T)0;
    *total = warp_sum[nw - 1];
    __syncthreads();  // warp_sum is rewritten by the next call
    return v;
}

// out[i] = in[0] + ... + in[i] for i < n (in == out allowed), chunk after chunk of blockDim.x items.
template <class In, class Out>
__device__ void block_scan(const In* in, Out* out, i64 n) {
    Out carry = 0;
    for (i64 base = 0; base < n; base += blockDim.x) {
        const i64 i = base + threadIdx.x;
        Out total;
        const Out v = block_incl<Out>(i < n ? (Out)in[i] : (Out)0, &total);
        if (i < n) out[i] = carry + v;
        carry += total;
    }
}

// Bitonic sort of sh[0, P) (P a power of two) by less, in place.
template <class Less>
__device__ void block_bitonic(i64* sh, int P, Less less) {
    for (int size = 2; size <= P; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = threadIdx.x; i < P / 2; i += blockDim.x) {
                const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
                const i64 x = sh[lo], y = sh[hi];
                if ((lo & size) == 0 ? less(y, x) : less(x, y)) {
                    sh[lo] = y;
                    sh[hi] = x;
                }
            }
            __syncthreads();
        }
}

__device__ __forceinline__ int pow2_at_least(i64 n) {
    int P = 1;
    while (P < n) P <<= 1;
    return P;
}

// Sort a[0, n) ascending through sh (room for the next power of two >= n).
__device__ void block_sort(i64* a, i64 n, i64* sh) {
    const int P = pow2_at_least(n);
    for (int i = threadIdx.x; i < P; i += blockDim.x) sh[i] = i < n ? a[i] : 0x7fffffffffffffffLL;
    __syncthreads();
    block_bitonic(sh, P, [](i64 x, i64 y) { return x < y; });
    for (int i = threadIdx.x; i < n; i += blockDim.x) a[i] = sh[i];
    __syncthreads();
}
