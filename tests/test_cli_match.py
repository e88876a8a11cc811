"""`csmd match` as a user runs it: JSON lines, tables, directories, limits that stop promptly."""

import json
import time

from csmd.cli import main

from helpers import dataset, read_expected


def clique_file(path, n):
    lines = [f"v {i} 0" for i in range(n)] + [f"e {i} {j} 0" for i in range(n) for j in range(i + 1, n)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_directory_of_queries_json(capsys):
    root = dataset("hprd")
    expected = read_expected(root / "expected_counts.txt")
    assert main(["match", "--backend", "cpu", "--json", "--data", str(root / "data.graph"), "--query",
                 str(root / "queries" / "query_dense_16_1.graph"), str(root / "queries" / "query_dense_16_2.graph")]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["query"] for r in rows] == ["query_dense_16_1", "query_dense_16_2"]
    for r in rows:
        assert r["matches"] == expected[r["query"]] and r["complete"] is True and r["seconds"] >= 0


def test_directory_expands_in_natural_order(tmp_path, capsys):
    data = clique_file(tmp_path / "k5.graph", 5)
    qdir = tmp_path / "queries"
    qdir.mkdir()
    for k in (2, 10, 3):
        clique_file(qdir / f"Q_{k if k < 6 else 4}_{k}.graph", k if k < 6 else 4)
    assert main(["match", "--data", str(data), "--query", str(qdir)]) == 0
    out = capsys.readouterr().out.splitlines()
    names = [line.split()[0] for line in out[1:-1]]
    assert names == ["Q_2_2", "Q_3_3", "Q_4_10"]
    counts = [int(line.split()[1]) for line in out[1:-1]]
    assert counts == [20, 60, 120]  # 5*4, 5*4*3, 5*4*3*2 embeddings
    assert out[-1].split() == ["total", "200"]


def test_time_limit_stops_a_huge_search_promptly(tmp_path, capsys):
    data = clique_file(tmp_path / "k80.graph", 80)
    query = clique_file(tmp_path / "k7.graph", 7)  # 80!/73! ~ 1.6e13 embeddings: hours on a CPU
    t0 = time.monotonic()
    assert main(["match", "--json", "--time-limit", "1.5", "--data", str(data), "--query", str(query)]) == 0
    elapsed = time.monotonic() - t0
    res = json.loads(capsys.readouterr().out)
    assert res["complete"] is False and res["matches"] > 0
    assert elapsed < 5, elapsed


def test_limit_reports_incomplete(tmp_path, capsys):
    data = clique_file(tmp_path / "k30.graph", 30)
    query = clique_file(tmp_path / "k4.graph", 4)
    assert main(["match", "--json", "--limit", "1000", "--data", str(data), "--query", str(query)]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["matches"] == 1000 and res["complete"] is False
    assert main(["match", "--json", "--distinct", "--data", str(data), "--query", str(query)]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["matches"] == 27405 and res["complete"] is True  # C(30, 4) instances of K4
