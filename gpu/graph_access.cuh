// Read access to the device graph shared by the filter and matcher kernels.
//
// Two adjacency orders of the same CSR (one indptr):
//   adj / adj_el    neighbours sorted by id: membership tests are one binary search;
//   gadj / gadj_el  neighbours sorted by (label, id): the neighbours of v with one label
//                   are a contiguous range, so candidates come without a label test.
// With a single vertex label both orders are the same array.
#pragma once
#include "layout.cuh"

// Where each label's neighbours start in the label-grouped slices of high-degree vertices:
// row hub_of[v] of tab holds num_labels + 1 offsets relative to indptr[v] (-1: no row, the
// slice is short enough for a binary search). Without it a hub costs two dependent loads
// per search step.
struct LabelIndex {
    const int* __restrict__ hub_of;
    const int* __restrict__ tab;
    int num_labels;
    int single_label;
};

// The neighbours of v labelled `lab`, as [start, start + size) into gadj.
__device__ __forceinline__ void label_range(const i64* __restrict__ indptr, const int* __restrict__ gadj,
                                            const int* __restrict__ vlabel, const LabelIndex& li, int v, int lab,
                                            i64* start, int* size) {
    const i64 lo = __ldg(indptr + v), hi = __ldg(indptr + v + 1);
    if (li.single_label) {
        *start = lo;
        *size = lab == 0 ? (int)(hi - lo) : 0;
        return;
    }
    if (lab < 0 || lab >= li.num_labels) {
        *start = lo;
        *size = 0;
        return;
    }
    const int h = __ldg(li.hub_of + v);
    if (h >= 0) {
        const int* row = li.tab + (i64)h * (li.num_labels + 1);
        const int a = __ldg(row + lab);
        *start = lo + a;
        *size = __ldg(row + lab + 1) - a;
        return;
    }
    i64 a = lo, b = hi;
    while (a < b) {  // first neighbour with label >= lab
        i64 m = (a + b) >> 1;
        if (__ldg(vlabel + __ldg(gadj + m)) < lab) a = m + 1; else b = m;
    }
    i64 c = a, e = hi;
    while (c < e) {  // first neighbour with label > lab
        i64 m = (c + e) >> 1;
        if (__ldg(vlabel + __ldg(gadj + m)) <= lab) c = m + 1; else e = m;
    }
    *start = a;
    *size = (int)(c - a);
}

// Is {v, w} an edge (whose label passes el when check_el: label_ok)?
__device__ __forceinline__ bool has_edge(const i64* __restrict__ indptr, const int* __restrict__ adj,
                                         const int* __restrict__ adj_el, int check_el, int v, int w, int el) {
    i64 a = __ldg(indptr + v), b = __ldg(indptr + v + 1);
    while (a < b) {
        i64 m = (a + b) >> 1;
        int x = __ldg(adj + m);
        if (x < w) a = m + 1;
        else if (x > w) b = m;
        else return !check_el || label_ok(__ldg(adj_el + m), el);
    }
    return false;
}
