"""The input record's context in its deltas: the Kafka key, the carried headers and fields.

Truth: every delta row names its record (partition, offset) and update (source); its key and headers
must be that record's, its fields that update's, whatever path the record took (one-line text records
in columns, JSON, Arrow, several updates a record, a vertex deletion expanded into edge deletions).
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from csmd.connectors.records import Carry, BadRecord, Polled, Record, RecordBlock, decode_updates, plain_runs
from csmd.cpu.numpy_engine import CpuEngine
from csmd.model.graph import Graph
from csmd.pipeline.deltas import DeltaEncoder
from csmd.pipeline.stages import Pipeline
from csmd.testing.kafka import QUIET, DaemonProcess, Topics, config_text, new_admin_port

from helpers import arrow_message

CARRY = Carry(headers=("trace", "tenant"), fields=("txn", "amount"))


def _plain(updates) -> list[tuple]:
    return [(u.op, u.u, u.v, u.label) for u in updates]


# ---- decoding ------------------------------------------------------------------------------------------------
def test_extra_fields_and_columns_are_accepted_and_ignored_unless_carried():
    js = json.dumps([{"op": "e", "u": 1, "v": 2, "amount": 12.5, "note": {"a": [1]}}, {"op": "-v", "u": 3, "ts": None}])
    arrow = arrow_message(dict(op=["e", "-v"], u=[1, 3], v=[2, None], amount=[12.5, None], note=[b"x", b"y"]))
    for value in (js.encode(), arrow):
        got = decode_updates(Record("in", 0, 5, value))
        assert _plain(got) == [("e", 1, 2, 0), ("-v", 3, -1, 0)]
        assert all(u.context is None for u in got)  # nothing carried: no context, no cost
    # carried: the named fields only, per update, as JSON text; absent and null ones are null
    rec = Record("in", 0, 5, js.encode(), [("trace", b"t1"), ("other", b"o")], key=b"k")
    assert [u.context for u in decode_updates(rec, carry=CARRY)] == [
        (b"k", (b"t1", None), (None, "12.5")), (b"k", (b"t1", None), (None, None))]
    rec = Record("in", 0, 5, arrow, [("tenant", b"a"), ("tenant", b"b"), ("trace", None)])
    assert [u.context for u in decode_updates(rec, carry=CARRY)] == [
        (None, (None, b"b"), (None, "12.5")), (None, (None, b"b"), (None, None))]  # a header twice: its last value


def test_what_is_wrong_stays_refused_with_extra_fields():
    cases = [(b'{"op": 1, "u": 1, "v": 2, "txn": "a"}', "unknown op 1"),
             (b'{"op": "e", "u": "1", "v": 2, "txn": "a"}', "vertex id '1' is not an integer"),
             (b'{"op": "e", "u": 1, "v": 2, "label": "x", "txn": "a"}', "label 'x'"),
             (b'{"op": "-v", "u": 1, "v": 2, "txn": "a"}', "takes no v"),
             (arrow_message(dict(op=["e"], u=[1.5], v=[2], txn=["a"])), "column 'u' is double"),
             (arrow_message(dict(op=["e"], u=[1], v=[2], label=[0.5], txn=["a"])), "column 'label' is double"),
             # another column named like u: fine
             (arrow_message(dict(op=["e"], u=[1], v=[2], txn=["a"], **{"u ": [1]})), None)]
    for value, reason in cases:
        if reason is None:
            assert _plain(decode_updates(Record("in", 0, 1, value), carry=CARRY)) == [("e", 1, 2, 0)]
            continue
        with pytest.raises(BadRecord, match=reason):
            decode_updates(Record("in", 0, 1, value), carry=CARRY)


def test_text_records_carry_key_and_headers_in_blocks_as_one_by_one():
    values = [b"e 1 2", b"e 2 3\ne 3 4", b"-e 1 2", b"e 5 6"]
    keys = [b"a", None, b"c", None]
    headers = [[("trace", b"x")], None, None, [("tenant", b"t"), ("trace", b"y")]]
    polled = Polled("in", [0] * 4, [10, 11, 12, 13], values, headers, keys)
    (block,) = list(plain_runs(polled, carry=CARRY))
    assert isinstance(block, RecordBlock)
    want = [u for i in range(4) for u in decode_updates(polled.record(i), carry=CARRY)]
    assert block.updates() == want
    assert [u.context for u in want] == [(b"a", (b"x", None), None), (None, (None, None), None),
                                         (None, (None, None), None), (b"c", (None, None), None),
                                         (None, (b"y", b"t"), None)]
    # nothing to carry and no key: no context at all
    (block,) = list(plain_runs(Polled("in", [0] * 4, [10, 11, 12, 13], values, [None] * 4, [None] * 4)))
    assert block.context is None


def test_a_context_too_large_for_a_delta_is_refused_whatever_the_format():
    """Its delta could not be published: the daemon would stop at it, after every restart again."""
    carry = Carry(("trace",), ("txn",), max_bytes=10)
    fine = [Record("in", 0, 0, b"e 1 2", [("trace", b"12345")], key=b"12345"),
            Record("in", 0, 1, b'{"op": "e", "u": 1, "v": 2, "txn": "123456"}', key=b"12")]  # '"123456"': 8
    big = [Record("in", 0, 2, b"e 1 2", key=b"x" * 11), Record("in", 0, 3, b"e 1 2", [("trace", b"x" * 11)]),
           Record("in", 0, 4, b'[{"op": "e", "u": 1, "v": 2}, {"op": "e", "u": 1, "v": 3, "txn": "1234567890"}]')]
    for rec in fine:
        decode_updates(rec, carry=carry)
    for rec in big:
        with pytest.raises(BadRecord, match="more than the 10 a delta can carry"):
            decode_updates(rec, carry=carry)
    recs = fine[:1] + big[:2]
    items = list(plain_runs(Polled("in", [0] * 3, [0, 2, 3], [r.value for r in recs], [r.headers for r in recs],
                                   [r.key for r in recs]), carry=carry))
    assert isinstance(items[0], RecordBlock) and items[1:] == [Record("in", 0, 2, b"e 1 2", key=b"x" * 11),
                                                              Record("in", 0, 3, b"e 1 2", [("trace", b"x" * 11)])]


# ---- the pipeline's deltas -------------------------------------------------------------------------------------
EDGE = Graph.from_edges([0, 0], [0], [1])  # the query: one edge between two label-0 vertices


def _graph() -> Graph:
    """Vertices 0..5 of label 0, 6..7 of label 1, edges 0-1 and 0-2."""
    return Graph.from_edges([0] * 6 + [1] * 2, [0, 0], [1, 2])


def _deltas(items, carry: Carry, batch_size: int) -> pa.Table:
    g0 = _graph()
    pipe = Pipeline(g0, engine=CpuEngine(g0), batch_size=batch_size, threaded=False)
    pipe.add_query("q", EDGE)
    encoder = DeltaEncoder(pipe.vertices, carry)
    out = []
    pipe.run(iter(items), lambda res: out.extend(b for _q, b, _o in encoder.encode(res)))
    return pa.Table.from_batches(out, encoder.schema)


def _records() -> list[Record]:
    return [
        Record("in", 0, 0, b"e 3 4", [("trace", b"r0")], key=b"k0"),  # a delta, plain text
        Record("in", 0, 1, b"e 6 7", [("trace", b"r1")], key=b"k1"),  # none: label-1 vertices
        Record("in", 0, 2, json.dumps([{"op": "e", "u": 4, "v": 5, "txn": "t2a", "amount": 3},
                                       {"op": "e", "u": 5, "v": 6, "txn": "t2b"},  # no delta
                                       {"op": "e", "u": 1, "v": 5, "amount": [1, 2]}]).encode(), key=b"k2"),
        Record("in", 0, 3, arrow_message(dict(op=["e", "e"], u=[2, 3], v=[3, 5], txn=["t3a", None], other=[1, 2])),
               [("tenant", b"x3")]),
        Record("in", 0, 4, b"e 3 4", key=b"k4"),  # exists already: no delta
        Record("in", 0, 5, b'{"op": "-v", "u": 3, "txn": "t5"}', [("trace", b"r5")], key=b"k5"),  # 3 edges go
        Record("in", 0, 6, b"e 0 3\ne 0 4", key=None),  # two updates of a text record, no key
    ]


def _want(records: list[Record], carry: Carry) -> dict:
    """source -> (key, headers, fields) as a consumer reads them from the delta."""
    out = {}
    for rec in records:
        for u in decode_updates(rec, carry=carry):
            key, headers, fields = u.context or (None, None, None)
            out[u.source] = (key, list(zip(carry.headers, headers or (None,) * len(carry.headers))),
                             list(zip(carry.fields, fields or (None,) * len(carry.fields))))
    return out


@pytest.mark.parametrize("batch_size", [1, 3, 64])
@pytest.mark.parametrize("carry", [CARRY, Carry()])
def test_each_delta_carries_the_context_of_its_record_and_update(batch_size, carry):
    records = _records()
    polled = Polled("in", [0] * len(records), [r.offset for r in records], [r.value for r in records],
                    [r.headers or None for r in records], [r.key for r in records])
    items = []
    for item in plain_runs(polled, carry=carry):  # text runs in columns, the rest one record each
        items += [item] if isinstance(item, RecordBlock) else decode_updates(item, carry=carry)
    assert any(isinstance(it, RecordBlock) for it in items)
    table = _deltas(items, carry, batch_size)
    want = _want(records, carry)
    rows = table.select(["source", "offset", "key", "headers", "fields"]).to_pylist()
    assert {r["offset"] for r in rows} == {0, 2, 3, 5, 6}  # exactly the records that change a match
    assert sum(r["source"] == "in/0/5" for r in rows) == 3 * 2  # the vertex deletion's 3 edges, 2 matches each
    for r in rows:
        assert (r["key"], r["headers"], r["fields"]) == want[r["source"]], r
    if carry.fields:
        assert [r["fields"] for r in rows if r["source"] == "in/0/2#2"][0] == [("txn", None), ("amount", "[1, 2]")]


def test_nothing_carried_costs_no_column_work_and_reads_as_null():
    table = _deltas([u for r in _records()[:1] for u in decode_updates(r)], Carry(), 64)
    assert table.column("key").to_pylist() == [b"k0", b"k0"]
    table = _deltas([u for r in _records()[:1] for u in decode_updates(Record("in", 0, 0, r.value))], Carry(), 64)
    assert table.column("key").null_count == 2 and table.column("headers").to_pylist() == [[], []]


# ---- the daemon end to end ----------------------------------------------------------------------------------
def test_daemon_deltas_carry_each_records_key_headers_and_fields(tmp_path, kafka_bootstrap):
    t = Topics(kafka_bootstrap)
    graph = tmp_path / "g.graph"
    graph.write_text("".join(f"v {i} {0 if i < 6 else 1}\n" for i in range(8)) + "e 0 1\ne 0 2\n")
    query = tmp_path / "edge.graph"
    query.write_text("v 0 0\nv 1 0\ne 0 1\n")
    port = new_admin_port()
    cfg = tmp_path / "d.toml"
    cfg.write_text(config_text(t, [], admin_port=port, graph={"initial": str(graph)},
                               queries={"paths": [str(query)]}, topics={"max_message_bytes": 20000},
                               output={"carry_headers": list(CARRY.headers), "carry_fields": list(CARRY.fields)}))
    d = DaemonProcess(cfg, tmp_path / "d.log", port)
    records = _records() + [Record("in", 0, 7, b'{"op": 1, "u": 0, "v": 5, "txn": "bad"}', key=b"k7"),  # dead letters
                            Record("in", 0, 8, b"e 0 5", key=b"k" * 10001)]  # more than a delta can carry
    p = Producer({"bootstrap.servers": t.bootstrap, **QUIET})
    for r in records:
        p.produce(t.input, r.value, key=r.key, headers=r.headers or None, partition=0)
    assert p.flush(30) == 0
    d.wait_offset(len(records))
    table = t.deltas()
    want = _want([Record(t.input, 0, r.offset, r.value, r.headers, key=r.key) for r in records[:-2]], CARRY)
    rows = table.select(["source", "offset", "key", "headers", "fields"]).to_pylist()
    assert {r["offset"] for r in rows} == {0, 2, 3, 5, 6}
    for r in rows:
        assert (r["key"], r["headers"], r["fields"]) == want[r["source"]], r
    dead = t.read(t.dead_letter)
    assert [dict(m.headers())["csmd-offset"] for m in dead] == [b"7", b"8"]
    assert dead[0].key() == b"k7" and dead[1].key() is None  # the record's key, unless it alone is too large
    assert dict(dead[1].headers())["csmd-key-dropped"] == b"10001"
    assert d.stop() == 0
