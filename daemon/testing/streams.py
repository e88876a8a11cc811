"""Update streams made from a data graph, for the benchmarks (bench/replay_yeast.py, bench/cluster.py,
bench/kafka_e2e.py) and the tests that check them."""

from __future__ import annotations

import random
from pathlib import Path


def make_stream(data: Path, out: Path, seed: int) -> tuple[Path, Path, int, int]:
    """A mixed insert/delete stream made from the data graph `data` (seeded): 8% of its edges are held
    back and inserted, 4% of the rest are deleted, in one shuffled order; the graph before it is
    `data` without the held-back edges. (g0 file, stream file, insertions, deletions) in `out`."""
    lines = data.read_text().splitlines()
    vertices = [line for line in lines if line.startswith("v ")]
    edges = [line for line in lines if line.startswith("e ")]
    rng = random.Random(seed)
    rng.shuffle(edges)
    held = len(edges) * 8 // 100
    inserts, kept = edges[:held], edges[held:]
    deletes = rng.sample(kept, len(kept) * 4 // 100)
    stream = [line for line in inserts] + ["-" + line for line in deletes]
    rng.shuffle(stream)
    g0, st = out / "g0.graph", out / "stream.txt"
    g0.write_text("\n".join(vertices + kept) + "\n")
    st.write_text("\n".join(stream) + "\n")
    return g0, st, len(inserts), len(deletes)


def in_rounds(lines: list[str], rounds: int) -> list[str]:
    """`lines` (edge insertions and deletions, each edge at most once), then its undoing, then
    itself again, ..., `rounds` rounds in all; every round after the first in a shuffled order
    (seeded by its number), so that each update is matched against a graph it changes."""
    undo = [ln[1:] if ln.startswith("-") else "-" + ln for ln in lines]
    out = list(lines)
    for r in range(1, rounds):
        this = list(undo if r % 2 else lines)
        random.Random(r).shuffle(this)
        out += this
    return out
