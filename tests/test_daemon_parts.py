"""The daemon's parts without a broker: config, record decoding, delivery bookkeeping, metrics, checkpoints."""

from __future__ import annotations

import json
import math
import random
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from csmd.service.checkpoint_files import read_checkpoint, write_checkpoint
from csmd.service.config import Config, load_config
from csmd.connectors.records import BadRecord, Record, decode_updates
from csmd.cpu.numpy_engine import CpuEngine
from csmd.service.delivery import DeliveryTracker
from csmd.errors import CsmdError
from csmd.latency import LatencyHistogram
from csmd.model.formats import Update, read_graph, read_updates
from csmd.service.metrics import Metrics
from csmd.pipeline.event_time import EventTime
from csmd.pipeline.sequencer import IGNORED_REASONS
from csmd.pipeline.stages import Pipeline
from csmd.testing.kafka import HUMAN, metric, samples

from helpers import arrow_message


# ---- config ------------------------------------------------------------------------------------------
def test_config_layers_defaults_file_and_environment(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('[kafka]\nbootstrap = "b:1"\n[pipeline]\nbatch_size = 8\n[graph]\ninitial = "g.graph"\n'
                 '[checkpoint]\ninterval_s = 5\n')
    cfg = load_config(f, env={"CSMD_PIPELINE__BATCH_SIZE": "32", "CSMD_KAFKA__TRANSACTIONS": "yes",
                              "CSMD_QUERIES__PATHS": "a.graph, b.graph", "OTHER": "x"})
    assert cfg.kafka.bootstrap == "b:1"
    assert cfg.pipeline.batch_size == 32 and cfg.kafka.transactions is True
    assert cfg.queries.paths == ["a.graph", "b.graph"]
    assert cfg.graph.initial == str(tmp_path / "g.graph")  # relative to the file
    assert cfg.checkpoint.interval_s == 5.0
    assert cfg.topics == Config().topics


@pytest.mark.parametrize("text, env, message", [
    ('[kafka]\nbootstap = "x"\n', {}, "unknown key [kafka] bootstap (did you mean 'bootstrap'?)"),
    ('[kafak]\n', {}, "unknown section [kafak] (did you mean 'kafka'?)"),
    ('[pipeline]\nbatch_size = "64"\n', {}, "[pipeline] batch_size must be an integer"),
    ('[pipeline]\nbatch_size = 0\n', {}, "[pipeline] batch_size must be > 0"),
    ('[pipeline]\nthreads = -1\n', {}, "[pipeline] threads must be >= 0"),
    ('[pipeline]\ngpus = 0\n', {}, "[pipeline] gpus must be > 0"),
    ('[pipeline]\ngpus = "two"\n', {}, "[pipeline] gpus must be an integer or 'all', got 'two'"),
    ('', {"CSMD_PIPELINE__GPUS": "most"}, "CSMD_PIPELINE__GPUS: expected an integer or 'all', got 'most'"),
    ('[input]\nformat = "xml"\n', {}, "[input] format must be one of auto, arrow, json, text"),
    ('[kafka\n', {}, "not valid TOML"),
    ('', {"CSMD_PIPELINE__BATCH_SIZE": "many"}, "CSMD_PIPELINE__BATCH_SIZE: expected an integer"),
    ('', {"CSMD_NOPE__X": "1"}, "CSMD_NOPE__X: no setting [nope] x"),
    ('', {"CSMD_KAFKA__TRANSACTIONS": "maybe"}, "expected a boolean"),
    # settings that are wrong together (a chaos test's finds: a dead-letter topic that is the input
    # fed every refused record back in, forever)
    ('[topics]\ninput = "t"\ndead_letter = "t"\n', {}, "[topics] input and dead_letter are the same topic 't'"),
    ('[topics]\noutput = "csmd.updates"\n', {}, "[topics] input and output are the same topic"),
    ('', {"CSMD_TOPICS__CONTROL": "csmd.deltas"}, "CSMD_TOPICS__CONTROL: [topics] output and control are the same"),
    ('[topics]\ninput = ""\n', {}, "[topics] input must be a Kafka topic name"),
    ('[topics]\ncontrol = "a b"\n', {}, "[topics] control must be a Kafka topic name"),
    ('[topics]\nmax_message_bytes = 10\n', {}, "[topics] max_message_bytes must be at least 10000, got 10"),
    ('[pipeline]\nbatch_size = 99999999\n', {}, "[pipeline] batch_size (99999999) must not exceed max_batch (16384)"),
    ('[checkpoint]\ndir = "c.toml"\n', {}, "[checkpoint] dir"),
])
def test_config_errors_name_the_file_and_key(tmp_path, text, env, message):
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(CsmdError, match=None) as exc:
        load_config(f, env=env)
    assert message in str(exc.value)


def test_gpus_is_a_count_or_all(tmp_path):
    assert Config().pipeline.gpus == 1
    for text, want in (('gpus = 4', 4), ('gpus = "all"', "all")):
        (tmp_path / "c.toml").write_text(f"[pipeline]\n{text}\n")
        assert load_config(tmp_path / "c.toml", env={}).pipeline.gpus == want
    assert load_config(None, env={"CSMD_PIPELINE__GPUS": "all"}).pipeline.gpus == "all"
    assert load_config(None, env={"CSMD_PIPELINE__GPUS": "2"}).pipeline.gpus == 2


def test_shipped_configs_load():
    for path in (HUMAN.parents[1] / "configs").glob("*.toml"):
        load_config(path, env={})


def test_default_toml_lists_every_setting_of_the_typed_config_with_its_default():
    """configs/default.toml says it lists every setting with its default: key by key, both ways,
    against Config (the defaults the daemon runs with), value and TOML type alike."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    path = HUMAN.parents[1] / "configs" / "default.toml"
    written, typed = tomllib.loads(path.read_text()), Config().as_dict()
    for section, table in written.items():
        assert section in typed, f"default.toml has [{section}], the typed config has no such section"
        for key, value in table.items():
            assert key in typed[section], f"default.toml has [{section}] {key}, the typed config has no such setting"
            default = typed[section][key]
            assert value == default and type(value) is type(default), \
                f"[{section}] {key}: {value!r} in default.toml, {default!r} in the typed config"
    for section, table in typed.items():
        for key in table:
            assert key in written.get(section, {}), f"[{section}] {key} is missing from default.toml"
    assert load_config(path, env={}) == Config()


# ---- records -----------------------------------------------------------------------------------------
def _rec(value: bytes, headers=None) -> Record:
    return Record("in", 0, 7, value, list((headers or {}).items()))


def test_the_three_formats_decode_to_the_same_updates():
    want = [Update("e", 1, 2, 3), Update("-e", 1, 2, 0), Update("v", 9, -1, 4), Update("-v", 9, -1, 0)]
    text = b"e 1 2 3\n-e 1 2\nv 9 4\n-v 9\n"
    js = json.dumps([{"op": "e", "u": 1, "v": 2, "label": 3}, {"op": "-e", "u": 1, "v": 2},
                     {"op": "v", "u": 9, "label": 4}, {"op": "-v", "u": 9}]).encode()
    arrow = arrow_message(dict(op=["e", "-e", "v", "-v"], u=[1, 1, 9, 9], v=[2, 2, None, None],
                               label=[3, None, 4, None]))
    for value in (text, js, arrow):
        for fmt in ("auto", {text: "text", js: "json", arrow: "arrow"}[value]):
            got = decode_updates(_rec(value), fmt)
            assert [(u.op, u.u, u.v, u.label) for u in got] == [(w.op, w.u, w.v, w.label) for w in want]
            assert all(u.origin == ("in", 0, 7) for u in got)
    from csmd.schemas import updates_schema

    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, updates_schema()) as w:
        w.write_batch(pa.record_batch([pa.array(["e"]), pa.array([1]), pa.array([2]), pa.array([3], pa.int32()),
                                       pa.array([None], pa.int64())], schema=updates_schema()))
    assert [(u.op, u.u, u.v, u.label) for u in decode_updates(_rec(sink.getvalue().to_pybytes()))] == [("e", 1, 2, 3)]
    one = decode_updates(_rec(b"e 1 2"))[0]
    assert one.source == "in/0/7"
    # a text record's updates are named by line; a record with one update by the record alone
    assert [u.source for u in decode_updates(_rec(text))] == [f"in/0/7#{i}" for i in range(1, 5)]
    assert [u.source for u in decode_updates(_rec(b"# note\ne 1 2\n"))] == ["in/0/7"]


@pytest.mark.parametrize("value, fmt, headers, reason", [
    (b"", "auto", None, "empty record"),
    (b"\x00\xffgarbage", "auto", None, "not UTF-8 text"),
    (b"e 1", "auto", None, "wrong field count"),
    (b"e 1 2\nq 3 4", "auto", None, "line 2: unknown op 'q'"),
    (b'{"u": 1}', "auto", None, "field 'op' missing"),
    (b'{"op": "e", "u": 1, "v": "2"}', "auto", None, "record: vertex id '2' is not an integer"),
    (b'{"op": "e", "u": true, "v": 2}', "auto", None, "vertex id True is not an integer"),
    (b'{"op": "v", "u": 1}', "auto", None, "op 'v' needs a label"),
    (b'{"op": "e", "u": 1, "v": 2, "label": -1}', "auto", None, "label -1 is not an integer"),
    (b'{"op": "-v", "u": 7, "v": 8}', "auto", None, "record: op '-v' takes no v (got 8)"),
    (b"e 1_0 2", "auto", None, "bad integer '1_0' for vertex id"),  # Python's int() took these
    ("e \u0661 2".encode(), "auto", None, "bad integer"),
    (b"e 1 2 0x1", "auto", None, "bad integer '0x1' for edge label"),
    (b'[1, 2]', "auto", None, "expected a JSON object, got int"),
    (b'{"op": ', "auto", None, "not valid JSON"),
    (b"e 1 2", "json", None, "expected a json record, the bytes look like text"),
    (b"e 1 2", "auto", {"content-type": b"application/json"}, "expected a json record"),
    (b"e 1 2", "auto", {"content-type": b"image/png"}, "unknown content-type"),
    (b"\xff\xff\xff\xff\x10\x00", "auto", None, "not a readable Arrow IPC message"),
])
def test_bad_records_are_refused_with_a_reason(value, fmt, headers, reason):
    with pytest.raises(BadRecord) as exc:
        decode_updates(_rec(value, headers), fmt)
    assert reason in str(exc.value)


def test_bad_arrow_records():
    cases = [(arrow_message(dict(src=[1], dst=[2])), "missing column 'op'"),
             (arrow_message(dict(op=["e"], u=["a"], v=["b"])), "column 'u' is string, expected integer"),
             (arrow_message(dict(op=[1], u=[1], v=[2])), "column 'op' is int64, expected string"),
             (arrow_message(dict(op=["e", "x"], u=[1, 1], v=[2, 3])), "row 1: unknown op 'x'"),
             (arrow_message(dict(op=["e"], u=[1], v=[None])), "row 0: op 'e' needs u and v")]
    for value, reason in cases:
        with pytest.raises(BadRecord) as exc:
            decode_updates(_rec(value))
        assert reason in str(exc.value)
    assert decode_updates(_rec(arrow_message(dict(op=["e"], u=["a"], v=["b"]))), str_ids=True)[0].u == "a"


def test_a_graph_keyed_by_strings_reads_the_ids_of_every_format_as_strings():
    """Text records too: their tokens as written (they were refused; replay read them as integers)."""
    want = [("e", "a", "7", 2), ("-v", "x", -1, 0)]
    for value in (b"e a 7 2\n-v x", json.dumps([{"op": "e", "u": "a", "v": "7", "label": 2},
                                                 {"op": "-v", "u": "x"}]).encode(),
                  arrow_message(dict(op=["e", "-v"], u=["a", "x"], v=["7", None], label=[2, None]))):
        assert [(u.op, u.u, u.v, u.label) for u in decode_updates(_rec(value), str_ids=True)] == want
    with pytest.raises(BadRecord, match="bad integer 'a'"):
        decode_updates(_rec(b"e a 7"))


def _arrow_batch(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.getvalue().to_pybytes()


def test_records_that_make_the_parsers_fail_are_refused_not_fatal():
    """What a chaos test found: each of these raised past the decoder (the daemon exited, and again
    on every restart, the record still uncommitted) or crashed the process (unchecked offsets)."""
    good = arrow_message(dict(op=["e"], u=[1], v=[2]))
    flipped = bytearray(good)
    at = flipped.index(b"\x00\x00\x00\x00\x01\x00\x00\x00e")
    flipped[at + 7] = 14  # the op column's offsets [0, 1] -> [0, 0x0E000001]: past its data
    not_utf8 = pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(np.array([0, 2], np.int32).tobytes()),
                                                      pa.py_buffer(b"\xff\xfe")])
    cases = [
        (b"[" * 100_000 + b"]" * 100_000, "RecursionError"),
        (b'{"op": "e", "u": 1' + b"9" * 5000 + b', "v": 2}', "ValueError"),
        (_arrow_batch(pa.RecordBatch.from_arrays([pa.array(["e"]), pa.array([1]), pa.array([2]), pa.array(["e"])],
                                                 names=["op", "u", "v", "op"])), "column(s) op more than once"),
        (_arrow_batch(pa.record_batch({"op": not_utf8, "u": pa.array([1]), "v": pa.array([2])})), "Arrow"),
        (bytes(flipped), "Arrow"),
    ]
    for value, reason in cases:
        with pytest.raises(BadRecord) as exc:
            decode_updates(_rec(value))
        assert reason in str(exc.value) and len(str(exc.value)) < 2000
    assert decode_updates(_rec(good))[0].v == 2


# ---- delivery -------------------------------------------------------------------------------------------
def test_offsets_commit_only_past_records_whose_deltas_are_all_acknowledged():
    done, sent = [], []
    t = DeliveryTracker(on_done=lambda arrived, had: (done.extend(arrived), sent.extend(had)))
    o = [("in", 0, i) for i in range(5)]
    t.submitted(o[0], 2, arrived=0.0)
    t.submitted(o[1], 1, arrived=1.0)
    t.submitted(o[2], 0, sends=1, arrived=2.0)  # a dead letter: done once its own record is acknowledged
    t.submitted(o[3], 1, arrived=3.0)
    assert t.committable() == {} and t.pending() == 4
    t.executed(1)  # half of record 0
    t.sending([o[0]])
    t.acked([o[2]])
    assert t.committable() == {}
    t.executed(2)  # the rest of 0, and 1
    assert t.committable() == {}  # 0 still waits for its delta record
    t.acked([o[0]])
    assert t.committable() == {("in", 0): 3}  # 0, 1 and the dead letter 2
    t.sending([o[3]])
    t.executed(1)  # its delta record is never acknowledged (a failed delivery): never committed
    assert t.committable() == {("in", 0): 3}
    assert t.pending() == 1 and done == [0.0, 1.0, 2.0]
    assert sent == [True, False, False]  # only 0 had deltas (2's record is its dead letter)


def test_a_lone_dead_letter_is_pending_until_acknowledged():
    """A refused record while nothing else is pending (the daemon idle, or just started)."""
    t = DeliveryTracker()
    t.submitted(("in", 0, 7), 0, sends=1)
    assert t.pending() == 1 and t.committable() == {}
    t.acked([("in", 0, 7)])
    assert t.pending() == 0 and t.committable() == {("in", 0): 8}


def test_random_interleavings_never_commit_a_record_with_unacknowledged_deltas():
    rng = random.Random(5)
    for _ in range(50):
        t = DeliveryTracker()
        n = 30
        sizes = [rng.randint(0, 3) for _ in range(n)]
        acks = {i: 0 for i in range(n)}
        for i, k in enumerate(sizes):
            t.submitted(("in", 0, i), k)
        executed = 0
        total = sum(sizes)
        outstanding = []
        while executed < total or outstanding:
            if executed < total and (not outstanding or rng.random() < 0.5):
                step = rng.randint(1, total - executed)
                # records whose updates this step covers send a delta record first
                first, acc, covered = executed, 0, []
                for i, k in enumerate(sizes):
                    if k and acc + k > first and acc < first + step:
                        covered.append(("in", 0, i))
                    acc += k
                t.sending(covered)
                for o in covered:
                    acks[o[2]] += 1
                outstanding.append(covered)
                t.executed(step)
                executed += step
            else:
                batch = outstanding.pop(rng.randrange(len(outstanding)))
                t.acked(batch)
                for o in batch:
                    acks[o[2]] -= 1
            c = t.committable().get(("in", 0), 0)
            assert all(acks[i] == 0 for i in range(c)), "committed past a record with deltas in flight"
        assert t.committable() == {("in", 0): n} and t.pending() == 0


def test_the_tracker_follows_the_rule_record_by_record():
    """Against the rule itself, one record at a time: several partitions, offsets with gaps,
    records of 0 to 3 updates, runs, dead letters; enough records that the tracker's arrays
    drop their done front and grow; every record's arrival reported once, when passed, and
    whether a delta record covered it."""
    rng = random.Random(7)
    for trial in range(6):
        done, sent = [], []
        t = DeliveryTracker(on_done=lambda arrived, had: (done.extend(arrived), sent.extend(had)))
        waits: dict[tuple, list[int]] = {}  # origin -> [updates left, acks outstanding]
        order: list[tuple] = []  # origins with updates, in submission order, one per update
        next_offset = {("in", 0): 0, ("in", 1): 5, ("dl", 0): 100}
        flights, executed, submitted = [], 0, 0

        logs = {key: [] for key in next_offset}  # each partition's offsets, in order
        prefix = {key: 0 for key in next_offset}  # how many of them the rule passes

        def model_committable():
            for key, offs in logs.items():
                while prefix[key] < len(offs) and waits[key + (offs[prefix[key]],)] == [0, 0]:
                    prefix[key] += 1
            return {key: logs[key][prefix[key] - 1] + 1 for key in logs if prefix[key]}

        had, single = set(), {}  # the origins a delta record covered; those submitted alone -> arrival
        for _step in range(1500 if trial < 2 else 300):
            r = rng.random()
            if r < 0.35 and submitted < 4000:
                key = rng.choice(list(next_offset))
                first = next_offset[key] + rng.choice([0, 0, 0, 1, 5])  # gaps: transaction markers, compaction
                if rng.random() < 0.5:
                    offs = list(range(first, first + rng.randint(1, 40)))
                    t.submitted_run(*key, offs)
                    for o in offs:
                        waits[key + (o,)] = [1, 0]
                        order.append(key + (o,))
                else:
                    offs = [first]
                    k, sends = rng.choice([(0, 0), (0, 1), (1, 0), (2, 0), (3, 0)])
                    t.submitted(key + (first,), k, sends=sends, arrived=-1.0 - first)  # < 0: told apart
                    single[key + (first,)] = -1.0 - first
                    waits[key + (first,)] = [k, sends]
                    order.extend([key + (first,)] * k)
                    if sends:
                        flights.append([key + (first,)])
                next_offset[key] = offs[-1] + 1
                logs[key] += offs
                submitted += len(offs)
            elif r < 0.65 and executed < len(order):
                step = rng.randint(1, min(60, len(order) - executed))
                covered = sorted(set(o for o in order[executed:executed + step] if rng.random() < 0.4))
                t.sending(covered)
                for o in covered:
                    waits[o][1] += 1
                had.update(covered)
                flights.append(covered)
                t.executed(step)
                for o in order[executed:executed + step]:
                    waits[o][0] -= 1
                executed += step
            elif flights:
                acked = flights.pop(rng.randrange(len(flights)))
                t.acked(acked)
                for o in acked:
                    waits[o][1] -= 1
            assert t.committable() == model_committable()
            assert t.pending() == len(waits) - sum(prefix.values())
        assert len(done) == sum(prefix.values()) and sum(prefix.values()) > 1000 * (trial < 2)
        passed = [key + (o,) for key, offs in logs.items() for o in offs[:prefix[key]]]
        assert sum(sent) == sum(o in had for o in passed)
        # record by record where the arrival names it: its flag is whether a delta record covered it
        assert Counter((a, bool(s)) for a, s in zip(done, sent) if a < 0) == \
            Counter((single[o], o in had) for o in passed if o in single)


# ---- metrics --------------------------------------------------------------------------------------------
def test_histogram_quantiles_are_within_a_bucket_of_numpy():
    rng = np.random.default_rng(1)
    x = rng.lognormal(-5, 2, 20000)
    h = LatencyHistogram()
    h.observe(x)
    for q in (0.5, 0.9, 0.99):
        assert np.quantile(x, q) <= h.quantile(q) <= np.quantile(x, q) * 2 ** (1 / 8) * 1.001


def test_the_latency_histogram_folds_into_standard_buckets():
    m = Metrics()
    assert metric(m.prometheus(), "csmd_update_latency_seconds_bucket", le="+Inf") == 0
    x = np.random.default_rng(1).lognormal(-5, 2, 20000)
    m.latency.observe(x)
    text = m.prometheus()
    buckets = sorted((float(dict(labels)["le"]), v) for (name, labels), v in samples(text).items()
                     if name == "csmd_update_latency_seconds_bucket")
    counts = [v for _, v in buckets]
    assert counts == sorted(counts) and counts[-1] == len(x) == metric(text, "csmd_update_latency_seconds_count")
    assert abs(metric(text, "csmd_update_latency_seconds_sum") - x.sum()) < 1e-6 * x.sum()
    le_01 = dict(buckets)[0.1]
    assert abs(le_01 - (x <= 0.1).sum()) <= (abs(x - 0.1) < 0.01).sum()


def test_metrics_text_format():
    m = Metrics()
    m.inc("csmd_deltas_total", 3, query='Q"1', sign="+")
    m.inc("csmd_deltas_total", 2, query='Q"1', sign="+")
    text = m.prometheus()
    assert "# TYPE csmd_deltas_total counter" in text
    assert 'csmd_deltas_total{query="Q\\"1",sign="+"} 5.0' in text
    assert m.get("csmd_deltas_total", sign="+", query='Q"1') == 5
    assert metric(text, "process_cpu_seconds_total") > 0, "the standard process metrics"


def test_every_reason_the_sequencer_ignores_an_update_for_is_exported():
    """The metric shows IGNORED_REASONS from the start; the sequencer counts under no other name."""
    g = read_graph(HUMAN / "data.graph")
    label_of_1 = int(g.labels[list(g.ext_ids).index(1)])  # the same label again: a duplicate, not a relabel
    ups = [Update("e", 1, 1), Update("e", 1, 2), Update("e", 1, 2), Update("-e", 10**9, 10**9 + 1),
           Update("v", 1, -1, label_of_1), Update("-v", 10**9)]
    pipe = Pipeline(g, engine=CpuEngine(g), threaded=False)
    pipe.run(iter(ups), lambda r: None)
    g1 = read_graph(HUMAN / "data.graph", directed=True)
    arcs = Pipeline(g1, engine=CpuEngine(g1), threaded=False)  # and a directed graph: a label its codes cannot hold
    arcs.run(iter([Update("e", 1, 2, 1 << 14)]), lambda r: None)
    timed = Pipeline(g, engine=CpuEngine(g), threaded=False, event_time=EventTime(5))  # and a late update
    timed.run(iter([Update("e", 1, 2, ts=100), Update("e", 1, 3, ts=90)]), lambda r: None)
    assert set(pipe.ignored) | set(arcs.ignored) | set(timed.ignored) == set(IGNORED_REASONS)
    m = Metrics()
    assert {dict(labels)["reason"] for (name, labels), v in samples(m.prometheus()).items()
            if name == "csmd_ignored_updates_total" and v == 0} == set(IGNORED_REASONS)
    m.bind("csmd_ignored_updates_total", lambda: {(r,): pipe.ignored[r] for r in IGNORED_REASONS})
    assert m.get("csmd_ignored_updates_total", reason="self_loop") == 1


# ---- checkpoints ------------------------------------------------------------------------------------------
def test_checkpoint_round_trip_keeps_ids_and_falls_back_when_damaged(tmp_path):
    g0 = read_graph(HUMAN / "data.graph")
    pipe = Pipeline(g0, engine=CpuEngine(g0), threaded=False)
    ups = list(read_updates(HUMAN / "insertion.graph"))[:500]
    ups += [Update("-v", ups[0].u), Update("e", 10**9, ups[1].v, 2), Update("v", ups[0].u, 5)]
    pipe.run(iter(ups), lambda r: None)
    first = write_checkpoint(tmp_path, pipe.graph_state(), {"seq": 100, "offsets": {}})
    second = write_checkpoint(tmp_path, pipe.graph_state(), {"seq": pipe.next_seq, "offsets": {"0": 503}})
    ck = read_checkpoint(tmp_path)
    assert ck.state["seq"] == pipe.next_seq and ck.state["offsets"] == {"0": 503}
    restored = Pipeline(ck.graph, engine=CpuEngine(ck.graph), threaded=False, first_seq=ck.state["seq"],
                        retired=ck.retired).graph_state()
    before = pipe.graph_state()
    assert list(restored.ext_ids) == list(before.ext_ids)
    assert np.array_equal(restored.labels, before.labels)
    assert [a.tolist() for a in (restored.src, restored.dst, restored.elabel)] == \
        [a.tolist() for a in (before.src, before.dst, before.elabel)]
    assert ck.retired.sum() == 1 and np.array_equal(~ck.retired, before.alive) and np.array_equal(restored.alive, before.alive)
    (second / "edges.arrow").write_bytes(b"damaged")
    assert read_checkpoint(tmp_path).state["seq"] == 100  # the one before it
    assert first.exists() and read_checkpoint(tmp_path / "none") is None


# ---- signals --------------------------------------------------------------------------------------
def test_the_stop_signal_handler_neither_logs_nor_locks():
    """SIGTERM's handler runs on the main thread between two bytecodes, maybe inside a log call holding
    the (non-reentrant) write lock: logging from it deadlocked a daemon that was logging dead letters.
    It only records the signal and sets the event; the drain logs it."""
    import signal
    import threading
    from types import SimpleNamespace

    from csmd.service.daemon import on_stop_signal

    class NoLog:
        def __getattr__(self, name):
            raise AssertionError(f"the signal handler called log.{name}")

    d = SimpleNamespace(stopping=threading.Event(), stop_signal=None, log=NoLog())
    on_stop_signal(d, signal.SIGTERM)
    assert d.stopping.is_set() and d.stop_signal == "SIGTERM"


def test_arrow_messages_are_the_bytes_a_stream_writer_writes_whatever_schema_came_last():
    """The output's IPC messages keep the last schema's message: they must stay what pyarrow's
    stream writer writes, across schemas in turn and when a batch is split to fit."""
    from csmd.connectors.kafka import arrow_messages
    from csmd.schemas import deltas_schema

    def written(batch):
        sink = pa.BufferOutputStream()
        with ipc.new_stream(sink, batch.schema) as w:
            w.write_batch(batch)
        return sink.getvalue().to_pybytes()

    rng = np.random.default_rng(5)
    batches = []
    for id_type in (pa.int64(), pa.string(), pa.int64()):
        n = int(rng.integers(1, 40))
        ids = [[int(x) for x in rng.integers(0, 99, 3)] for _ in range(n)]
        batches.append(pa.record_batch([
            pa.array(["Q_1"] * n), pa.array(rng.choice([-1, 1], n).astype(np.int8)), pa.array(np.arange(n)),
            pa.array(["s"] * n), pa.array([[str(v) if id_type == pa.string() else v for v in r] for r in ids],
                                          pa.list_(id_type)),
            pa.array(np.ones(n, np.int64)), pa.array(["in"] * n), pa.array(np.zeros(n, np.int32)),
            pa.array(np.arange(n)), pa.array(np.arange(n)), pa.array([b"k"] * n),
            pa.array([[("h", b"v")]] * n, pa.map_(pa.string(), pa.binary())),
            pa.array([[("f", "1")]] * n, pa.map_(pa.string(), pa.string())),
            pa.array(rng.integers(0, 9, n)), pa.array(rng.integers(9, 99, n))], schema=deltas_schema(id_type)))
    for b in batches:
        assert arrow_messages(b, 1 << 20) == [written(b)]
        assert arrow_messages(b.slice(1), 1 << 20) == [written(b.slice(1))]
    big = batches[0]
    parts = arrow_messages(big, len(written(big.slice(0, 2))) + 8)  # split by rows to fit
    assert len(parts) > 1 and all(len(p) <= len(written(big.slice(0, 2))) + 8 for p in parts)
    assert pa.Table.from_batches([b for p in parts for b in ipc.open_stream(p)]).equals(pa.Table.from_batches([big]))


def test_metrics_series_with_labels_keep_their_counts_whatever_the_keyword_order():
    m = Metrics()
    for _ in range(3):
        m.inc("csmd_deltas_total", 2, query="q", sign="+")
        m.inc("csmd_deltas_total", 1, sign="+", query="q")
    m.inc("csmd_deltas_total", 5, query="r", sign="-")
    text = m.prometheus()
    assert metric(text, "csmd_deltas_total", query="q", sign="+") == 9
    assert metric(text, "csmd_deltas_total", query="r", sign="-") == 5
    assert m.get("csmd_deltas_total", sign="+", query="q") == 9


@pytest.mark.parametrize("seed", range(6))
def test_delta_ids_number_each_records_deltas_per_query_across_batches(seed):
    """The encoder's ids against their definition, computed row by row: (input, partition,
    offset) of the update's record, and `index`, the count of the query's earlier deltas of that
    record (a record's updates may span batches); sources and counts carried through. Odd seeds:
    batches cut from blocks of records (their ids read from the block's columns)."""
    from csmd.connectors.records import RecordBlock
    from csmd.engine import QueryDeltas, UpdateBatch
    from csmd.model.graph import Graph
    from csmd.pipeline.deltas import DeltaEncoder
    from csmd.pipeline.sequencer import BlockRecords, Vertices
    from csmd.pipeline.stages import BatchResult

    rng = random.Random(seed)
    enc = DeltaEncoder(Vertices(Graph.from_edges([0, 1, 2, 3], [0], [1])))
    seen: dict = {}
    seq, offset = 0, 0
    record = Update("e", 0, 1, 0, "r0", ("in", rng.randrange(3), 0))
    for _batch in range(6):
        record_of, first = {}, seq
        for _ in range(rng.randrange(1, 30)):
            if rng.random() < 0.6:  # a new record; else the record goes on (several updates)
                offset += rng.randrange(1, 3)
                record = Update("e", 0, 1, 0, f"r{offset}", (rng.choice(["in", "in2"]), rng.randrange(3), offset))
            record_of[seq] = record
            seq += 1
        if seed % 2:  # the same rows as a block of records of one partition, some of several updates
            offset += 1
            lines = np.cumsum([0] + rng.choices([0, 1, 1, 2], k=seq - first - 1)) + offset
            offset = int(lines[-1])
            z = np.zeros(len(lines), np.int64)
            run = np.flatnonzero(np.diff(lines, prepend=-1))  # each record's first row
            size = np.diff(np.append(run, len(lines)))
            part = np.arange(len(lines)) - np.repeat(run, size) + 1  # its line in the record
            part[np.repeat(size == 1, size)] = 0  # a record's only update: named by the record
            record_of = BlockRecords(RecordBlock("in", lines, z.astype(np.int8), z, z + 1, z, partition=seed % 3,
                                                 part=part if (size > 1).any() else None), first)
        deltas = []
        for q in ("Q_a", "Q_b", "Q_c"):
            s = np.array(sorted(rng.choices(range(first, seq), k=rng.randrange(0, 40))), np.int64)
            counts = np.array([rng.randrange(1, 5) for _ in s], np.int64)
            deltas.append(QueryDeltas(q, s, np.where(s % 2 == 0, 1, -1).astype(np.int8), None, 0, 0, counts))
        z = np.zeros(0, np.int64)
        batch = UpdateBatch(first, seq, z, z, z, z, z, z, z, z, np.zeros(0, np.int32), 4, record_of)
        items = list(enc.encode(BatchResult(batch, deltas, 0.0)))
        assert [q for q, _b, _o in items] == [d.name for d in deltas if len(d.seq)]
        for (q, rb, origins), d in zip(items, [d for d in deltas if len(d.seq)]):
            got = rb.to_pydict()
            want_index, want_origins = [], []
            for s in d.seq.tolist():
                o = record_of[s].origin
                want_index.append(seen.get((q, o), 0))
                seen[(q, o)] = want_index[-1] + 1
                if not want_origins or want_origins[-1] != o:
                    want_origins.append(o)
            assert got["index"] == want_index
            assert list(zip(got["input"], got["partition"], got["offset"])) == [record_of[s].origin for s in d.seq]
            assert got["source"] == [record_of[s].source for s in d.seq.tolist()]
            assert got["count"] == d.counts.tolist() and got["seq"] == d.seq.tolist()
            assert got["sign"] == d.sign.tolist() and got["vertices"] == [[]] * len(d.seq)
            assert origins == want_origins


def test_the_admin_endpoint_answers_strict_json_with_null_for_an_empty_histogram():
    """/stats before any record (or, for the delta latency, before any deltas): an empty
    histogram's quantile is NaN, which json.dumps writes and strict parsers refuse."""
    from csmd.service.admin import strict_json

    def refuse(constant):
        raise ValueError(constant)

    body = {"latency_p50_s": LatencyHistogram().quantile(0.5), "ok": 1.5, "q": {"a": [math.inf, 2, "x"]}}
    assert json.loads(strict_json(body), parse_constant=refuse) == \
        {"latency_p50_s": None, "ok": 1.5, "q": {"a": [None, 2, "x"]}}


def test_a_client_that_hangs_up_before_the_answer_leaves_no_traceback(capsys):
    """A `csmd admin` that times out (a slow stats or match) closes its socket; the endpoint's
    answer then meets a reset connection: no traceback in the daemon's output, and the next
    request is answered."""
    import socket
    import struct
    import time
    import urllib.request

    from csmd.service.admin import AdminServer

    class Slow:
        status, fatal = "running", None

        def kafka_state(self):
            return {"kafka": "up"}

        def stats(self):
            time.sleep(0.4)
            return {"pad": "x" * (4 << 20)}  # past any socket buffer: the write meets the reset

    server = AdminServer(Slow(), "127.0.0.1:0")
    server.start()
    try:
        host, port = server.httpd.server_address[:2]
        s = socket.create_connection((host, port))
        s.sendall(b"GET /stats HTTP/1.1\r\nHost: x\r\n\r\n")
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
        s.close()
        time.sleep(1.0)
        with urllib.request.urlopen(f"http://{host}:{port}/health", timeout=10) as resp:
            assert json.loads(resp.read())["status"] == "running"
    finally:
        server.shutdown()
    err = capsys.readouterr().err
    assert "Traceback" not in err and "BrokenPipe" not in err and "ConnectionReset" not in err, err


def test_a_query_the_engine_refuses_is_an_answer_to_the_control_request_not_a_crash():
    """A query whose time constraints the engine cannot search (the GPU engine, for now) reaches the
    executor as any added query does: the engine's refusal becomes the request's error."""
    from csmd.backends import continuous_engine
    from csmd.errors import InputError
    from csmd.model.graph import Graph
    from csmd.model.labels import LabelNames
    from csmd.pipeline.event_time import EventTime
    from csmd.pipeline.stages import Pipeline
    from csmd.service.control import QueryChange, QuerySpec

    g0 = Graph.from_edges([0] * 3, [0, 1], [1, 2])
    engine = continuous_engine("cpu", g0, timed=True)

    def refuse(query):
        raise InputError(query.name, None, "time constraints (w, o lines) are searched by the cpu engine only")

    engine.prepare = refuse
    pipe = Pipeline(g0, engine=engine, threaded=False, event_time=EventTime(10))
    text = "v 0 0\nv 1 0\nv 2 0\ne 0 1\ne 1 2\nw 5\n"
    change = QueryChange("add", QuerySpec("q", text), 0, {}, True, LabelNames(timed=True))
    change.at_executor(pipe)
    assert change.error == "q: time constraints (w, o lines) are searched by the cpu engine only"
    assert "q" not in pipe.queries
