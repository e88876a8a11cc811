"""The compiled reader of data graph text (model/graph_scan.py) against the line parser: the same
graph from every plain file (the datasets, seeded random files in every plain form), and every
other file left to the line parser, which decides it as before (the same graph, or the same error)."""

from __future__ import annotations

import random

import numpy as np
import pytest

import csmd.model.formats as formats
from csmd.errors import InputError
from csmd.model.formats import read_graph
from csmd.model.graph_scan import scan_graph
from helpers import dataset


def _by_line_parser(path, monkeypatch, directed=False):
    with monkeypatch.context() as m:
        m.setattr(formats, "scan_graph", None)
        return read_graph(path, directed=directed)


def _same(a, b):
    for field in ("labels", "indptr", "indices", "elabels", "ext_ids"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field
    assert (a.edge_ts is None) == (b.edge_ts is None)
    if a.edge_ts is not None:
        assert all(np.array_equal(x, y) for x, y in zip(a.edge_ts, b.edge_ts))
    assert a.directed == b.directed


@pytest.mark.parametrize("name", ["human", "yeast"])
def test_a_dataset_reads_as_the_line_parser_reads_it(name, monkeypatch):
    path = dataset(name) / "data.graph"
    assert scan_graph(path) is not None  # plain: the scanner read it
    _same(read_graph(path), _by_line_parser(path, monkeypatch))


def _random_file(rng: random.Random) -> str:
    """A plain graph file: shuffled ids (negative ones too), degrees or not, edge labels and ts or
    not, comments, blank lines, tabs, runs of spaces, CRLF endings, a header or not."""
    n = rng.randint(1, 40)
    ids = rng.sample(range(-50, 10**17), n)
    edges = {(rng.randrange(n), rng.randrange(n)) for _ in range(rng.randint(0, 3 * n))}
    sep = lambda: rng.choice([" ", "\t", "  ", " \t "])  # noqa: E731
    lines = [f"t{sep()}{n}{sep()}{len(edges)}"] if rng.random() < 0.5 else []
    for i, v in enumerate(ids):
        deg = f"{sep()}{rng.randint(0, 9)}" if rng.random() < 0.3 else ""
        lines.append(f"v{sep()}{v}{sep()}{rng.randint(0, 3)}{deg}")
        if rng.random() < 0.1:
            lines.append(rng.choice(["", "   ", "# a comment: v 1 2", "\t#x"]))
    for a, b in edges:
        extra = ""
        if rng.random() < 0.7:
            extra = f"{sep()}{rng.randint(0, 2)}"
            if rng.random() < 0.3:
                extra += f"{sep()}{rng.randint(-10**15, 10**15)}"
        lines.append(f"e{sep()}{ids[a]}{sep()}{ids[b]}{extra}" + rng.choice(["", " ", "\t"]))
    end = rng.choice(["\n", "\r\n"])
    return end.join(lines) + rng.choice(["", end])


@pytest.mark.parametrize("seed", range(40))
def test_a_random_plain_file_reads_as_the_line_parser_reads_it(tmp_path, seed, monkeypatch):
    rng = random.Random(seed)
    path = tmp_path / "g.graph"
    path.write_bytes(_random_file(rng).encode())
    directed = seed % 4 == 0
    try:
        expected = _by_line_parser(path, monkeypatch, directed)
    except InputError as exc:  # a pair given two labels: the same error either way
        with pytest.raises(InputError) as got:
            read_graph(path, directed=directed)
        assert str(got.value) == str(exc)
        return
    assert scan_graph(path) is not None
    _same(read_graph(path, directed=directed), expected)


PLAIN = "t 3 2\nv 1 0\nv 2 1 5\nv 3 0\ne 1 2 0\ne 2 3 1 17\n"


@pytest.mark.parametrize("change", [
    ("v 2 1 5", "v 2 L 5"),            # a label name (or a bad label)
    ("v 2 1 5", "v +2 1 5"),           # a plus sign
    ("v 2 1 5", "v 2 -1 5"),           # a label out of range
    ("v 2 1 5", "v 2 2147483648"),     # a label past 2^31-1
    ("v 2 1 5", "v 1234567890123456789 1"),  # 19 digits
    ("v 2 1 5", "v 2"),                # a label missing
    ("v 3 0", "v 1 0"),                # a repeated vertex
    ("e 1 2 0", "e 1 9 0"),            # an unknown vertex
    ("t 3 2", "t 3 3"),                # a header that disagrees
    ("e 1 2 0", "e 1 2 0\nt 3 2"),     # a header after records
    ("e 1 2 0", "x 1 2"),              # an unknown record
    ("e 1 2 0", "e 1 2 0 1 2"),        # too many fields
    ("e 1 2 0", "e 1 2\r0"),           # a carriage return: a line break to Python
    ("e 1 2 0", "# note\re 1 3"),      # one inside a comment
    ("e 1 2 0", "e 1 2 0\x0c"),        # a form feed
    ("v 1 0", "v 1 0 é"),              # a non-ASCII byte
    ("e 1 2 0", "e1 2 0"),             # no separator after the tag
])
def test_a_file_that_is_not_plain_is_left_to_the_line_parser(tmp_path, change, monkeypatch):
    path = tmp_path / "g.graph"
    path.write_bytes(PLAIN.replace(*change).encode())
    assert scan_graph(path) is None
    try:
        expected = _by_line_parser(path, monkeypatch)
    except InputError as exc:
        with pytest.raises(InputError) as got:
            read_graph(path)
        assert str(got.value) == str(exc)
    else:
        _same(read_graph(path), expected)


def test_an_empty_or_missing_file_is_left_to_the_line_parser(tmp_path):
    (tmp_path / "empty.graph").write_text("# nothing\n\n")
    assert scan_graph(tmp_path / "empty.graph") is None
    with pytest.raises(InputError, match="no vertices"):
        read_graph(tmp_path / "empty.graph")
    assert scan_graph(tmp_path / "missing.graph") is None
    with pytest.raises(InputError, match="missing.graph"):
        read_graph(tmp_path / "missing.graph")
