"""Label names: files and records written with names mean what the numbers mean.

Truth: the same graph, query and stream written with numbers (the human sample and its expected
counts); a name stands for its number, so every count must be the same.
"""

from __future__ import annotations

import json
import re

import pytest

from csmd.cli import main
from csmd.connectors.records import BadRecord, Record, decode_updates
from csmd.errors import CsmdError
from csmd.model.formats import parse_query_text
from csmd.model.labels import LabelNames
from csmd.service.admin import call
from csmd.service.config import load_config
from csmd.service.control import control_request
from csmd.testing.kafka import HUMAN, DaemonProcess, Topics, config_text, new_admin_port

from helpers import arrow_message

NAMES = LabelNames({"account": 0, "device": 1, "card": 2}, {"transfer": 0, "login": 1})
QUERIES = ["Q_1", "Q_5", "Q_8"]


def _named(text: str, vertex: dict, edge: dict) -> str:
    """`text` (graph, query or stream lines) with every label written as its name where it has one."""
    def line(m):
        tag, rest = m.group(1), m.group(2).split()
        if tag == "v" and len(rest) >= 2:
            rest[1] = vertex.get(int(rest[1]), rest[1])
        elif tag in ("e", "-e") and len(rest) == 3:
            rest[2] = edge.get(int(rest[2]), rest[2])
        return " ".join([tag, *rest])
    return re.sub(r"^(-?[ev])\s+(.*)$", line, text, flags=re.M)


@pytest.fixture(scope="module")
def named(tmp_path_factory):
    """The human sample with every vertex label n called kind<n> (n = 0, 1, 2 account, device, card) and
    edge label 0 transfer, and the TOML file of those names; some labels stay numbers (names and numbers mix)."""
    root = tmp_path_factory.mktemp("named")
    used = {int(x) for line in (HUMAN / "data.graph").read_text().splitlines() if line.startswith("v ")
            for x in line.split()[2:3]}
    vertex = {n: ("account", "device", "card")[n] if n < 3 else f"kind{n}" for n in sorted(used) if n % 7 != 6}
    edge = {0: "transfer"}
    (root / "labels.toml").write_text("labels = { " + ", ".join(f"{v} = {k}" for k, v in vertex.items()) + " }\n"
                                      "edge_labels = { transfer = 0, login = 1 }\n")
    for name in ("data.graph", "insertion.graph"):
        (root / name).write_text(_named((HUMAN / name).read_text(), vertex, edge))
    (root / "queries").mkdir()
    for q in QUERIES:
        (root / "queries" / f"{q}.graph").write_text(_named((HUMAN / "queries" / f"{q}.graph").read_text(), vertex, edge))
    assert "account" in (root / "data.graph").read_text() and "transfer" in (root / "insertion.graph").read_text()
    return root


def _json_rows(capsys, argv) -> dict:
    assert main(argv) == 0, capsys.readouterr().err
    return {r["query"]: r for r in map(json.loads, capsys.readouterr().out.splitlines())}


def test_named_files_give_the_numbers_counts_in_match_estimate_and_replay(named, capsys):
    labels = ["--labels", str(named / "labels.toml")]
    for cmd, keys, extra in (("match", ("matches",), []), ("estimate", ("estimate",), ["--samples", "2000"]),
                             ("replay", ("positive", "negative", "ignored"), ["--stream"])):
        runs = []
        for root, more in ((HUMAN, []), (named, labels)):
            stream = [str(root / "insertion.graph")] if cmd == "replay" else []
            argv = [cmd, "--json", "--backend", "cpu", "--data", str(root / "data.graph"), *extra, *stream, *more,
                    "--query", *(str(root / "queries" / f"{q}.graph") for q in QUERIES)]
            runs.append({q: tuple(r[k] for k in keys) for q, r in _json_rows(capsys, argv).items()})
        assert runs[0] == runs[1], cmd
    assert all(v[1] == 0 for v in runs[0].values()) and any(v[0] for v in runs[0].values())  # replay did match


@pytest.mark.parametrize("text, labels, message", [
    ("v 0 acount\nv 1 device\ne 0 1\n", True,
     "q.graph:1: unknown vertex label 'acount' (did you mean 'account'?); names: account, device, card"),
    ("v 0 account\nv 1 device\ne 0 1 transfr\n", True, "q.graph:3: unknown edge label 'transfr'"),
    ("v 0 account\nv 1 1\ne 0 1 login\n", False, "q.graph:1: bad integer 'account' for vertex label"),
    ("v 0 account\nv 1 -1\ne 0 1\n", True, "q.graph:2: vertex label -1 out of range"),
])
def test_unknown_names_are_errors_at_their_line(tmp_path, capsys, text, labels, message):
    (tmp_path / "q.graph").write_text(text)
    (tmp_path / "l.toml").write_text("labels = { account = 0, device = 1, card = 2 }\nedge_labels = { login = 1 }\n")
    argv = ["match", "--backend", "cpu", "--data", str(HUMAN / "data.graph"), "--query", str(tmp_path / "q.graph")]
    assert main(argv + (["--labels", str(tmp_path / "l.toml")] if labels else [])) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err


def test_an_unknown_name_in_a_stream_stops_replay_at_its_line(named, tmp_path, capsys):
    stream = tmp_path / "s.txt"
    stream.write_text("e 0 1 transfer\ne 0 2 0\ne 1 2 wire\n")
    argv = ["replay", "--backend", "cpu", "--data", str(named / "data.graph"), "--stream", str(stream),
            "--labels", str(named / "labels.toml"), "--query", str(named / "queries" / "Q_1.graph")]
    assert main(argv) == 2
    assert f"{stream}:3: unknown edge label 'wire'" in capsys.readouterr().err


@pytest.mark.parametrize("text, message", [
    ("labels = { 7 = 1 }\n", "labels: name '7' must be one word"),
    ("labels = { '#a' = 1 }\n", "labels: name '#a' must be one word"),
    ("labels = { 'a b' = 1 }\n", "labels: name 'a b' must be one word"),
    ("labels = { a = -1 }\n", "labels: a must be a label number in 0 .. 2^31-1, got -1"),
    ("labels = { a = '1' }\n", "labels: a must be a label number"),
    ("edge_labels = { a = 1, b = 1 }\n", "edge_labels: a and b both name label 1"),
    ("labels = 3\n", "labels must be a table"),
    ("lables = { a = 1 }\n", "unknown key(s) lables"),
    ("labels = {\n", "not valid TOML"),
])
def test_bad_label_files_are_one_line_errors(tmp_path, capsys, text, message):
    (tmp_path / "l.toml").write_text(text)
    argv = ["match", "--data", str(HUMAN / "data.graph"), "--query", str(HUMAN / "queries" / "Q_1.graph"),
            "--labels", str(tmp_path / "l.toml")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'l.toml'}: " in err and message in err and "Traceback" not in err, err


def test_a_daemon_config_serves_as_labels_file_and_config_errors_name_the_key(tmp_path):
    cfg = tmp_path / "d.toml"
    cfg.write_text("[graph]\nlabels = { account = 0 }\nedge_labels = { transfer = 0 }\n[log]\nlevel = 'info'\n")
    assert LabelNames.load(cfg) == LabelNames({"account": 0}, {"transfer": 0})
    assert load_config(cfg, env={}).graph.labels == {"account": 0}
    assert load_config(None, env={"CSMD_GRAPH__EDGE_LABELS": "{ login = 1 }"}).graph.edge_labels == {"login": 1}
    cfg.write_text("[graph]\nlabels = { account = 0, card = 0 }\n")
    with pytest.raises(CsmdError, match=r"d.toml: \[graph\] labels: account and card both name label 0"):
        load_config(cfg, env={})
    with pytest.raises(CsmdError, match=r"CSMD_GRAPH__LABELS: \[graph\] labels: name '1'"):
        load_config(None, env={"CSMD_GRAPH__LABELS": "{ 1 = 2 }"})


def test_records_and_control_queries_take_names():
    want = [("v", 5, -1, 1), ("e", 5, 6, 1), ("-e", 5, 6, 0), ("e", 5, 7, 3)]
    text = b"v 5 device\ne 5 6 login\n-e 5 6 transfer\ne 5 7 3\n"
    js = json.dumps([{"op": "v", "u": 5, "label": "device"}, {"op": "e", "u": 5, "v": 6, "label": "login"},
                     {"op": "-e", "u": 5, "v": 6, "label": "transfer"}, {"op": "e", "u": 5, "v": 7, "label": 3}])
    arrow = arrow_message(dict(op=["v", "e", "-e", "e"], u=[5, 5, 5, 5], v=[None, 6, 6, 7],
                               label=["device", "login", "transfer", "3"]))
    for value in (text, js.encode(), arrow):
        got = decode_updates(Record("in", 0, 1, value), labels=NAMES) if value is not arrow else None
        if value is arrow:  # a string column is names only: "3" is not one
            with pytest.raises(BadRecord, match="row 3: unknown edge label '3'"):
                decode_updates(Record("in", 0, 1, value), labels=NAMES)
            three = arrow_message(dict(op=["v", "e", "-e"], u=[5, 5, 5], v=[None, 6, 6],
                                       label=["device", "login", "transfer"]))
            got = decode_updates(Record("in", 0, 1, three), labels=NAMES)
            assert [(u.op, u.u, u.v, u.label) for u in got] == want[:3]
            continue
        assert [(u.op, u.u, u.v, u.label) for u in got] == want
    for value, reason in ((b'{"op": "v", "u": 5, "label": "transfer"}', "record: unknown vertex label 'transfer'"),
                          (b'{"op": "e", "u": 5, "v": 6, "label": "device"}', "record: unknown edge label 'device'"),
                          (b"v 5 devise", "unknown vertex label 'devise' (did you mean 'device'?)"),
                          (b"e 1 2\ne 2 3 x", "line 2: unknown edge label 'x'")):
        with pytest.raises(BadRecord, match=re.escape(reason)):
            decode_updates(Record("in", 0, 1, value), labels=NAMES)
    with pytest.raises(BadRecord, match="vertex label 'device' is not a number, and no vertex label names are defined"):
        decode_updates(Record("in", 0, 1, b'{"op": "v", "u": 5, "label": "device"}'))
    q = parse_query_text("v 0 account\nv 1 card\ne 0 1 login\n", "q", NAMES)
    assert q.labels.tolist() == [0, 2] and q.elabels.tolist() == [1, 1]
    body = json.dumps({"op": "add", "name": "q", "query": "v 0 account\nv 1 cardd\ne 0 1\n"}).encode()
    with pytest.raises(CsmdError, match="request query q:2: unknown vertex label 'cardd'"):
        control_request(body, "request", NAMES)


def test_the_daemon_reads_names_in_its_graph_queries_records_and_admin_requests(tmp_path, kafka_bootstrap, named):
    """The named sample in the daemon: [graph] labels for the initial graph, the configured query, one
    added at run time and the records (text with names, JSON with names); totals as the numbers give them."""
    t = Topics(kafka_bootstrap)
    port = new_admin_port()
    cfg = tmp_path / "d.toml"
    names = LabelNames.load(named / "labels.toml")
    cfg.write_text(config_text(t, [], admin_port=port, graph={"initial": str(named / "data.graph")},
                               queries={"paths": [str(named / "queries" / "Q_1.graph")]}))
    env = {f"CSMD_GRAPH__{key}": "{ " + ", ".join(f"{k} = {v}" for k, v in table.items()) + " }"
           for key, table in (("LABELS", names.vertex), ("EDGE_LABELS", names.edge))}
    d = DaemonProcess(cfg, tmp_path / "d.log", port, env)
    added = call(d.url, "POST", "/queries", {"name": "Q_5", "query": (named / "queries" / "Q_5.graph").read_text()})
    assert added.get("error") is None, added
    with pytest.raises(CsmdError, match="unknown vertex label 'acount'"):
        call(d.url, "POST", "/queries", {"name": "bad", "query": "v 0 acount\n"})
    lines = (named / "insertion.graph").read_text().splitlines()
    records = [json.dumps({"op": "e", "u": int(p[1]), "v": int(p[2]), "label": p[3], "amount": 1})
               if i % 3 == 0 else line for i, line in enumerate(lines) if (p := line.split())]
    t.produce(t.input, records + ["e 1 2 wire"])
    d.wait_offset(len(records) + 1)
    stats = d.get("/stats")["queries"]
    replayed = _json_rows_of_replay(named)
    assert {q: stats[q]["positive"] for q in ("Q_1", "Q_5")} == {q: replayed[q] for q in ("Q_1", "Q_5")}
    dead = t.read(t.dead_letter)
    assert [dict(m.headers())["csmd-error"] for m in dead] == [b"unknown edge label 'wire'; names: transfer, login"]
    assert d.stop() == 0


def _json_rows_of_replay(root) -> dict:
    from csmd.jobs.replay import replay
    from csmd.model.formats import read_graph, read_query

    names = LabelNames.load(root / "labels.toml")
    res, _ = replay(read_graph(root / "data.graph", labels=names), root / "insertion.graph",
                    [(q, read_query(root / "queries" / f"{q}.graph", names)) for q in ("Q_1", "Q_5")],
                    batch_size=64, count_only=True, show_progress=False, labels=names)
    return {r["query"]: r["positive"] for r in res}
