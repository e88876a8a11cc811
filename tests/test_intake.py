"""The daemon's intake in chunks gives what it gives record by record: a poll's plain one-update
records decoded together into blocks (plain_runs), handed to the pipeline one block at a time
and booked in one step (DeliveryTracker.submitted_run), against decode_updates and submitted
called for each record, the independent truth."""

from __future__ import annotations

import random

import numpy as np
import pytest

from csmd.connectors import records as records_module
from csmd.connectors.records import BadRecord, Polled, Record, RecordBlock, decode_updates, plain_runs
from csmd.model.formats import UpdateBlock
from csmd.service.config import load_config
from csmd.service.consume import ConsumeLoop
from csmd.service.context import DaemonContext, Intake
from csmd.service.control import ControlPlane, Queries
from csmd.service.delivery import DeliveryTracker
from csmd.logs import get_logger
from csmd.service.publish import DeadLetters

from helpers import ODD, PLAIN

# records a stream file never has: one plain line with line breaks or blanks around it (one update, named
# by its record, as decode_updates names a record's only update), several lines, JSON, declared types
AROUND = ["e {a} {b}\n", "e {a} {b}\r\n", "e {a} {b}\r", " e {a} {b} ", "\ne {a} {b}", "e {a} {b}\n\n"]
# records of several lines: plain ones (their updates named by record and line, blanks and comments counted)
# and ones another line break, a bad line or JSON leaves to decode_updates
MULTI = ["e {a} {b}\ne {b} {a}", "e {a} {b}\n# note", "e {a} {b}\r\n\r\n-e {b} {a} {l}\r\n", "# h\n\nv {a} {l}\n-v {b}\n",
         "\te {a} {b}\n  \n e {b} {a} {l}\ne {a} {a}\n", "e {a} {b}\n-e {a} {b}\ne {a} {b}"]
NOT_PLAIN = ["e {a} {b}\x1c", "{{\"op\": \"e\", \"u\": {a}, \"v\": {b}}}", "e {a} {b}\re {b} {a}", "e {a} {b}\x0be {b} {a}",
             "# \u2028e {a} {b}\ne {b} {a}", "e {a} {b}\nx {a} {b}", "e {a} {b}\ne {a}", "# only\n# comments\n", "\n\n"]
TYPES = [None, None, None, [("content-type", b"text/plain")], [("content-type", b"application/json")]]


def random_records(rng: random.Random, n: int, first: int = 0) -> list[Record]:
    out = []
    for off in range(first, first + n):
        r = rng.random()
        pick = rng.choice(ODD + NOT_PLAIN) if r < 0.1 else rng.choice(MULTI + AROUND) if r < 0.3 else \
            "\n".join(rng.choice(PLAIN) for _ in range(rng.randrange(2, 6))) if r < 0.4 else rng.choice(PLAIN)
        ids = [rng.choice([rng.randrange(50), -rng.randrange(1, 10**18)]) for _ in range(2)]
        value = pick.format(a=ids[0], b=ids[1], l=rng.randrange(3)).encode("utf-8", "surrogateescape")
        headers = rng.choice(TYPES) if rng.random() < 0.1 else None
        out.append(Record("in", 0, off, value, list(headers or [])))
    return out


def polled(records: list[Record]) -> Polled:
    """The records as the Kafka source hands a poll over (headers as the client gives them)."""
    return Polled(records[0].input if records else "", [r.partition for r in records], [r.offset for r in records],
                  [r.value for r in records], [list(r.headers) or None for r in records])


def one_by_one(recs: list[Record], fmt: str = "auto", str_ids: bool = False) -> list:
    """Each record's updates (op, u, v, label, source, origin), or its offset and reason when refused."""
    out = []
    for rec in recs:
        try:
            out.extend(decode_updates(rec, fmt, str_ids))
        except BadRecord as exc:
            out.append((rec.offset, str(exc)))
    return out


def expanded(items, fmt: str = "auto", str_ids: bool = False) -> list:
    out = []
    for it in items:
        out.extend(it.updates() if isinstance(it, UpdateBlock) else one_by_one([it], fmt, str_ids))
    return out


@pytest.mark.parametrize("seed", range(10))
def test_plain_runs_decode_every_record_as_decode_updates_does(seed):
    rng = random.Random(seed)
    recs = random_records(rng, rng.randrange(1, 300), first=rng.randrange(10**6))
    items = list(plain_runs(polled(recs)))
    assert expanded(items) == one_by_one(recs)  # the same Updates, sources and origins, the same refusals
    assert [r.offset for it in items for r in ([it] if isinstance(it, Record) else [])] == \
        [r.offset for r in recs if not any(isinstance(it, RecordBlock) and r.offset in it.lineno for it in items)]
    assert any(isinstance(it, RecordBlock) for it in items)
    assert any(isinstance(it, RecordBlock) and it.part is not None for it in items), "records of several updates"


def test_what_is_not_plain_lines_is_left_to_decode_updates():
    recs = [Record("in", 0, i, p.format(a=5, b=6, l=1).encode("utf-8", "surrogateescape"))
            for i, p in enumerate(ODD + NOT_PLAIN + ["", "  ", "# note"])]
    recs += [Record("in", 0, 99, b"e 1 2", [("content-type", b"text/plain")])]  # declared: decode_updates decides
    items = list(plain_runs(polled(recs)))
    assert items == recs


@pytest.mark.parametrize("fmt, str_ids", [("json", False), ("arrow", False), ("auto", True)])
def test_no_blocks_where_the_format_or_the_ids_say_otherwise(fmt, str_ids):
    recs = random_records(random.Random(1), 50)
    items = list(plain_runs(polled(recs), fmt, str_ids))
    assert items == recs
    assert expanded(items, fmt, str_ids) == one_by_one(recs, fmt, str_ids)


def test_without_numba_every_record_is_decoded_alone(monkeypatch):
    monkeypatch.setattr(records_module, "scan_records", None)  # what the import leaves without numba
    recs = random_records(random.Random(2), 50)
    assert list(plain_runs(polled(recs))) == recs


# ---- delivery -------------------------------------------------------------------------------------------
def test_a_run_is_booked_as_its_records_one_by_one():
    rng = random.Random(4)
    for _ in range(30):
        runs, single = DeliveryTracker(), DeliveryTracker()
        n = r = 0  # updates, records
        record_of = []  # each update's record
        while n < 60:
            k = rng.randrange(1, 8)
            per = [1] * k if rng.random() < 0.5 else [rng.randrange(1, 4) for _ in range(k)]
            if rng.random() < 0.5:
                runs.submitted_run("in", 0, list(range(r, r + k)), None if set(per) == {1} else np.array(per))
            else:
                for o, m in zip(range(r, r + k), per):
                    runs.submitted(("in", 0, o), m)
            for o, m in zip(range(r, r + k), per):
                single.submitted(("in", 0, o), m)
            record_of += [o for o, m in zip(range(r, r + k), per) for _ in range(m)]
            n, r = n + sum(per), r + k
        executed, outstanding = 0, []
        while executed < n or outstanding:
            if executed < n and (not outstanding or rng.random() < 0.5):
                step = rng.randint(1, n - executed)
                covered = [("in", 0, o) for o in sorted(set(record_of[executed:executed + step]))
                           if rng.random() < 0.3]  # records of the updates executed, still pending
                for t in (runs, single):
                    t.sending(covered)
                    t.executed(step)
                outstanding.append(covered)
                executed += step
            else:
                acked = outstanding.pop(rng.randrange(len(outstanding)))
                for t in (runs, single):
                    t.acked(acked)
            assert runs.pending() == single.pending() and runs.committable() == single.committable()
        assert runs.committable() == {("in", 0): r}


# ---- the consume loop's hand-off ------------------------------------------------------------------------
class _Source:
    partitions = [0]


class _Sink:
    transactional = False

    def __init__(self):
        self.dead = []

    def produce(self, topic, value, key, headers, on_ack, origins):
        headers = dict(headers)
        self.dead.append((int(headers["csmd-offset"]), headers["csmd-error"].decode()))


def _daemon() -> ConsumeLoop:
    """The daemon's consume loop over fakes of the input and the sink, with its own control plane and dead letters."""
    cfg = load_config(None, env={"CSMD_TOPICS__INPUT": "in"})  # the records' input: their dead letters are tracked
    ctx, sink, tracker, intake, offsets, queries = DaemonContext(cfg, get_logger()), _Sink(), DeliveryTracker(), \
        Intake(), {}, Queries()
    handed = []
    intake.put = lambda item, put=intake.put: (handed.append(item), put(item))
    dead = DeadLetters(ctx, sink, tracker, {}).send
    control = ControlPlane(ctx, None, sink, queries, intake, offsets, dead, {}, in_cluster=False)
    d = ConsumeLoop(ctx, _Source(), sink, tracker, intake, None, queries, offsets, {}, None, control, None, dead, None,
                    str_ids=False)
    d.handed = handed
    return d


def handed_updates(items) -> list:
    return [u for it in items for u in (it.updates() if isinstance(it, UpdateBlock) else [it])]


def test_a_poll_is_handed_on_in_order_one_block_per_run_and_every_record_is_pending():
    d = _daemon()
    rng = random.Random(6)
    polls, off = [], 0
    for _ in range(5):  # offsets continue from poll to poll
        polls.append(random_records(rng, rng.randrange(1, 200), first=off))
        off += len(polls[-1])
    for p in polls:
        d._take(polled(p))
    every = [r for p in polls for r in p]
    truth = one_by_one(every)
    updates = [u for u in truth if not isinstance(u, tuple)]
    assert handed_updates(d.handed) == updates  # stream order, the same Updates
    assert d.sink.dead == [u for u in truth if isinstance(u, tuple)]  # refused records, with their reasons
    blocks = [it for it in d.handed if isinstance(it, RecordBlock)]
    assert blocks and len(d.handed) == len(blocks) + sum(not isinstance(it, RecordBlock) for it in d.handed)
    assert sum(len(b) for b in blocks) > len(d.handed) - len(blocks)  # most updates went in blocks
    # backpressure counts records, however they were handed on: every one is pending until done
    assert d.tracker.pending() == len(every)
    assert d.next_offsets == {0: off}


def test_while_replayed_changes_wait_every_record_goes_alone():
    d = _daemon()
    d.control.scheduled = [object()]  # a replayed control change not yet due
    d.control.release_scheduled = lambda rec: None
    recs = random_records(random.Random(7), 40)
    d._take(polled(recs))
    assert not any(isinstance(it, RecordBlock) for it in d.handed)
    assert handed_updates(d.handed) == [u for u in one_by_one(recs) if not isinstance(u, tuple)]


# ---- start-up ---------------------------------------------------------------------------------------
def test_after_the_output_warm_up_the_first_batch_loads_no_module():
    """Whatever the first publish would import or compile on first use (pyarrow's lazy imports,
    pandas where it is installed, the compiled column fills: numba compiles them, or loads them
    from its cache) is done by warm_output at start, not in the first batch's latency: a batch of
    two records with count-only and materialised deltas."""
    import subprocess
    import sys

    code = """
import sys
import numpy as np
from csmd.connectors.kafka import arrow_messages
from csmd.engine import QueryDeltas, UpdateBatch
from csmd.model.formats import Update
from csmd.model.graph import Graph
from csmd.pipeline.deltas import DeltaEncoder
from csmd.pipeline.sequencer import Vertices
from csmd.pipeline.stages import BatchResult
from csmd.service.daemon import warm_output
vertices = Vertices(Graph.from_edges([0] * 4, [0, 1, 2], [1, 2, 3], [0] * 3))
warm_output(vertices, 1 << 20)
before = set(sys.modules)
import numba.core.dispatcher as nd
compiled, compile = [], nd.Dispatcher.compile
nd.Dispatcher.compile = lambda self, sig: compiled.append(self.py_func.__name__) or compile(self, sig)
z = np.zeros(0, np.int64)
seq = np.array([5, 6], np.int64)
batch = UpdateBatch(5, 7, z, z, z, z, z, z, z, z, np.zeros(0, np.int32), 4,
                    {5: Update("e", 0, 1, 0, "in/0/9", ("in", 0, 9)), 6: Update("e", 1, 2, 0, "in/0/10", ("in", 0, 10))},
                    np.zeros(2), 2)
deltas = [QueryDeltas("Q_%d" % q, seq, np.array([1, -1], np.int8), None, 3, 2, np.array([3, 2])) for q in range(3)]
deltas.append(QueryDeltas("rows", np.array([5, 5, 6]), np.array([1, 1, -1], np.int8),
                          np.array([[0, 1, 2], [1, 2, 3], [3, 2, 1]], np.int32), 2, 1))
for _q, rb, _o in DeltaEncoder(vertices).encode(BatchResult(batch, deltas, 0.0)):
    rb.column("sign").to_numpy()
    arrow_messages(rb, 1 << 20)
print(sorted(set(sys.modules) - before - {"numba.core.dispatcher"}), sorted(compiled))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[] []"
