"""`csmd` with its stages timed, for bench/cluster.py --stages: where an instance's time goes.

    python bench/stage_timers.py DIR run --config NAME.toml

Wraps the methods that make up each stage (the daemon's code is unchanged) and adds up,
per stage, the calls, wall seconds and CPU seconds of the calling thread. Only what
happens after the first input record arrives counts: start-up (numba's cache, the warm-up
stream, joining the group) is not the stream's. At exit it writes them to DIR/NAME.json, with
the times (time.time()) of the timeline's events. The timers cost some microseconds a
call; the most frequent is the consume loop's, once per poll.

Stages, by what a cluster does with them:
- replicated (every instance does all of it): fetch (the input client's poll: its records as
  Python objects), consume (decode a poll's records, hand them on), sequence, apply;
- split (only the owner of a (record, query) shard): match (the engine's search of the
  ops selected: wall seconds of submitting it and of waiting for it, the engine's thread
  pool does the work), search (that work: CPU seconds of the compiled engine's threads), canonical (the deltas in their order), publish (Arrow encoding, producing) and
  acks (the producer's delivery reports): only owned records have deltas;
- cluster bookkeeping: select (which ops are this instance's, the batches kept for
  re-matches), sync (read every shard's progress, commit the live ones), poll (the group
  protocol).
"""

from __future__ import annotations

import atexit
import functools
import json
import sys
import threading
import time
from pathlib import Path

from csmd.cli import main
from csmd.connectors.kafka import KafkaSink, KafkaSource
from csmd.cpu.compiled import CompiledEngine, _Search
from csmd.cpu.numpy_engine import CpuEngine
from csmd.pipeline.sequencer import Sequencer
from csmd.pipeline.shards import ShardWork
from csmd.pipeline.stages import Pipeline
from csmd.service.cluster import ClusterMember
from csmd.service.consume import ConsumeLoop
from csmd.service.publish import Publisher

try:  # the GPU engine's searches too, where CuPy is installed
    from csmd.gpu.engine import GpuEngine
    GPU_MATCH = [(GpuEngine, "submit")]
except ImportError:
    GPU_MATCH = []

STAGES = {  # stage -> the methods whose time is its time
    "fetch": [(KafkaSource, "poll")],
    "consume": [(ConsumeLoop, "_take")],
    "sequence": [(Sequencer, "sequence")],
    "apply": [(CpuEngine, "apply")],
    "match": [(CompiledEngine, "submit"), (CpuEngine, "submit"), (_Search, "result"), *GPU_MATCH],
    "search": [(CompiledEngine, "_match")],  # a chunk of a search, on the engine's threads
    "canonical": [(Pipeline, "_deltas")],
    "publish": [(Publisher, "publish")],
    "acks": [(KafkaSink, "poll")],
    "select": [(ShardWork, "select")],
    "sync": [(ClusterMember, "sync")],
    "poll": [(ClusterMember, "poll")],
}

_timers: dict[str, list] = {}  # stage -> [calls, wall s, cpu s, the longest call's wall s]
_events: dict[str, float] = {}
_lock = threading.Lock()
_inside = threading.local()  # a stage's method calling another of the same stage counts once


def _timed(stage: str, f):
    @functools.wraps(f)
    def timed(*args, **kwargs):
        if "first record" not in _events or getattr(_inside, stage, False):
            return f(*args, **kwargs)
        setattr(_inside, stage, True)
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return f(*args, **kwargs)
        finally:
            wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
            setattr(_inside, stage, False)
            with _lock:
                t = _timers.setdefault(stage, [0, 0.0, 0.0, 0.0])
                t[0] += 1
                t[1] += wall
                t[2] += cpu
                t[3] = max(t[3], wall)
    return timed


def _pairs(part) -> int:
    """The (op, query) pairs a pipeline Part selects (none without one)."""
    if part is None:
        return 0
    if part.edges is None:
        return (len(part.work.edge_seq) + len(part.work.vertex_seq)) * len(part.queries)
    return int(part.edges.sum() + part.vertices.sum())


def _install() -> None:
    for stage, methods in STAGES.items():
        for cls, name in methods:
            setattr(cls, name, _timed(stage, cls.__dict__[name]))
    take, output, sync = ConsumeLoop._take, Pipeline._output, ClusterMember.sync

    def first_record(self, records):
        if not records:
            return take(self, records)
        _events.setdefault("first record", time.time())
        take(self, records)
        _events["last record"] = time.time()

    def batch_out(self, item, on_result):
        output(self, item, on_result)
        if isinstance(item, tuple) and "first record" in _events:  # a batch, not a marker
            _events["last batch out"] = time.time()
            with _lock:
                t = _timers.setdefault("ops matched", [0, 0, 0])
                t[0] += 1  # batches
                t[1] += item[0].records
                t[2] += _pairs(item[2])

    def committed(self, done, end):
        sync(self, done, end)
        if self.live and "first record" in _events:  # when the progress of its shards first reached each offset
            _events.setdefault(f"committed {min(self.progress.get(s, -1) for s in self.live)}", time.time())

    ConsumeLoop._take, Pipeline._output, ClusterMember.sync = first_record, batch_out, committed


def _write(path: str) -> None:
    with open(path, "w") as f:
        json.dump({"stages": _timers, "events": _events}, f)


if __name__ == "__main__":
    _install()
    atexit.register(_write, str(Path(sys.argv[1]) / (Path(sys.argv[sys.argv.index("--config") + 1]).stem + ".json")))
    sys.exit(main(sys.argv[2:]))
