"""A continuous-matching workload at the literature's scale, generated here from a seed.

    python bench/workloads.py --out DIR [--seed 1] [--vertices 4800000 --edges 38600000] [--scale 1]
                              [--labels 32] [--queries 100] [--sizes 6,8,10]

The papers csmd is measured against (RapidFlow, the CSM study, the GPU systems after them)
report LiveJournal-sized graphs, and neither the graph with their labels nor their query sets
can be fetched here; the shared datasets stop at 290k edges. This builds the same kind of
workload, byte for byte the same from the same seed, so that anyone can rebuild and check it:

- the graph: BTER (Seshadhri, Kolda and Pinar, 2012), for LiveJournal's degrees and clustering:
  target degrees from a power law of exponent 2.5 whose mean is 2 * edges / vertices and whose
  largest is LiveJournal's (20,333, scaled down with the graph); vertices of like degree d
  grouped d + 1 to a block, each pair of a block an edge with probability 0.7 (less for larger
  d), then Chung-Lu pairs drawn by the degree the blocks left. Plain Chung-Lu has almost no
  triangles: a random walk's vertices then rarely induce a dense query (37 dense 6-vertex
  queries in 818,400 walks at 0.1% size), while the blocks give an average clustering
  coefficient of 0.29 at 1% size (LiveJournal's: 0.27). Exactly `edges` distinct pairs, no
  self-loops, vertex ids shuffled so that hubs are anywhere; edge label 0; vertex labels Zipf
  (s = 1) over `labels` labels, label 0 the most common;
- data.graph: the graph less 10% of its edges, drawn at random (`t N M`, `v id label degree`,
  `e u v 0`: csmd reads it, and so do RapidFlow's loaders, with and without the header);
- insertion.graph: the held-out edges, `e u v 0`, in random order (as the human dataset's);
- mixed.graph: the same insertions in the same order, interleaved with deletions (`-e u v 0`)
  of edges of data.graph, half of them inserted again later: every op valid where it stands;
- queries/{tree,sparse,dense}_{size}/query_{density}_{size}_{i}.graph: `--queries` per set,
  each the vertices a random walk on the whole graph visited first, with their labels, so each
  has a match: tree is the walk's spanning tree, sparse adds some of the other edges among
  them (average degree < 3), dense is the subgraph they induce (average degree >= 3);
- workload.json (the parameters and sizes) and MANIFEST.sha256 (`sha256sum -c` in DIR).

Vectorized: numba fills the blocks and walks, numpy draws and dedupes the pairs, pyarrow
formats the text in chunks; the full size takes about a minute and 2 GB on a 2-core VM
(bench/README.md has the figures and the full size's checksums).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numba import njit

LJ_VERTICES, LJ_EDGES, LJ_MAX_DEGREE = 4_800_000, 38_600_000, 20_333
EXPONENT = 2.5  # of the degree distribution's tail
RHO = 0.7  # edge probability inside an affinity block of the smallest degrees
ZIPF = 1.0  # label k has weight 1 / (k + 1)
HOLD_OUT = 0.10  # of the edges, the insertion stream
DELETED = 0.5  # deletions in the mixed stream, per held-out edge; half of them inserted again
DENSITIES = ("tree", "sparse", "dense")
WALK_STEPS = 64  # per query vertex; a walk that finds too few vertices in that many steps is dropped
CHUNK = 1 << 22  # lines formatted at a time: bounds the text's memory


# ---- the graph ---------------------------------------------------------------------------
def degree_weights(n: int, m: int, rng: np.random.Generator) -> np.ndarray:
    """Expected degrees w_i ~ (i + i0)^(-1/(EXPONENT-1)) summing to 2m, i0 chosen so that the
    largest is LiveJournal's largest degree scaled to n vertices (as a power law's maximum
    grows), shuffled over the vertices."""
    top = min(LJ_MAX_DEGREE * (n / LJ_VERTICES) ** (1 / (EXPONENT - 1)), n - 1)
    rank = np.arange(n, dtype=np.float64)
    lo, hi = 1e-6, float(n)
    for _ in range(60):  # bisection on log i0: the largest weight falls as i0 grows
        i0 = math.sqrt(lo * hi)
        w = (rank + i0) ** (-1 / (EXPONENT - 1))
        lo, hi = (i0, hi) if w[0] * 2 * m / w.sum() > top else (lo, i0)
    return rng.permutation(w * (2 * m / w.sum()))


@njit(cache=True)
def _affinity_blocks(order, degree, n, top, seed):
    """BTER's first phase: vertices in `order` (by degree, ascending) grouped into blocks of the
    smallest one's degree + 1, each pair of a block an edge with probability RHO(d) (less for
    larger d, as clustering falls with degree); keys of those pairs, and what each vertex's
    degree leaves to the Chung-Lu phase (its excess)."""
    np.random.seed(seed)
    pairs, i = 0, 0
    while i < len(order):
        b = min(degree[order[i]] + 1, len(order) - i)
        pairs += b * (b - 1) // 2
        i += b
    keys = np.empty(pairs, np.int64)
    excess = degree.astype(np.float64)
    found, i = 0, 0
    while i < len(order):
        d = degree[order[i]]
        b = min(d + 1, len(order) - i)
        if d < 2:  # no triangle to close: all its degree goes to the Chung-Lu phase
            i += b
            continue
        rho = RHO * (1 - 0.5 * (math.log(d + 1) / math.log(top + 1)) ** 2)
        for a in range(i, i + b):
            for c in range(a + 1, i + b):
                if np.random.random() < rho:
                    x, y = order[a], order[c]
                    keys[found] = min(x, y) * n + max(x, y)
                    found += 1
            excess[order[a]] = max(degree[order[a]] - rho * (b - 1), 0.0)
        i += b
    return keys[:found], excess


def bter(n: int, m: int, rng: np.random.Generator) -> np.ndarray:
    """Exactly m distinct pairs u < v, as sorted keys u * n + v: affinity blocks, then Chung-Lu
    endpoints drawn in proportion to the excess degrees until m distinct pairs are found, then
    a random surplus of the Chung-Lu pairs dropped."""
    degree = np.maximum(np.rint(degree_weights(n, m, rng)), 1).astype(np.int64)
    inner, excess = _affinity_blocks(np.argsort(degree, kind="stable"), degree, n, int(degree.max()),
                                     int(rng.integers(2**31)))
    cum = np.cumsum(excess)
    inner.sort()
    keys, want = inner, m - len(inner)
    while len(keys) < m:
        parts = [keys]
        for start in range(0, want, CHUNK):
            size = min(CHUNK, want - start)
            u = np.searchsorted(cum, rng.random(size) * cum[-1], side="right")
            v = np.searchsorted(cum, rng.random(size) * cum[-1], side="right")
            lo, hi = np.minimum(u, v), np.maximum(u, v)
            parts.append((lo * n + hi)[lo != hi])
        found = len(keys)
        keys = distinct(np.concatenate(parts))
        # repeats grow with the draws: ask for what is missing at the rate the last round found pairs
        want = math.ceil((m - len(keys)) * want / max(len(keys) - found, 1) * 1.05) + 16
    at = np.minimum(np.searchsorted(inner, keys), max(len(inner) - 1, 0))
    surplus = np.flatnonzero(inner[at] != keys) if len(inner) else np.arange(len(keys))
    if len(surplus) < len(keys) - m:  # the blocks alone made too many (a tiny graph's rounding)
        surplus = np.arange(len(keys))
    return np.delete(keys, rng.choice(surplus, len(keys) - m, replace=False))


def distinct(keys: np.ndarray) -> np.ndarray:
    """np.unique's result, by one sort: numpy 2.4's np.unique took 60x as long as np.sort on 3.9M
    random int64 keys (3.4 s against 0.05 s, 2-core VM)."""
    keys = np.sort(keys)
    return keys[np.concatenate([[True], keys[1:] != keys[:-1]])] if len(keys) else keys


def zipf_labels(n: int, labels: int, rng: np.random.Generator) -> np.ndarray:
    p = 1.0 / np.arange(1, labels + 1) ** ZIPF
    return rng.choice(labels, n, p=p / p.sum()).astype(np.int32)


def mixed_stream(held: np.ndarray, initial: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(keys, sign) of the mixed stream: the held-out keys in their order, DELETED * len(held) keys
    of the initial graph deleted at random times, the first half of those inserted again at a
    later time. Each op is valid where it stands: a held-out edge is absent until its insertion,
    a deleted one present until its deletion and absent until its re-insertion."""
    deleted = initial[rng.choice(len(initial), int(len(held) * DELETED), replace=False)]
    again = deleted[:len(deleted) // 2]
    t_ins = np.sort(rng.random(len(held)))
    t_del = rng.random(len(deleted))
    t_again = t_del[:len(again)] + rng.random(len(again)) * (1 - t_del[:len(again)])
    # stable: a re-insertion that ties its deletion's time stays after it
    order = np.argsort(np.concatenate([t_ins, t_del, t_again]), kind="stable")
    keys = np.concatenate([held, deleted, again])[order]
    sign = np.concatenate([np.ones(len(held), np.int8), -np.ones(len(deleted), np.int8),
                           np.ones(len(again), np.int8)])[order]
    return keys, sign


@njit(cache=True)
def _csr(keys, n):
    """Sorted adjacency of the pairs (keys sorted): filling in key order lists each vertex's
    smaller neighbours (as the larger end) before its larger ones, both ascending."""
    indptr = np.zeros(n + 1, np.int64)
    for k in keys:
        indptr[k // n + 1] += 1
        indptr[k % n + 1] += 1
    indptr = np.cumsum(indptr)
    fill = indptr[:-1].copy()
    indices = np.empty(indptr[-1], np.int32)
    for k in keys:
        u, v = k // n, k % n
        indices[fill[u]] = v
        fill[u] += 1
        indices[fill[v]] = u
        fill[v] += 1
    return indptr, indices


# ---- queries -----------------------------------------------------------------------------
@njit(cache=True)
def _adjacent(indptr, indices, a, b):
    if indptr[a + 1] - indptr[a] > indptr[b + 1] - indptr[b]:
        a, b = b, a
    row = indices[indptr[a]:indptr[a + 1]]
    i = np.searchsorted(row, b)
    return i < len(row) and row[i] == b


@njit(cache=True)
def _walks(indptr, indices, starts, k, seed):
    """One random walk from each start until it has visited k vertices: (vertices in the order
    first visited, the position each was reached from (-1: the start), the number of edges
    among them beyond the walk's spanning tree (-1: the walk found fewer in k * WALK_STEPS steps))."""
    np.random.seed(seed)
    vert = np.zeros((len(starts), k), np.int64)
    parent = np.full((len(starts), k), -1, np.int64)
    extra = np.full(len(starts), -1, np.int64)
    for w in range(len(starts)):
        vert[w, 0] = starts[w]
        size, at = 1, 0
        for _ in range(k * WALK_STEPS):
            x = vert[w, at]
            y = indices[indptr[x] + np.random.randint(0, indptr[x + 1] - indptr[x])]
            step = -1
            for j in range(size):
                if vert[w, j] == y:
                    step = j
            if step < 0:
                vert[w, size], parent[w, size], step = y, at, size
                size += 1
                if size == k:
                    break
            at = step
        if size < k:
            continue
        count = 0
        for a in range(k):
            for b in range(a + 1, k):
                count += _adjacent(indptr, indices, vert[w, a], vert[w, b])
        extra[w] = count - (k - 1)
    return vert, parent, extra


def dense_edges(k: int) -> int:
    """The fewest edges of a dense query of k vertices: average degree 2|E|/k >= 3."""
    return math.ceil(1.5 * k)


def query_set(indptr, indices, labels, k: int, density: str, count: int, rng: np.random.Generator) -> list:
    """`count` queries of k vertices of one density, from distinct vertex sets of random walks that
    start at vertices drawn uniformly (of those with an edge): [(labels, edges)], edges (a, b)
    with a < b over query vertices 0..k-1 in the order the walk reached them."""
    need = {"tree": 0, "sparse": 1, "dense": dense_edges(k) - (k - 1)}[density]
    nonzero = np.flatnonzero(np.diff(indptr))
    found, seen, walks, batch = [], set(), 0, 8 * count
    while len(found) < count:
        if walks > 1000 * count * k:
            raise SystemExit(f"{density}_{k}: {len(found)} of {count} queries after {walks:,} walks; the graph is "
                             "too small or too sparse for this set")
        vert, parent, extra = _walks(indptr, indices, nonzero[rng.integers(0, len(nonzero), batch)], k,
                                     int(rng.integers(2**31)))
        walks, batch = walks + batch, min(batch * 2, 1 << 20)
        for w in np.flatnonzero(extra >= need):
            key = tuple(sorted(vert[w].tolist()))
            if key not in seen:
                seen.add(key)
                found.append(_query(indptr, indices, labels, vert[w], parent[w], density, rng))
                if len(found) == count:
                    break
    return found


def _query(indptr, indices, labels, vert, parent, density: str, rng) -> tuple[np.ndarray, list]:
    k = len(vert)
    tree = {(int(min(p, j)), int(max(p, j))) for j, p in enumerate(parent) if p >= 0}
    others = [(a, b) for a in range(k) for b in range(a + 1, k)
              if (a, b) not in tree and _adjacent(indptr, indices, vert[a], vert[b])]
    if density == "sparse":  # some of the others, so that the average degree stays below 3
        take = int(rng.integers(1, min(len(others), dense_edges(k) - 1 - (k - 1)) + 1))
        others = [others[i] for i in sorted(rng.choice(len(others), take, replace=False))]
    elif density == "tree":
        others = []
    return labels[vert], sorted(tree | set(others))


# ---- files -------------------------------------------------------------------------------
def write_lines(f, *columns, rows: int) -> None:
    """Write `rows` lines of space-separated fields: each column a str (the same on every line),
    an integer array or a pyarrow string array; formatted by pyarrow a chunk at a time."""
    for start in range(0, rows, CHUNK):
        part = [c if isinstance(c, str) else c[start:start + CHUNK] if isinstance(c, pa.Array) else
                pc.cast(pa.array(c[start:start + CHUNK]), pa.string()) for c in columns]
        text = pc.binary_join_element_wise(pc.binary_join_element_wise(*part, " "), "", "\n")
        offsets = np.frombuffer(text.buffers()[1], np.int32, len(text) + 1)
        f.write(memoryview(text.buffers()[2])[offsets[0]:offsets[-1]])


def write_graph(path: Path, labels: np.ndarray, keys: np.ndarray) -> None:
    """`t N M`, `v id label degree`, `e u v 0` (u < v, sorted): the header and degrees let
    RapidFlow's loader with meta data size its arrays; csmd checks both."""
    n = len(labels)
    u, v = keys // n, keys % n
    degree = np.bincount(u, minlength=n) + np.bincount(v, minlength=n)
    with open(path, "wb") as f:
        f.write(f"t {n} {len(keys)}\n".encode())
        write_lines(f, "v", np.arange(n), labels, degree, rows=n)
        write_lines(f, "e", u, v, "0", rows=len(keys))


def write_stream(path: Path, n: int, keys: np.ndarray, sign: np.ndarray | None = None) -> None:
    """`e u v 0` insertions and `-e u v 0` deletions (sign -1), in order."""
    op = "e" if sign is None else pc.if_else(pa.array(sign > 0), "e", "-e")
    with open(path, "wb") as f:
        write_lines(f, op, keys // n, keys % n, "0", rows=len(keys))


def write_query(path: Path, labels: np.ndarray, edges: list) -> None:
    degree = np.bincount(np.array(edges).ravel(), minlength=len(labels))
    path.write_text(f"t {len(labels)} {len(edges)}\n" + "".join(f"v {i} {lab} {d}\n" for i, (lab, d) in
                                                             enumerate(zip(labels.tolist(), degree.tolist())))
                    + "".join(f"e {a} {b} 0\n" for a, b in edges))


def write_manifest(out: Path) -> str:
    """MANIFEST.sha256 of every other file under `out`, in `sha256sum -c` form; its text."""
    lines = []
    for p in sorted(q for q in out.rglob("*") if q.is_file() and q.name != "MANIFEST.sha256"):
        digest = hashlib.sha256()
        with open(p, "rb") as f:
            while block := f.read(1 << 24):
                digest.update(block)
        lines.append(f"{digest.hexdigest()}  {p.relative_to(out).as_posix()}\n")
    (out / "MANIFEST.sha256").write_text("".join(lines))
    return "".join(lines)


# ---- the command ---------------------------------------------------------------------------
def build(out: Path, seed: int = 1, vertices: int = LJ_VERTICES, edges: int = LJ_EDGES, labels: int = 32,
          queries: int = 100, sizes=(6, 8, 10), say=lambda msg: None) -> dict:
    """Write the workload into `out` (made if missing); its workload.json as a dict."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    n, m = vertices, edges
    keys = bter(n, m, rng)
    vlabels = zipf_labels(n, labels, rng)
    say(f"graph: {n:,} vertices, {m:,} edges")
    pick = rng.choice(m, int(m * HOLD_OUT), replace=False)  # in random order: the stream's
    held = keys[pick]
    stays = np.ones(m, bool)
    stays[pick] = False
    initial = keys[stays]
    write_graph(out / "data.graph", vlabels, initial)
    write_stream(out / "insertion.graph", n, held)
    mixed, sign = mixed_stream(held, initial, rng)
    write_stream(out / "mixed.graph", n, mixed, sign)
    del initial, mixed, sign
    say("data.graph, insertion.graph, mixed.graph written")
    indptr, indices = _csr(keys, n)
    del keys
    sets = {}
    for k in sizes:
        for density in DENSITIES:
            name = f"{density}_{k}"
            (out / "queries" / name).mkdir(parents=True, exist_ok=True)
            for i, (ql, qe) in enumerate(query_set(indptr, indices, vlabels, k, density, queries, rng), 1):
                write_query(out / "queries" / name / f"query_{name}_{i}.graph", ql, qe)
            sets[name] = queries
        say(f"queries of {k} vertices written")
    deleted = int(len(held) * DELETED)
    info = {"seed": seed, "vertices": n, "edges": m, "labels": labels, "initial_edges": m - len(held),
            "insertions": len(held), "max_degree": int(np.diff(indptr).max()),
            "mixed": {"insertions": len(held) + deleted // 2, "deletions": deleted},
            "query_sets": sets, "exponent": EXPONENT, "rho": RHO, "zipf": ZIPF}
    (out / "workload.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="folder to write the workload into")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--vertices", type=int, default=LJ_VERTICES)
    ap.add_argument("--edges", type=int, default=LJ_EDGES, help="of the whole graph, the stream's included")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies --vertices and --edges (0.001: seconds)")
    ap.add_argument("--labels", type=int, default=32, help="vertex labels")
    ap.add_argument("--queries", type=int, default=100, help="per set (size x density)")
    ap.add_argument("--sizes", default="6,8,10", help="query sizes, in vertices")
    args = ap.parse_args(argv)
    n, m = round(args.vertices * args.scale), round(args.edges * args.scale)
    if not (2 <= n < 2**31 and 0 < m <= n * (n - 1) // 8):  # a quarter of all pairs: Chung-Lu must find them
        ap.error(f"{n} vertices and {m} edges: need 2 <= vertices < 2^31 and 0 < edges <= vertices^2 / 8")
    sizes = tuple(int(s) for s in args.sizes.split(","))
    if any(not 4 <= k <= 32 for k in sizes):  # 4: the smallest with a dense query (K4); 32: csmd's largest
        ap.error("--sizes: each between 4 and 32")
    if args.out.exists() and any(args.out.iterdir()):  # the manifest lists every file in it
        ap.error(f"--out {args.out} is not empty: give a new folder")
    t0 = time.monotonic()
    say = lambda msg: print(f"{time.monotonic() - t0:7.1f} s  {msg}", file=sys.stderr, flush=True)
    build(args.out, args.seed, n, m, args.labels, args.queries, sizes, say)
    sys.stdout.write(write_manifest(args.out))
    say(f"MANIFEST.sha256 written in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
