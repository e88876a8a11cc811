// The layouts the search kernels share with their Python drivers: limits, control slots and
// the structs of the warp stack and the task ring. Python reads the #defines from this file
// and the struct sizes and offsets from the `layout` kernel at load (gpu/layout.py): nothing
// is mirrored by hand.
#pragma once

typedef long long i64;
typedef unsigned long long u64;

#define MAXQ 32
#define FULL_MASK 0xffffffffu

// ctl[] slots (u64), persistent over the launches of one search unless noted
#define CTL_POOL 0     // next root-pool entry (chunks of 32 entries, one query each)
#define CTL_HEAD 1     // task queue: next group to take
#define CTL_TAIL 2     // task queue: next free slot
#define CTL_IDLE 3     // warps that found no work (per launch)
#define CTL_STOP 4     // why the launch ends early (per launch): STOP_*
#define CTL_OUTN 5     // rows reserved in the output buffer (per launch)
#define CTL_GCOUNT 6   // global match count, used only with a count limit (a batch of one)
#define CTL_STARTED 7  // warps that started (per launch): termination needs idle == started

// Does an entry's edge label x pass a query's label q? Undirected, q is the label (q >= 0). In a
// directed graph x is the code of a vertex pair's arcs and q a query pair's code with bit 31 set:
// only the arcs q holds are compared (daemon/model/direction.py; device_label there).
__device__ __forceinline__ bool label_ok(int x, int q) {
    if (q >= 0) return x == q;
    const int c = q & 0x7fffffff;
    const int mask = ((c >> 14) & 1) * 0x7fff | ((c >> 29) & 1) * (0x7fff << 15);
    return (x & mask) == c;
}

// Under event time a table's time words (int, TT_WORDS per table; gpu/executor.py time_words):
// [0] its query edges (0: the search keeps no ts), [1] its order pairs, [2 + d] the edges whose
// later depth is <= d, then TMAXE edges (earlier depth | later depth << 8 | arc << 16: 0 the arc
// from the earlier depth's image, 1 the arc back) in later-depth order, then TMAXE order pairs
// (edge a | edge b << 8 | the depth that completes them << 16: edge a's ts < edge b's).
#define TMAXE 64
#define TT_EEND 2
#define TT_EDGES 34
#define TT_ORDERS 98
#define TT_WORDS 162
static_assert(TT_EDGES == TT_EEND + MAXQ && TT_ORDERS == TT_EDGES + TMAXE && TT_WORDS == TT_ORDERS + TMAXE,
              "the time words' layout");

#define STOP_FULL 1   // output buffer full: drain and resume
#define STOP_LIMIT 2  // limit reached: final
#define STOP_TIME 3   // deadline passed: final

// Per-depth checks of one query's plan, with depths as bit positions. Edge labels by depth
// are a separate table in global memory (read only when the graph has edge labels).
struct QueryTable {
    int n;      // depths searched (the BFS pre-pass searches 2)
    int width;  // ints per output row
    int fast;   // last depths counted at once: 1 from prefix sums (count_last), k as a product (count_suffix_at)
    int pad;
    int outpos[MAXQ];      // output column of depth d
    int label[MAXQ];       // vertex label of depth d
    unsigned back[MAXQ];   // backward neighbours of depth d
    unsigned same[MAXQ];   // earlier non-adjacent depths with the same label (injectivity)
    unsigned less[MAXQ];   // earlier depths whose image must be smaller (symmetry breaking)
    unsigned greater[MAXQ];
};

struct Level {
    i64 start[32];
    i64 off[32];
    int v[32];
    int size[32];
    unsigned char parent[32];
    unsigned char piv[32];
    i64 total;
    i64 cursor;
    int cnt;
    unsigned dealt;  // a split search: bit s, node s's subtree is this device's part (matcher.cu deal_at)
};

struct WarpState {
    int top, base, active;
    int q;        // query of the current work (-1: none yet)
    i64 t_start;  // when the warp took its current work (for time-based offload)
    u64 count;
    u64 batches;  // batches of 32 candidates checked (load-balance statistics)
};

// An offloaded node: prefix v[0..m-1] and the rest of its candidate range for depth m.
// The first task of a group pushed together carries the group size (taken whole).
struct Task {
    i64 start;
    int size;
    int m;
    int piv;
    int group;
    int q;
    int dealt;  // the node's dealt bit (Level.dealt)
    int v[MAXQ];
};

// ---- approximate counting (sampler.cu) ----
// Backward edges of all depths together: at most MAXQ * (MAXQ - 1) / 2.
#define MAXE 496
#define METHOD_WJ 0
#define METHOD_ALLEY 1

// One query's walk, by depth: depth i's backward edges are ebeg[i] .. ebeg[i + 1] - 1, edge e
// leads to the earlier depth ej[e] and its local lists are list e of the candidate graph.
struct SamplePlan {
    int depth;            // depths walked
    int method;           // METHOD_*
    int nfirst;           // candidates of depth 0
    int inherit;          // sample inheritance within each warp (sampler.cu)
    int walk;             // depths sampled; the rest (trawling) are counted exactly per sampled prefix
    int stream;           // Alley refine sets of at least this many entries are scanned by the whole warp (0: never)
    int ebeg[MAXQ + 1];
    int ej[MAXE];
    unsigned same[MAXQ];  // earlier non-adjacent depths with the same label (injectivity)
};
