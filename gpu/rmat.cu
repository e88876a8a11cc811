// R-MAT power-law edges and random vertex labels, generated on the device from a
// counter-based hash (the same seed gives the same graph on any grid).
#include "graph_access.cuh"

__device__ __forceinline__ u64 mix(u64 x) {  // splitmix64 finalizer
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

// Edge i picks one quadrant per level with probabilities a, b, c, 1 - a - b - c.
extern "C" __global__ void rmat_edges(i64 m, int scale, double a, double b, double c, u64 seed, int* src, int* dst) {
    const double ab = a + b, abc = a + b + c;
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < m; i += (i64)gridDim.x * blockDim.x) {
        unsigned s = 0, d = 0;
        for (int level = 0; level < scale; ++level) {
            const double r = (mix(seed ^ mix((u64)i * 64 + level)) >> 11) * (1.0 / 9007199254740992.0);
            const unsigned sb = r >= ab, db = (r >= a && r < ab) || r >= abc;
            s = (s << 1) | sb;
            d = (d << 1) | db;
        }
        src[i] = (int)s;
        dst[i] = (int)d;
    }
}

extern "C" __global__ void random_labels(i64 n, int num_labels, u64 seed, int* labels) {
    for (i64 v = blockIdx.x * (i64)blockDim.x + threadIdx.x; v < n; v += (i64)gridDim.x * blockDim.x)
        labels[v] = (int)(mix(seed ^ mix((u64)v)) % (u64)num_labels);
}
