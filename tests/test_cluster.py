"""Scale-out: the matching split over shards, re-matches of gained shards, and several daemons through Kafka.

Truth: `csmd replay` of the same stream (its own tests check it against brute force).
The pipeline-level tests run mixed insert/delete streams in one process; the daemon
tests run several `csmd run` processes on one embedded broker.
"""

from __future__ import annotations

import random
import signal
import threading
import time
import uuid
from collections import Counter

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from confluent_kafka import Consumer, TopicPartition

from csmd.cli.replay import file_updates
from csmd.connectors.files import FileSource
from csmd.engines import continuous_engine
from csmd.model.formats import read_graph, read_query
from csmd.pipeline.deltas import DeltaEncoder
from csmd.pipeline.shards import ShardChange, ShardWork, shard_of
from csmd.pipeline.stages import Pipeline

from kafka_harness import QUIET, DaemonProcess, Topics, config_text, human_lines, kill_leftovers, new_admin_port
from test_continuous import make_case, run_replay
from test_kafka_daemon import QUERIES, dedup, reference, rows_of  # noqa: F401 (reference is a fixture)

ID = ("query", "seq", "sign", "vertices", "input", "partition", "offset", "index")


def deltas_with_ids(table: pa.Table) -> Counter:
    return Counter(zip(*(map(tuple, v) if c == "vertices" else v
                         for c, v in ((c, table.column(c).to_pylist()) for c in ID))))


# ---- the pipeline: shards and re-matches, no Kafka ---------------------------------------------
def sharded_run(tmp_path, qpaths, shards: int, plan, batch_size: int) -> Counter:
    """The stream through one pipeline whose ShardChanges come from `plan`: (offset, change) pairs,
    each placed before the record at that offset. Returns its deltas with their ids."""
    g0 = read_graph(tmp_path / "g0.graph")
    pipe = Pipeline(g0, engine=continuous_engine("cpu", g0), batch_size=batch_size, executor_lag=2, queue_depth=4)
    for p in qpaths:
        pipe.add_query(p.stem, read_query(p))
    pipe.shards = ShardWork(shards, 0, 0)
    encoder = DeltaEncoder(pipe.vertices)
    tables = []

    def source():
        due = sorted(plan, key=lambda x: x[0])
        for u in file_updates(FileSource(tmp_path / "stream.txt")):
            while due and u.origin[2] >= due[0][0]:
                yield due.pop(0)[1]
            yield u

    def on_result(r):  # a batch's deltas, or a gain's re-match
        r = r.result if isinstance(r, ShardChange) else r
        if r is not None:
            tables.extend(batch for _q, batch, _o in encoder.encode(r))

    pipe.run(source(), on_result)
    assert pipe.gc.released == 0  # the floor stayed at 0: the GC kept every version a re-match may read
    return deltas_with_ids(pa.Table.from_batches(tables, encoder.schema)) if tables else Counter()


@pytest.mark.parametrize("seed", range(6))
def test_shards_split_the_work_and_a_gained_shard_is_re_matched_exactly(tmp_path, seed):
    """Three owners of disjoint shards together publish exactly replay's deltas (ids included), each
    delta once; one owner that gains the rest mid-stream, from offset 0, publishes all of them alone:
    its re-match reads every earlier update at its own timestamp (mixed inserts and deletes)."""
    qpaths, _ = make_case(tmp_path, seed, steps=160)
    truth = deltas_with_ids(run_replay(tmp_path, qpaths, batch_size=7)[0])
    assert truth
    rng = random.Random(seed)
    shards, bs = 5, rng.choice([1, 3, 8])
    parts = [sharded_run(tmp_path, qpaths, shards, [(0, ShardChange({s: 0 for s in range(shards) if s % 3 == i}))],
                         bs) for i in range(3)]
    assert sum(parts, Counter()) == truth
    mid = rng.randrange(40, 120)
    alone = sharded_run(tmp_path, qpaths, shards, [(0, ShardChange({0: 0, 1: 0})),
                                                   (mid, ShardChange({2: 0, 3: 0, 4: 0}))], bs)
    assert alone == truth


@pytest.mark.parametrize("seed", range(6, 9))
def test_a_shard_handed_over_is_matched_once_on_each_side_of_its_progress(tmp_path, seed):
    """Shard 1 moves: the old owner loses it at offset `moved`; the new owner gained it earlier (at
    `gained`, lagging) with progress `moved`, or later (at `late`) with progress `moved`, re-matching
    the records in between. Either way the two together publish every delta exactly once."""
    qpaths, _ = make_case(tmp_path, seed, steps=150)
    truth = deltas_with_ids(run_replay(tmp_path, qpaths, batch_size=5)[0])
    moved = 90
    old = sharded_run(tmp_path, qpaths, 3, [(0, ShardChange({0: 0, 1: 0})), (moved, ShardChange({}, {1}))], 4)
    for at in (60, 120):
        new = sharded_run(tmp_path, qpaths, 3, [(0, ShardChange({2: 0})), (at, ShardChange({1: moved}))], 4)
        assert old + new == truth, at
        assert not set(old) & set(new), "no delta is published by both owners"


def test_shard_of_spreads_records():
    s = shard_of(0, range(12000), 12)
    assert set(s.tolist()) == set(range(12))
    assert Counter(s.tolist()).most_common()[-1][1] > 800  # every shard gets a fair share
    assert (shard_of(0, [5, 6], 12) == shard_of([0, 0], [5, 6], 12)).all()


def test_the_kept_window_follows_the_floor():
    """Batches (and the GC's versions) are kept back to the slowest shard's progress, no further."""
    from csmd.engine import UpdateBatch
    from csmd.model.formats import Update
    import numpy as np

    work = ShardWork(4, 0, 0)
    z = np.zeros(0, np.int64)
    for k in range(10):
        rec = Update("e", 1, 2, 0, "", ("in", 0, k))
        work.select(UpdateBatch(k, k + 1, np.array([k]), np.array([0]), np.array([1]), np.array([0]), np.array([1]),
                                z, z, z, np.zeros(0, np.int32), 2, {k: rec}, [], 1))
    assert (work.retained, work.hold_seq) == (10, 0)
    work.floor = 6
    work.select(UpdateBatch(10, 11, z, z, z, z, z, z, z, z, np.zeros(0, np.int32), 2,
                            {10: Update("e", 1, 2, 0, "", ("in", 0, 10))}, [], 1))
    assert (work.retained, work.hold_seq, work.kept_from) == (5, 6, 6)
    _batch, gaps = work.gain({0: 2, 1: 7})
    assert gaps == {0: 6}  # progress 2 is older than anything kept: reported, not silently skipped
