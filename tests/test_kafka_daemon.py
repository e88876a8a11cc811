"""The daemon end to end through Kafka (the embedded broker, or KAFKA_BOOTSTRAP's cluster).

Truth: expected_insert_counts.txt of the human dataset, and the deltas of
`csmd replay` on the same stream (its own tests check it against brute force).
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections import Counter

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from csmd.errors import CsmdError
from csmd.model.formats import read_graph, read_query
from csmd.testing.kafka import (HUMAN, QUERIES, DaemonProcess, Topics, daemon_config, dedup, expected_totals,
                                human_lines, metric, rows_of)

from helpers import arrow_message


def test_end_to_end_totals_match_expected_counts(tmp_path, kafka_bootstrap, reference):
    t, cfg, port = daemon_config(tmp_path, kafka_bootstrap, topics={"max_message_bytes": 20000})
    d = DaemonProcess(cfg, tmp_path / "d.log", port)
    lines = human_lines()
    t.produce(t.input, lines)
    d.wait_offset(len(lines))
    msgs = t.read(t.output)
    assert all(len(m.value()) <= 20000 for m in msgs), "records must stay under max_message_bytes"
    assert {m.key().decode() for m in msgs} == set(QUERIES)  # keyed by query
    table = pa.concat_tables([ipc.open_stream(m.value()).read_all() for m in msgs])
    expected = expected_totals()
    totals = Counter()
    for q, c, s in zip(table.column("query").to_pylist(), table.column("count").to_pylist(),
                       table.column("sign").to_pylist()):
        totals[q] += c * s
    assert dict(totals) == {q: expected[q] for q in QUERIES}
    deduped, dups = dedup(table)
    assert dups == 0
    assert rows_of(table) == reference
    stats = d.get("/stats")
    assert stats["queries"]["Q_1"]["positive"] == expected["Q_1"]
    # the way of an update in parts (bucketed alike): matched, then handed to the producer, then acknowledged
    assert 0 < stats["matched_p50_s"] <= stats["produced_p50_s"] <= stats["latency_p50_s"]
    assert stats["matched_p99_s"] <= stats["produced_p99_s"]
    # the records with deltas alone: a tenth of the records, their median within the whole's tail
    assert 0 < stats["delta_latency_p50_s"] <= stats["latency_p99_s"]
    metrics = d.get("/metrics")
    assert metric(metrics, "csmd_updates_total") == len(lines)
    assert 'csmd_update_latency_seconds_bucket{le="+Inf"}' in metrics
    with_deltas = metric(metrics, "csmd_delta_latency_seconds_count")
    assert 0 < with_deltas < metric(metrics, "csmd_update_latency_seconds_count")
    assert metric(metrics, "csmd_publish_latency_seconds_count") > 0
    assert d.stop() == 0


def test_records_of_several_lines_give_the_same_deltas_and_ids_by_record_and_line(tmp_path, kafka_bootstrap,
                                                                                   reference):
    """A producer that batches: each record 1 to 9 lines of the stream, with comments, blank lines and
    CRLF endings among them (taken in columns, as one-line records are). The deltas are replay's; each
    names the record of its update (offset), the update's line in it (source, as decode_updates names
    it) and numbers the query's deltas of that record in update order (index)."""
    import random

    t, cfg, port = daemon_config(tmp_path, kafka_bootstrap)
    d = DaemonProcess(cfg, tmp_path / "d.log", port)
    rng = random.Random(3)
    lines, records, where = human_lines(), [], []  # where[seq]: (record offset, its line in the record)
    i = 0
    while i < len(lines):
        k = min(rng.randrange(1, 10), len(lines) - i)
        body = []
        for ln in lines[i:i + k]:
            if rng.random() < 0.1:
                body.append(rng.choice(["# a note", "", "  "]))
            body.append(ln)
            where.append((len(records), len(body)))
        end = "\r\n" if rng.random() < 0.2 else "\n"
        records.append(end.join(body) + (end if rng.random() < 0.5 else ""))
        i += k
    t.produce(t.input, records)
    d.wait_offset(len(records))
    table = t.deltas()
    deduped, dups = dedup(table)
    assert dups == 0 and rows_of(table) == reference
    ups = Counter(off for off, _ in where)
    seen: Counter = Counter()
    cols = [table.column(c).to_pylist() for c in ("query", "seq", "offset", "index", "source")]
    for q, seq, off, index, source in sorted(zip(*cols), key=lambda r: (r[0], r[1])):
        rec, line = where[seq]
        assert off == rec and index == seen[q, rec]
        assert source == f"{t.input}/0/{rec}" + (f"#{line}" if ups[rec] > 1 else "")
        seen[q, rec] += 1
    assert metric(d.get("/metrics"), "csmd_records_total") == len(records)
    assert d.stop() == 0


@pytest.mark.parametrize("checkpoint", [True, False], ids=["checkpoint", "no-checkpoint"])
def test_kill_9_mid_stream_loses_nothing(tmp_path, kafka_bootstrap, reference, checkpoint):
    t, cfg, port = daemon_config(tmp_path, kafka_bootstrap, checkpoint=checkpoint)
    lines = human_lines()
    d = DaemonProcess(cfg, tmp_path / "d1.log", port)
    t.produce(t.input, lines[:1500])
    d.wait_offset(1500)
    if checkpoint:  # let a checkpoint happen mid-stream
        time.sleep(1.0)
    t.produce(t.input, lines[1500:2600])
    time.sleep(0.3)  # part of it in flight
    d.stop(signal.SIGKILL)
    if checkpoint:
        assert list((tmp_path / "ckpt").glob("ckpt-*")), "a checkpoint was written before the crash"
    d = DaemonProcess(cfg, tmp_path / "d2.log", port)
    t.produce(t.input, lines[2600:])
    d.wait_offset(len(lines))
    table = t.deltas()
    deduped, dups = dedup(table)
    assert rows_of(deduped) == reference
    assert d.stop() == 0
    if checkpoint:
        assert "restored checkpoint" in (tmp_path / "d2.log").read_text()


def test_sigterm_drains_and_a_restart_sends_no_duplicates(tmp_path, kafka_bootstrap, reference):
    t, cfg, port = daemon_config(tmp_path, kafka_bootstrap)
    lines = human_lines()
    d = DaemonProcess(cfg, tmp_path / "d1.log", port)
    t.produce(t.input, lines[:2000])
    time.sleep(0.2)  # SIGTERM while records are still in flight: they are drained, not dropped
    assert d.stop() == 0
    assert "stopped cleanly" in (tmp_path / "d1.log").read_text()
    d = DaemonProcess(cfg, tmp_path / "d2.log", port)
    t.produce(t.input, lines[2000:])
    d.wait_offset(len(lines))
    table = t.deltas()
    _, dups = dedup(table)
    assert dups == 0
    assert rows_of(table) == reference
    assert d.stop() == 0


def test_bad_records_go_to_the_dead_letter_topic(tmp_path, kafka_bootstrap, reference):
    t, cfg, port = daemon_config(tmp_path, kafka_bootstrap, topics={"max_message_bytes": 200_000})
    d = DaemonProcess(cfg, tmp_path / "d.log", port)
    lines = human_lines()
    bad_arrow = arrow_message({"src": pa.array([1]), "dst": pa.array([2])})
    flipped = bytearray(arrow_message({"op": pa.array(["e"]), "u": pa.array([1]), "v": pa.array([2])}))
    flipped[flipped.index(b"\x00\x00\x00\x00\x01\x00\x00\x00e") + 7] = 14  # offsets past the data: a crash if read
    huge = b"x" * 300_000  # its reason quotes it; it and its bytes are cut to fit the dead-letter topic
    bad = {
        b"\x00\x01garbage\xff\xfe": "",
        bad_arrow: "missing column 'op'",
        b'{"u": 1, "v": 2}': "field 'op' missing",
        b'{"op": "e", "u": 1}': "needs u and v",
        b"x 1 2": "unknown op 'x'",
        b'{"op": "move", "u": 1, "v": 2}': "unknown op 'move'",
        b"[" * 50_000 + b"]" * 50_000: "RecursionError",
        bytes(flipped): "Length spanned by binary offsets",
        huge: "unknown op 'xxx",
    }
    # good records in all three formats, with the bad ones between them
    good = [ln.encode() for ln in lines[:1000]]
    good.append(json.dumps([_json_update(ln) for ln in lines[1000:1010]]).encode())
    good.append(_arrow_updates(lines[1010:1100]))
    good += [ln.encode() for ln in lines[1100:]]
    stream = good[:500] + list(bad)[:3] + good[500:1002] + list(bad)[3:] + good[1002:]
    t.produce(t.input, stream)
    t.produce(t.input, [b"x 9 9"], headers={"big": b"h" * 150_000})  # headers too large to send back
    odd = [("x", None), ("k", b"1"), ("k", b"2"), ("", b"")]  # kept as they came: a null value, a key twice
    t.produce(t.input, [b"x 8 8"], headers=odd)
    d.wait_offset(len(stream) + 2)
    dl = t.read(t.dead_letter, until=lambda m: len(m) >= len(bad) + 2)
    assert dl.pop().headers()[:len(odd)] == odd
    assert dict(dl.pop().headers()).get("csmd-headers-dropped") == b"1"
    assert len(dl) == len(bad)
    for m in dl:
        headers = dict(m.headers())
        value = huge if m.value() == huge[:len(m.value())] else m.value()
        assert value in bad
        assert bad[value] in headers["csmd-error"].decode() and len(headers["csmd-error"]) < 600
        assert headers["csmd-input"].decode() == t.input
        assert ("csmd-truncated" in headers) == (value is huge)
    assert dict(dl[-1].headers())["csmd-truncated"] == b"300000" and 150_000 < len(dl[-1].value()) < 200_000
    assert rows_of(t.deltas()) == reference  # the good records around them, every one processed
    assert d.get("/health")["status"] == "running"
    assert metric(d.get("/metrics"), "csmd_dead_letters_total") == len(bad) + 2
    assert d.stop() == 0


def _json_update(line: str) -> dict:
    op, u, v, *lab = line.split()
    return {"op": op, "u": int(u), "v": int(v), "label": int(lab[0]) if lab else 0}


def _arrow_updates(lines) -> bytes:
    ups = [_json_update(ln) for ln in lines]
    return arrow_message({k: pa.array([u[k] for u in ups]) for k in ("op", "u", "v", "label")})


def test_control_changes_take_effect_at_a_well_defined_update_and_survive_restarts(tmp_path, kafka_bootstrap,
                                                                                     reference):
    from csmd.cli import main as csmd

    t, cfg, port = daemon_config(tmp_path, kafka_bootstrap, queries=["Q_1"])
    lines = human_lines()
    d = DaemonProcess(cfg, tmp_path / "d1.log", port)
    t.produce(t.input, lines[:1200])
    d.wait_offset(1200)
    assert csmd(["admin", "--url", d.url, "add", "--query", str(HUMAN / "queries" / "Q_2.graph")]) == 0
    t.produce(t.input, lines[1200:3000])
    d.wait_offset(3000)
    removed = d.get("/queries")
    assert {q["name"] for q in removed["queries"]} == {"Q_1", "Q_2"}
    assert csmd(["admin", "--url", d.url, "remove", "--name", "Q_1"]) == 0
    t.produce(t.input, lines[3000:])
    d.wait_offset(len(lines))
    assert d.stop() == 0
    # the applied records say where each change took effect: before input offsets 1200 and 3000
    applied = [json.loads(m.value()) for m in t.read(t.control)]
    applied = {a["name"]: a for a in applied if a["op"] == "applied"}
    assert applied["Q_2"]["at"] == {"0": 1200} and applied["Q_2"]["seq"] == 1200
    assert applied["Q_1"]["at"] == {"0": 3000} and applied["Q_1"]["seq"] == 3000
    want = Counter({k: n for k, n in reference.items()
                    if (k[0] == "Q_1" and k[1] < 3000) or (k[0] == "Q_2" and k[1] >= 1200)})
    assert rows_of(t.deltas()) == want
    # control records that make the parsers fail, or say "applied" with positions no one can use: each
    # stopped the daemon, and every restart that replayed the control log (a black-box test found them)
    bad_control = [b"[" * 10_000, b'{"op": "add", "name": "n", "query": 1' + b"1" * 5000 + b"}", b"\xff\xfe",
                   b'{"op": "applied", "name": "Q_9", "request": 5, "at": {"x": 1}}',
                   b'{"op": "applied", "name": "Q_9", "request": true, "at": {"0": 1}}',
                   b'{"op": "applied", "name": "Q_9", "request": 5, "at": {"0": -1}}']
    t.produce(t.control, bad_control)
    # restart: the registrations survive (replayed from the control topic), the bad records are left behind
    d = DaemonProcess(cfg, tmp_path / "d2.log", port)
    d.wait_offset(len(lines))
    assert {q["name"] for q in d.get("/queries")["queries"]} == {"Q_2"}
    assert (tmp_path / "d2.log").read_text().count("malformed control record skipped") == len(bad_control)
    t.produce(t.control, bad_control)  # read live: dead letters, the daemon goes on
    letters = t.read(t.dead_letter, until=lambda m: len(m) >= len(bad_control))
    assert [m.value() for m in letters] == bad_control
    assert all(dict(m.headers())["csmd-error"].startswith(b"control message") or b"applied" in
               dict(m.headers())["csmd-error"] for m in letters)
    # refusals: an unknown name, a query that is not connected; the daemon goes on
    assert csmd(["admin", "--url", d.url, "remove", "--name", "nope"]) == 2
    bad = tmp_path / "bad.graph"
    bad.write_text("v 0 1\nv 1 1\nv 2 1\ne 0 1\n")
    assert csmd(["admin", "--url", d.url, "add", "--query", str(bad)]) == 2
    # a name registered already is refused, not replaced (its deltas would change meaning mid-stream)
    q3 = str(HUMAN / "queries" / "Q_3.graph")
    assert csmd(["admin", "--url", d.url, "add", "--query", q3, "--name", "Q_2"]) == 2
    assert [q["query"] for q in d.get("/queries")["queries"]] == [(HUMAN / "queries" / "Q_2.graph").read_text()]
    # names the URL must quote go both ways; names no one could type or remove are refused
    for name in ("ünï€😀", "with space", "%2F", "a/b"):
        assert csmd(["admin", "--url", d.url, "add", "--query", q3, "--name", name]) == 0
        assert csmd(["admin", "--url", d.url, "remove", "--name", name]) == 0
    for name in (" ", "new\nline", "x" * 201):
        assert csmd(["admin", "--url", d.url, "add", "--query", q3, "--name", name]) == 2
    assert csmd(["admin", "--url", d.url.removeprefix("http://"), "stats"]) == 2
    assert {q["name"] for q in d.get("/queries")["queries"]} == {"Q_2"}
    assert d.get("/health")["status"] == "running"
    assert d.stop() == 0
    # a daemon rebuilding from nothing (new group, no committed offsets) re-derives the same deltas
    t2_out = Topics(kafka_bootstrap)
    cfg2 = tmp_path / "fresh.toml"
    cfg2.write_text(cfg.read_text().replace(f'group = "g-{t.input}"', 'group = "fresh"')
                    .replace(f'output = "{t.output}"', f'output = "{t2_out.output}"'))
    assert cfg2.read_text() != cfg.read_text()
    d = DaemonProcess(cfg2, tmp_path / "d3.log", port)
    d.wait_offset(len(lines))
    assert {q["name"] for q in d.get("/queries")["queries"]} == {"Q_2"}
    t.output = t2_out.output
    assert rows_of(t.deltas()) == want
    assert d.stop() == 0


def test_a_control_topic_not_the_checkpoints_is_read_from_its_start(tmp_path, kafka_bootstrap):
    """The checkpoint's last applied control request is an offset of the topic it was taken with:
    applied to another control topic, it skipped that topic's first requests without a word (and an
    admin call waited for its request in vain)."""
    from csmd.cli import main as csmd

    t, cfg, port = daemon_config(tmp_path, kafka_bootstrap, queries=["Q_1"], checkpoint=True)
    d = DaemonProcess(cfg, tmp_path / "d1.log", port)
    for q in ("Q_2", "Q_3"):  # offsets 0 to 3 of the first control topic: two requests, two applied records
        assert csmd(["admin", "--url", d.url, "add", "--query", str(HUMAN / "queries" / f"{q}.graph")]) == 0
    lines = human_lines()[:300]
    t.produce(t.input, lines)
    d.wait_offset(len(lines))
    assert d.stop() == 0  # with a checkpoint of the end
    control = Topics(kafka_bootstrap).control
    cfg.write_text(cfg.read_text().replace(f'control = "{t.control}"', f'control = "{control}"'))
    q4 = (HUMAN / "queries" / "Q_4.graph").read_text()
    t.produce(control, [json.dumps({"op": "add", "name": "Q_4", "query": q4})])  # offset 0: requested while down
    d = DaemonProcess(cfg, tmp_path / "d2.log", port)
    names = lambda: {q["name"] for q in d.get("/queries")["queries"]}  # noqa: E731
    t0 = time.monotonic()
    while "Q_4" not in names() and time.monotonic() - t0 < 20:
        time.sleep(0.1)
    assert names() == {"Q_1", "Q_2", "Q_3", "Q_4"}
    assert csmd(["admin", "--url", d.url, "add", "--query", str(HUMAN / "queries" / "Q_5.graph")]) == 0
    assert names() == {"Q_1", "Q_2", "Q_3", "Q_4", "Q_5"}
    assert "the control topic is not the checkpoint's" in (tmp_path / "d2.log").read_text()
    assert d.stop() == 0


def test_admin_match_stats_and_backpressure(tmp_path, kafka_bootstrap, capsys):
    """A one-shot query against the live graph equals `csmd match` on the same graph as a file;
    a tiny pending limit pauses the consumer, is never passed, and loses nothing."""
    from csmd.cli import main as csmd
    from csmd.jobs.match import run_query
    from csmd.model.graph import Graph
    from csmd.service.admin import call

    t, cfg, port = daemon_config(tmp_path, kafka_bootstrap, queries=["Q_1"],
                         pipeline={"max_pending_records": 40, "batch_size": 16})
    d = DaemonProcess(cfg, tmp_path / "d.log", port)
    lines = human_lines()
    t.produce(t.input, lines)
    pending = []
    while (s := d.get("/stats"))["offsets"].get("0", 0) < len(lines) or s["pending_records"]:
        pending.append(s["pending_records"])
    assert max(pending) <= 40
    assert d.get("/stats")["queries"]["Q_1"]["positive"] == expected_totals()["Q_1"]
    assert metric(d.get("/metrics"), "csmd_consumer_pauses_total") > 0, "the consumer never paused"
    g0 = read_graph(HUMAN / "data.graph")
    src, dst, el = g0.edge_list()
    ext = list(g0.ext_ids)
    index = {int(x): i for i, x in enumerate(ext)}
    extra = [ln.split() for ln in lines]
    s2 = list(src) + [index[int(p[1])] for p in extra]
    d2 = list(dst) + [index[int(p[2])] for p in extra]
    e2 = list(el) + [int(p[3]) if len(p) > 3 else 0 for p in extra]
    final = Graph.from_edges(g0.labels, s2, d2, e2, g0.ext_ids)
    q = read_query(HUMAN / "queries" / "Q_3.graph")
    want = run_query(final, q, "Q_3")["matches"]
    got = call(d.url, "POST", "/match", {"query": (HUMAN / "queries" / "Q_3.graph").read_text()})
    assert got["matches"] == want and got["complete"] and got["seq"] == len(lines)
    # bad options are refused with a reason (they were a 500, or a silent empty answer)
    q3 = (HUMAN / "queries" / "Q_3.graph").read_text()
    for body, reason in [({"limit": "x"}, '"limit" must be a positive integer'),
                         ({"limit": -3}, '"limit" must be a positive integer'),
                         ({"time_limit": "soon"}, '"time_limit" must be a positive number'),
                         ({"limt": 5}, "unknown field(s) 'limt'")]:
        with pytest.raises(CsmdError, match=re.escape(reason)):
            call(d.url, "POST", "/match", {"query": q3, **body})
    with pytest.raises(CsmdError, match="unknown field"):
        call(d.url, "POST", "/queries", {"name": "x", "query": q3, "extra": 1})
    # the estimate reads the same live graph: its 95% interval covers the exact count (seeded, so always)
    est = call(d.url, "POST", "/estimate", {"query": (HUMAN / "queries" / "Q_3.graph").read_text(), "seed": 1,
                                            "samples": 50_000})
    assert est["seq"] == len(lines) and est["ci_low"] <= want <= est["ci_high"], (est, want)
    # `admin add --estimate` registers the query and prints its estimated matches in the live graph
    assert csmd(["admin", "--url", d.url, "--json", "add", "--query", str(HUMAN / "queries" / "Q_3.graph"),
                 "--estimate"]) == 0
    added = json.loads(capsys.readouterr().out)
    assert added["estimate"]["ci_low"] <= want <= added["estimate"]["ci_high"], added
    assert d.stop() == 0


def test_transactions_publish_exactly_the_deltas(tmp_path, kafka_bootstrap, reference):
    """Deltas and offsets commit together; a stop and restart in the middle publishes no duplicates."""
    t, cfg, port = daemon_config(tmp_path, kafka_bootstrap, delivery={"commit_interval_ms": 100},
                         kafka={"transactions": True, "transactional_id": f"tx-{time.time_ns()}"})
    lines = human_lines()
    d = DaemonProcess(cfg, tmp_path / "d1.log", port)
    t.produce(t.input, lines[:2000])
    d.wait_offset(2000)
    assert d.stop() == 0
    d = DaemonProcess(cfg, tmp_path / "d2.log", port)
    t.produce(t.input, lines[2000:])
    d.wait_offset(len(lines))
    assert d.stop() == 0
    table = t.deltas()
    _, dups = dedup(table)
    assert dups == 0
    assert rows_of(table) == reference
