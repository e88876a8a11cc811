// A drain of match_at's output buffer put in the canonical delta order on the device
// (gpu/drains.py drives it). A drained row holds a match's ids in query-vertex order, padded
// to the widest query, then under event time its ts_min and ts_max as (low, high) words, and
// last its seed: the seed's row of the seeds buffer gives its update (seq) and its table,
// the table its query. The canonical order is by query, update, then the ids.
//
// drain_keys   each row's sort keys: word 0 (query << SEQ_BITS | seq), then its ids packed
//              most significant first, `bits` each, into `words` words (key-major: word d of
//              row r at keys[d * k + r]); the host sorts them with stable radix sorts, the
//              last word first (LSD), into perm.
// drain_spans  from the sorted word 0, each query's rows: their number, first sorted position,
//              and the offset of its ids in the compacted output (queries in order).
// drain_rows   each sorted row compacted to its query's width after that query's earlier
//              rows, its update beside it (and its ts pair).
#include "layout.cuh"

#define SEQ_BITS 40  // as gpu/executor.py _SEQ_BITS: sequence numbers stay below 2^40

extern "C" __global__ void drain_keys(const int* __restrict__ rows, i64 k, int width, const i64* __restrict__ seeds,
                                      i64 S, const i64* __restrict__ tab_query, const int* __restrict__ qwidth,
                                      int bits, int words, u64* __restrict__ keys) {
    const int per = 64 / bits;
    for (i64 r = blockIdx.x * (i64)blockDim.x + threadIdx.x; r < k; r += (i64)gridDim.x * blockDim.x) {
        const int* row = rows + r * width;
        const i64 s = row[width - 1];
        const i64 q = tab_query[seeds[3 * S + s]];  // the seeds buffer's rows: a, b, seq, table
        keys[r] = (u64)q << SEQ_BITS | (u64)seeds[2 * S + s];
        const int n = qwidth[q];
        int c = 0;
        for (int d = 1; d <= words; ++d) {
            u64 x = 0;
            for (int j = 0; j < per; ++j, ++c) x = x << bits | (c < n ? (u64)(unsigned)row[c] : 0ull);
            keys[d * k + r] = x;
        }
    }
}

// One block. spans: [count nq][first nq][ids offset nq + 1], the last the ids' total.
extern "C" __global__ void drain_spans(i64 k, const u64* __restrict__ key0, const i64* __restrict__ perm, int nq,
                                       const int* __restrict__ qwidth, i64* __restrict__ spans) {
    for (int q = threadIdx.x; q < nq; q += blockDim.x) {
        i64 lo = 0, hi = k;  // the first sorted row of a query >= q
        while (lo < hi) {
            const i64 mid = (lo + hi) / 2;
            if ((i64)(key0[perm[mid]] >> SEQ_BITS) < q) lo = mid + 1; else hi = mid;
        }
        spans[nq + q] = lo;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        i64 at = 0;
        for (int q = 0; q < nq; ++q) {
            const i64 n = (q + 1 < nq ? spans[nq + q + 1] : k) - spans[nq + q];
            spans[q] = n;
            spans[2 * nq + q] = at;
            at += n * qwidth[q];
        }
        spans[3 * nq] = at;
    }
}

extern "C" __global__ void drain_rows(const int* __restrict__ rows, i64 k, int width, const u64* __restrict__ key0,
                                      const i64* __restrict__ perm, int nq, const i64* __restrict__ spans,
                                      const int* __restrict__ qwidth, int timed, i64* __restrict__ seq,
                                      i64* __restrict__ ts, int* __restrict__ ids) {
    for (i64 r = blockIdx.x * (i64)blockDim.x + threadIdx.x; r < k; r += (i64)gridDim.x * blockDim.x) {
        const i64 src = perm[r];
        const u64 key = key0[src];
        const int q = (int)(key >> SEQ_BITS);
        seq[r] = (i64)(key & ((1ull << SEQ_BITS) - 1));
        const int* row = rows + src * width;
        const int n = qwidth[q];
        int* to = ids + spans[2 * nq + q] + (r - spans[nq + q]) * n;
        for (int c = 0; c < n; ++c) to[c] = row[c];
        if (timed) {
            const unsigned* w = (const unsigned*)(row + width - 5);
            ts[2 * r] = (i64)((u64)w[0] | (u64)w[1] << 32);
            ts[2 * r + 1] = (i64)((u64)w[2] | (u64)w[3] << 32);
        }
    }
}
