"""The human insertion stream gives exactly the reference systems' totals for Q_1..Q_40."""

import pytest

from conftest import dataset, read_expected
from csmd.formats import read_graph, read_query
from csmd.replay import replay


@pytest.mark.parametrize("batch_size", [64])
def test_human_insertion_stream_all_40_queries_at_once(batch_size):
    root = dataset("human")
    expected = read_expected(root / "expected_insert_counts.txt")
    assert len(expected) == 40
    queries = [(name, read_query(root / "queries" / f"{name}.graph")) for name in expected]
    results, pipe = replay(read_graph(root / "data.graph"), root / "insertion.graph", queries,
                           batch_size=batch_size, count_only=True, show_progress=False)
    got = {r["query"]: (r["positive"], r["negative"]) for r in results}
    assert got == {name: (count, 0) for name, count in expected.items()}
    assert results[0]["updates"] == 4314
    assert pipe.mvg.live_versions == pipe.mvg.n  # drained: one version per vertex is left
