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

// One compare-exchange of the bitonic network on x, the element at index idx, whose partner
// (idx ^ stride) another lane of the warp holds in the same register: the pair's lower index
// keeps the smaller in an ascending run (its bit `size` clear), the larger otherwise.
__device__ __forceinline__ i64 bitonic_lane(i64 x, i64 idx, int size, int stride) {
    const i64 y = __shfl_xor_sync(0xffffffffu, x, stride);
    const bool up = ((idx & ~(i64)stride) & size) == 0, low = (idx & stride) == 0;
    return up == low ? min(x, y) : max(x, y);
}

// The stages of sizes [from, to] (powers of two) whose stride is at most 32, on 64-element
// chunks of sh[0, P) held by one warp each in two registers: no block barrier between them.
// Stages of a larger stride must be done already (the chunk's elements only pair up inside it).
__device__ __forceinline__ void bitonic_chunks(i64* sh, int P, int from, int to) {
    const int lane = threadIdx.x & 31;
    for (int c = (threadIdx.x >> 5) * 64; c < P; c += (blockDim.x >> 5) * 64) {
        i64 a = sh[c + lane], b = sh[c + 32 + lane];
        for (int size = from; size <= to; size <<= 1) {
            if (size >= 64) {  // stride 32: a and b of the same lane pair up
                const bool up = ((c + lane) & size) == 0;
                const i64 lo = min(a, b), hi = max(a, b);
                a = up ? lo : hi;
                b = up ? hi : lo;
            }
            for (int stride = min(size >> 1, 16); stride; stride >>= 1) {
                a = bitonic_lane(a, c + lane, size, stride);
                b = bitonic_lane(b, c + 32 + lane, size, stride);
            }
        }
        sh[c + lane] = a;
        sh[c + 32 + lane] = b;
    }
}

// Sort sh[0, P) ascending in place (P a power of two). From 64 elements on, the stages of stride <= 32 (most of them) run in registers with warp shuffles, so a
// block barrier separates only the stages of a larger stride: 28 instead of 91 for 8,192.
__device__ void block_sort_shared(i64* sh, int P) {
    if (P < 64) {
        block_bitonic(sh, P, [](i64 x, i64 y) { return x < y; });
    } else {
        bitonic_chunks(sh, P, 2, 64);
        __syncthreads();
        for (int size = 128; size <= P; size <<= 1) {
            for (int stride = size >> 1; stride >= 64; stride >>= 1) {
                for (int i = threadIdx.x; i < P / 2; i += blockDim.x) {
                    const int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
                    const i64 x = sh[lo], y = sh[hi];
                    if ((lo & size) == 0 ? y < x : x < y) {
                        sh[lo] = y;
                        sh[hi] = x;
                    }
                }
                __syncthreads();
            }
            bitonic_chunks(sh, P, size, size);
            __syncthreads();
        }
    }
}

// Sort a[0, n) ascending through sh (room for the next power of two >= n).
__device__ void block_sort(i64* a, i64 n, i64* sh) {
    const int P = pow2_at_least(n);
    for (int i = threadIdx.x; i < P; i += blockDim.x) sh[i] = i < n ? a[i] : 0x7fffffffffffffffLL;
    __syncthreads();
    block_sort_shared(sh, P);
    for (int i = threadIdx.x; i < n; i += blockDim.x) a[i] = sh[i];
    __syncthreads();
}
