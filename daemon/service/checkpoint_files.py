"""Checkpoints: the live graph, the registered queries and the input offsets, written atomically.

A checkpoint is a folder `ckpt-<seq>` holding vertices.arrow (every vertex id
in internal order, with its label and whether it is alive), edges.arrow (the
live edges in internal ids) and state.json (sequence number, offsets, queries).
Internal ids are kept so that a restored daemon orders matches, and so numbers
deltas, exactly as the daemon that wrote it. The folder is written under a
temporary name, synced, and renamed; CURRENT names the newest one and is itself
replaced by a rename, so a crash at any moment leaves the previous checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from csmd.errors import CsmdError
from csmd.model.formats import table_edge_ts
from csmd.model.graph import Graph
from csmd.pipeline.stages import GraphState

FORMAT_VERSION = 1


@dataclass
class Checkpoint:
    graph: Graph  # every vertex, internal order; retired ones have no edges
    retired: np.ndarray  # bool per vertex
    state: dict  # seq, input offsets, control offset, queries, removed


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_table(table: pa.Table, path: Path) -> None:
    with ipc.new_file(str(path), table.schema) as w:
        w.write_table(table)
    _fsync(path)


def write_checkpoint(directory, graph: GraphState, state: dict, keep: int = 2, floor: int | None = None) -> Path:
    """Write the graph (a pipeline's graph_state()) with `state`; returns the checkpoint folder.
    The newest `keep` stay, and with a `floor` (a cluster's lowest shard progress) the newest at
    or below it too: an instance restarts from one it can re-match every shard from."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    seq = int(state["seq"])
    final = root / f"ckpt-{seq:015d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{seq:015d}-{os.getpid()}-", dir=root))  # no other writer's
    _write_table(pa.table({
        "id": pa.array(graph.ext_ids, pa.string() if graph.str_ids else pa.int64()),  # an empty one keeps its kind
        "label": pa.array(graph.labels, pa.int32()),
        "alive": pa.array(graph.alive),
    }), tmp / "vertices.arrow")
    # a directed graph's edges are its arcs, and its schema says so (a restore under another [graph]
    # directed stops: read_local)
    # under event time each edge's ts too (null: none), and the largest ts applied
    _write_table(pa.table({"src": pa.array(graph.src, pa.int64()), "dst": pa.array(graph.dst, pa.int64()),
                           "label": pa.array(graph.elabel, pa.int32()),
                           **({} if graph.edge_ts is None else {"ts": graph.edge_ts})},
                          metadata={"directed": "true"} if graph.directed else None), tmp / "edges.arrow")
    if graph.edge_ts is not None:
        state = {**state, "high_ts": graph.high_ts}
    (tmp / "state.json").write_text(json.dumps({"format": FORMAT_VERSION, **state}, indent=1))
    _fsync(tmp / "state.json")
    _fsync(tmp)
    if final.exists():  # the same sequence number again (nothing happened since): replace it
        shutil.rmtree(final)
    os.rename(tmp, final)
    current = root / "CURRENT.tmp"
    current.write_text(final.name + "\n")
    _fsync(current)
    os.replace(current, root / "CURRENT")
    _fsync(root)
    older = sorted(root.glob("ckpt-*"))[:-keep]
    if floor is not None:
        below = [p for p in older if _input_offset(p) is not None and _input_offset(p) <= floor]
        older = [p for p in older if p not in below[-1:]]
    for old in older:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _input_offset(folder: Path) -> int | None:
    """Where a checkpoint resumes the input (its one partition's offset); None if unreadable."""
    try:
        return int(json.loads((folder / "state.json").read_text())["offsets"].get("0", 0))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _read_one(folder: Path) -> Checkpoint:
    state = json.loads((folder / "state.json").read_text())
    if state.get("format") != FORMAT_VERSION:
        raise CsmdError(f"{folder}: checkpoint format {state.get('format')!r}, this csmd reads {FORMAT_VERSION}")
    verts = ipc.open_file(str(folder / "vertices.arrow")).read_all()
    edges = ipc.open_file(str(folder / "edges.arrow")).read_all()
    ids = verts.column("id").to_numpy(zero_copy_only=False)
    directed = (edges.schema.metadata or {}).get(b"directed") == b"true"
    src, dst = edges.column("src").to_numpy(), edges.column("dst").to_numpy()
    g = Graph.from_edges(verts.column("label").to_numpy(), src, dst, edges.column("label").to_numpy(), ids, directed)
    if "ts" in edges.column_names:  # written under event time: the clock restarts from them and high_ts
        g.edge_ts = table_edge_ts(edges, ids[src], ids[dst], folder / "edges.arrow")
        g.high_ts = state.get("high_ts")
    return Checkpoint(g, ~verts.column("alive").to_numpy(zero_copy_only=False), state)


def read_checkpoint(directory, log=None, at_most: int | None = None) -> Checkpoint | None:
    """The newest readable checkpoint in `directory`, or None if it holds none; with `at_most`,
    the newest that resumes the input at or below that offset.

    A damaged newest checkpoint is reported and the one before it is used.
    """
    root = Path(directory)
    if not root.is_dir():
        return None
    names = sorted((p.name for p in root.glob("ckpt-*")), reverse=True)
    current = (root / "CURRENT").read_text().strip() if (root / "CURRENT").exists() else None
    if current in names:  # the one the last finished write named comes first
        names.remove(current)
        names.insert(0, current)
    if at_most is not None:
        names = [n for n in names if (o := _input_offset(root / n)) is not None and o <= at_most]
    for name in names:
        try:
            return _read_one(root / name)
        except (OSError, ValueError, KeyError, pa.ArrowInvalid, CsmdError) as exc:
            if log is not None:
                log.error("checkpoint unreadable, trying an older one", checkpoint=str(root / name), reason=str(exc))
    return None
