"""The human insertion stream gives exactly the reference systems' totals for Q_1..Q_40."""

import pytest

from csmd.jobs.replay import replay
from csmd.model.formats import read_graph, read_query

from helpers import dataset, read_expected


@pytest.mark.parametrize("batch_size", [64])
def test_human_insertion_stream_all_40_queries_at_once(batch_size, backend):
    root = dataset("human")
    expected = read_expected(root / "expected_insert_counts.txt")
    assert len(expected) == 40
    queries = [(name, read_query(root / "queries" / f"{name}.graph")) for name in expected]
    results, pipe = replay(read_graph(root / "data.graph"), root / "insertion.graph", queries,
                           batch_size=batch_size, count_only=True, show_progress=False, backend=backend)
    got = {r["query"]: (r["positive"], r["negative"]) for r in results}
    assert got == {name: (count, 0) for name, count in expected.items()}
    assert results[0]["updates"] == 4314
    assert pipe.engine_stats()["live_versions"] == pipe.vertices.n  # drained: one version per vertex is left


def test_replay_cli_json_and_deltas_file(tmp_path, capsys):
    import json

    import pyarrow.ipc as ipc

    from csmd.cli import main

    root = dataset("human")
    expected = read_expected(root / "expected_insert_counts.txt")
    out = tmp_path / "deltas.arrow"
    assert main(["replay", "--json", "--batch-size", "7", "--data", str(root / "data.graph"), "--stream",
                 str(root / "insertion.graph"), "--query", str(root / "queries" / "Q_2.graph"),
                 str(root / "queries" / "Q_26.graph"), "--output", str(out)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["query"], r["positive"], r["negative"], r["updates"]) for r in rows] == [
        ("Q_2", expected["Q_2"], 0, 4314), ("Q_26", expected["Q_26"], 0, 4314)]
    table = ipc.open_file(out).read_all()
    assert table.num_rows == expected["Q_2"] + expected["Q_26"]
    seqs = table.column("seq").to_pylist()
    assert seqs == sorted(seqs) and set(table.column("sign").to_pylist()) == {1}
    lines = (root / "insertion.graph").read_text().splitlines()
    first = table.slice(0, 1).to_pylist()[0]
    _, u, v, _ = lines[first["seq"]].split()  # seq k is line k + 1 of an insertion-only stream
    assert first["source"].endswith(f"insertion.graph:{first['seq'] + 1}")
    assert {int(u), int(v)} <= set(first["vertices"])
