// The global task queue of the search kernels: a ring of offloaded nodes that idle warps
// take a group at a time (time-based offload of skewed search trees, BUG).
#pragma once
#include "warp_stack.cuh"

// The task queue is a ring: slot seq % cap holds task seq once ready[slot] == tag(seq); a
// consumer sets it back to 0 after reading, and a producer writes only into a 0 slot.
__device__ __forceinline__ int tag(u64 seq) { return (int)(seq % 2147483647ull) + 1; }
__device__ __forceinline__ int vready(const int* ready, u64 slot) { return ((volatile const int*)ready)[slot]; }

// Take the next group from the task queue; false if there is none (or it was taken first).
// The caller is counted idle; while taking it is not. switch_to(q) makes the group's query
// (Task.q) the warp's before its level is built.
template <class SwitchTo>
__device__ bool take_group(Level* lv, WarpState* ws, u64* ctl, const Task* queue, int* ready, i64 queue_cap,
                           int lane, SwitchTo switch_to) {
    u64 h = 0;
    int ok = 0, gsize = 0;
    if (lane == 0) {
        h = vload(&ctl[CTL_HEAD]);
        if (h < vload(&ctl[CTL_TAIL])) {
            atomicAdd(&ctl[CTL_IDLE], ~0ull);  // minus one: not idle while taking, so nobody terminates meanwhile
            // wait for the group's first task, unless another warp takes it first (then the
            // slot may even be reused: stop waiting as soon as the head moves)
            bool seen = false;
            while (!(seen = vready(ready, h % queue_cap) == tag(h)) && vload(&ctl[CTL_HEAD]) == h) __nanosleep(32);
            if (seen) {
                __threadfence();
                gsize = ((volatile const Task*)queue)[h % queue_cap].group;
                ok = atomicCAS(&ctl[CTL_HEAD], h, h + gsize) == h;  // a stale read fails here
            }
            if (!ok) atomicAdd(&ctl[CTL_IDLE], 1ull);
        }
    }
    ok = __shfl_sync(FULL_MASK, ok, 0);
    if (!ok) return false;
    h = __shfl_sync(FULL_MASK, h, 0);
    gsize = __shfl_sync(FULL_MASK, gsize, 0);
    bool have = lane < gsize;
    int m = 0, v = 0, piv = 0, size = 0, q = 0;
    bool dealt = false;
    i64 start = 0;
    if (have) {
        const u64 slot = (h + lane) % queue_cap;
        while (vready(ready, slot) != tag(h + lane)) __nanosleep(32);
        __threadfence();
        const volatile Task* t = (const volatile Task*)&queue[slot];
        m = t->m;
        q = t->q;
        for (int j = 0; j < m - 1; ++j) {
            lv[j].v[lane] = t->v[j];
            lv[j].parent[lane] = (unsigned char)lane;
        }
        v = t->v[m - 1];
        start = t->start;
        size = t->size;
        piv = t->piv;
        dealt = t->dealt;
        __threadfence();
        atomicExch(&ready[slot], 0);
    }
    m = __shfl_sync(FULL_MASK, m, 0);
    switch_to(__shfl_sync(FULL_MASK, q, 0));
    build_level(&lv[m - 1], have, v, lane, start, size, piv, dealt, lane);
    start_work(lv, ws, m, lane);
    return true;
}

// Hand the rest of the shallowest unfinished level to the task queue (one task per node).
__device__ void offload(Level* lv, WarpState* ws, u64* ctl, Task* queue, int* ready, i64 queue_cap, int lane) {
    int l = -1;
    for (int j = ws->base; j <= ws->top; ++j)
        if (lv[j].cursor < lv[j].total) {
            l = j;
            break;
        }
    if (lane == 0) ws->t_start = now_ns();
    if (l < 0) return;
    Level* L = &lv[l];
    const i64 cursor = L->cursor;
    bool push = false;
    i64 start = 0;
    int size = 0;
    if (lane < L->cnt) {
        i64 from = cursor - L->off[lane];
        if (from < 0) from = 0;
        if (from < L->size[lane]) {
            push = true;
            start = L->start[lane] + from;
            size = L->size[lane] - (int)from;
        }
    }
    const unsigned b = __ballot_sync(FULL_MASK, push);
    const int k = __popc(b);
    u64 t = 0;
    int ok = 0;
    if (lane == 0 && k) {
        u64 old = vload(&ctl[CTL_TAIL]);
        while ((i64)(old + k) - (i64)vload(&ctl[CTL_HEAD]) <= queue_cap) {  // slots below the head are free
            u64 prev = atomicCAS(&ctl[CTL_TAIL], old, old + k);
            if (prev == old) {
                ok = 1;
                t = old;
                break;
            }
            old = prev;
        }
    }
    ok = __shfl_sync(FULL_MASK, ok, 0);
    if (!ok) return;
    t = __shfl_sync(FULL_MASK, t, 0);
    if (push) {
        const int r = __popc(b & ((1u << lane) - 1));
        const u64 slot = (t + r) % queue_cap;
        while (vready(ready, slot) != 0) __nanosleep(32);  // its last consumer is reading it
        Task* task = &queue[slot];
        task->start = start;
        task->size = size;
        task->m = l + 1;
        task->piv = L->piv[lane];
        task->group = r == 0 ? k : 0;
        task->q = ws->q;
        task->dealt = (L->dealt >> lane) & 1u;
        int node = lane;
        for (int j = l; j >= 0; --j) {
            task->v[j] = lv[j].v[node];
            node = lv[j].parent[node];
        }
        __threadfence();
        atomicExch(&ready[slot], tag(t + r));
    }
    __syncwarp();
    if (lane == 0) L->cursor = L->total;
    __syncwarp();
}

