"""All 200 HPRD queries give exactly the published embedding counts on the CPU engines (compiled, numpy)."""

import pytest

from csmd.cpu import compiled, matcher
from csmd.model.formats import read_graph, read_query
from csmd.model.plan import plan_query

from helpers import dataset, read_expected


@pytest.fixture(scope="module")
def hprd():
    root = dataset("hprd")
    return root, read_graph(root / "data.graph"), read_expected(root / "expected_counts.txt")


@pytest.mark.parametrize("search", [compiled.search, matcher.search], ids=["cpu", "numpy"])
def test_all_hprd_queries_match_expected_counts(hprd, search):
    root, g, expected = hprd
    assert len(expected) == 200
    wrong = {}
    for name, count in expected.items():
        res = search(g, plan_query(g, read_query(root / "queries" / f"{name}.graph")))
        if res.count != count or not res.complete:
            wrong[name] = (res.count, count)
    assert wrong == {}
