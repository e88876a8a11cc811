"""Where a starting daemon resumes: the newest checkpoint, checked against the input topic, or the initial graph.

A checkpoint (or a committed group offset) beyond the end of the input topic means
the topic is not the one it was taken from: it was recreated, this is another
cluster, or the embedded broker restarted empty. Resuming there would skip every
new record without a word, so the daemon refuses to start, naming what disagrees;
`[checkpoint] on_mismatch = "rebuild"` starts over from `[graph] initial` and the
beginning of the topic instead.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from csmd.connectors.kafka import input_positions
from csmd.errors import CsmdError, missing
from csmd.model.formats import id_kind_conflict, initial_graph, parse_query_text, query_files
from csmd.model.graph import Graph
from csmd.service.checkpoint_files import read_checkpoint
from csmd.service.cluster import lowest_progress
from csmd.service.config import Config, label_names
from csmd.service.control import QuerySpec


@dataclass
class StartState:
    graph: Graph
    seq: int  # the next update's sequence number
    offsets: dict[int, int]  # input partition -> next offset to read
    specs: list[QuerySpec]
    committed: dict[int, int]  # the group's committed offsets (deltas below them were delivered)
    removed: set[str] = field(default_factory=set)  # queries removed through the control topic
    control_applied: int = -1  # the last control request the checkpoint includes
    retired: np.ndarray | None = None  # vertices of the checkpoint's graph that were deleted
    ends: dict[int, int] = field(default_factory=dict)  # input partition -> end offset at the start
    checkpoint: dict | None = None  # the state of the checkpoint restored


@dataclass
class LocalState:
    """What a start reads from local files, before any network: the newest checkpoint, the
    configured queries, and the initial graph where no checkpoint replaces it."""

    ckpt: object | None
    configured: list[QuerySpec]
    initial: Graph | None


def read_local(cfg: Config, log) -> LocalState:
    """The start's local files, each checked: a missing initial graph or a bad query file is
    reported as such at once, not after the broker check (which can wait 16 s and then blame
    Kafka)."""
    c = cfg.checkpoint
    configured = config_specs(cfg)
    initial = cfg.graph.initial
    if initial and not Path(initial).is_file():
        raise missing(initial)
    ckpt = read_checkpoint(c.dir, log) if c.dir else None
    conflict = id_kind_conflict(ckpt.graph, cfg.graph.ids, "[graph] ids") if ckpt is not None else None
    if ckpt is not None and ckpt.graph.directed != cfg.graph.directed:  # every arc would change meaning
        conflict = (f"[graph] directed is {str(cfg.graph.directed).lower()}, but the checkpoint holds "
                    f"{'a directed' if ckpt.graph.directed else 'an undirected'} graph")
    if conflict:  # every id of the setting's kind would be a dead letter from here on
        raise CsmdError(f"checkpoint in {c.dir}: {conflict} (remove the checkpoints to start over from "
                        f"[graph] initial and the beginning of the topic)")
    return LocalState(ckpt, configured, _initial(cfg) if ckpt is None else None)


def _initial(cfg: Config) -> Graph:
    """`[graph] initial`, or an empty graph of the `ids` kind where none is set."""
    graph = cfg.graph
    return initial_graph(graph.initial, graph.ids, graph.max_id_bytes, "[graph] ids", label_names(cfg))


def start_state(cfg: Config, conf: dict, log, local: LocalState) -> StartState:
    t, c = cfg.topics, cfg.checkpoint
    ends, committed = input_positions(conf, t.input, cfg.kafka.group)
    ckpt = local.ckpt
    offsets = {int(p): o for p, o in ckpt.state["offsets"].items()} if ckpt is not None else {}
    where = f"topic {t.input!r}"
    problems = [f"{where} partition {p}: the checkpoint resumes at offset {o}, the topic ends at {ends.get(p, 0)}"
                for p, o in sorted(offsets.items()) if o > ends.get(p, 0)]
    if ckpt is not None and ckpt.state.get("input", t.input) != t.input:
        problems.append(f"the checkpoint was taken from topic {ckpt.state['input']!r}, the input is {t.input!r}")
    stale = {p: o for p, o in committed.items() if o > ends.get(p, 0)}
    problems += [f"{where} partition {p}: group {cfg.kafka.group!r} committed offset {o}, the topic ends at "
                 f"{ends.get(p, 0)}" for p, o in sorted(stale.items())]
    if problems:
        if c.on_mismatch == "fail":
            raise CsmdError(f"{c.dir or 'the consumer group'} does not match the input (was the topic recreated, "
                            f"or is this another cluster?): {'; '.join(problems)}. Set [checkpoint] on_mismatch = "
                            f"\"rebuild\" to start over from [graph] initial and the beginning of the topic")
        log.warning("checkpoint and offsets do not match the input: starting over", problems=problems)
        if ckpt is not None:
            discard_checkpoints(c.dir)
            ckpt = None
        committed = {p: o for p, o in committed.items() if p not in stale}
    configured = local.configured
    if ckpt is not None and cfg.cluster.enabled:
        ckpt = _below_every_shard(cfg, conf, ckpt, log)
    if ckpt is None:
        g0 = local.initial if local.initial is not None else _initial(cfg)  # a dropped checkpoint's case
        log.info("starting from the initial graph", vertices=g0.n, edges=g0.num_edges, queries=len(configured))
        return StartState(g0, 0, {}, configured, committed, ends=ends)
    state = ckpt.state
    offsets = {int(p): o for p, o in state["offsets"].items()}  # a cluster's may be an older one's
    specs = [QuerySpec(**q) for q in state["queries"]]
    known = {s.name for s in specs} | set(state["removed"])
    specs += [s for s in configured if s.name not in known]
    log.info("restored checkpoint", seq=state["seq"], offsets=offsets, queries=len(specs))
    control_applied = state["control_applied"]
    if state.get("control", t.control) != t.control:  # its offset is one of another topic's
        log.warning("the control topic is not the checkpoint's: its requests are read from its start",
                    checkpoint=state["control"], control=t.control)
        control_applied = -1
    return StartState(ckpt.graph, int(state["seq"]), offsets, specs, committed, set(state["removed"]),
                      control_applied, ckpt.retired, ends, state)


def _below_every_shard(cfg: Config, conf: dict, ckpt, log):
    """A cluster instance's checkpoint: the newest at or below every shard's progress (None: none
    is, so it rebuilds from [graph] initial). From a newer one it could not re-match a shard it
    gains from that shard's progress: the records in between would never be matched."""
    floor = lowest_progress(conf, cfg)
    if int(ckpt.state["offsets"].get("0", 0)) <= floor:
        return ckpt
    older = read_checkpoint(cfg.checkpoint.dir, log, at_most=floor)
    log.info("the newest checkpoint is past the lowest shard progress: restoring one below it" if older else
             "every checkpoint is past the lowest shard progress: rebuilding from the initial graph",
             checkpoint_offset=ckpt.state["offsets"].get("0", 0), lowest_progress=floor,
             restored_offset=older.state["offsets"].get("0", 0) if older else None)
    return older


def config_specs(cfg: Config) -> list[QuerySpec]:
    """The queries of `[queries] paths`, each checked (a bad file stops the start with its line)."""
    paths = cfg.queries.paths
    specs = []
    for p in query_files(paths) if paths else []:
        text = Path(p).read_text(encoding="utf-8", errors="replace")
        parse_query_text(text, str(p), label_names(cfg))
        specs.append(QuerySpec(p.stem, text, cfg.queries.count_only, cfg.queries.distinct))
    return specs


def discard_checkpoints(directory) -> None:
    """Remove every checkpoint in `directory` (they belong to another topic)."""
    root = Path(directory)
    for old in list(root.glob("ckpt-*")) + list(root.glob(".tmp-*")):
        shutil.rmtree(old, ignore_errors=True)
    (root / "CURRENT").unlink(missing_ok=True)
