"""Every malformed input fails with file, line and reason, a non-zero exit and no traceback."""

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

CSMD = [sys.executable, "-m", "csmd"]
GOOD_QUERY = "t 2 1\nv 0 1 1\nv 1 2 1\ne 0 1\n"
GOOD_DATA = "t 3 2\nv 0 1 1\nv 1 2 2\nv 2 1 1\ne 0 1\ne 1 2\n"


def run_match(tmp_path: Path, data: str | Path, query: str | Path):
    def materialize(x, name):
        if isinstance(x, Path):
            return x
        p = tmp_path / name
        p.write_text(x)
        return p

    d, q = materialize(data, "data.graph"), materialize(query, "query.graph")
    proc = subprocess.run(CSMD + ["match", "--data", str(d), "--query", str(q)], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    return proc.stderr.strip()


CASES = [
    # (data, query, expected message fragment): the fragment names file:line and the reason
    ("t 2 1\nv 0 1 1\nv 1 2 1\ne 0 7\n", GOOD_QUERY, "data.graph:4: edge (0, 7) names unknown vertex 7"),
    ("t 2 1\nv 0 1 1\nv x 2 1\ne 0 1\n", GOOD_QUERY, "data.graph:3: bad integer 'x' for vertex id"),
    ("t 2 1\nv 0 1 1\nv 1 2 1\ne 0 1 0 5 6\n", GOOD_QUERY,
     "data.graph:4: wrong field count: 'e' takes u v [label [ts]], got 5 fields"),
    ("t 2 1\nv 0 1 1\nv 0 2 1\ne 0 1\n", GOOD_QUERY, "data.graph:3: duplicate vertex id 0"),
    ("v 0 1\nv 1\ne 0 1 0\n", GOOD_QUERY, "data.graph:2: vertex 1: label missing"),
    ("v 0 1\nv 1 -3\n", GOOD_QUERY, "data.graph:2: vertex label -3 out of range"),
    ("# comment\nv 0 1\nx 1 2\n", GOOD_QUERY, "data.graph:3: unknown record type 'x'"),
    ("t 3 1\nv 0 1 1\nv 1 2 1\ne 0 1\n", GOOD_QUERY, "data.graph:1: header says 3 vertices and 1 edges, file has 2 and 1"),
    ("v 0 1\nt 1 0\n", GOOD_QUERY, "data.graph:2: 't' header must be the first record"),
    ("# nothing\n", GOOD_QUERY, "data.graph: no vertices"),
    (GOOD_DATA, "t 3 1\nv 0 1 1\nv 1 2 1\nv 2 1 0\ne 0 1\n", "query.graph: query is disconnected (vertex 2 is not reachable from vertex 0)"),
    (GOOD_DATA, "".join(f"v {i} 1\n" for i in range(33)) + "".join(f"e {i} {i + 1} 0\n" for i in range(32)),
     "query.graph: query has 33 vertices; at most 32 are supported"),
    (GOOD_DATA, "t 2 1\nv 0 1 1\nv 1 2 1\ne 0 1 zz\n", "query.graph:4: bad integer 'zz' for edge label"),
    (GOOD_DATA, "v 0 1\nv 1 2\ne 0 1\ne 1 1\n", "query.graph:4: query edge (1, 1) is a self-loop"),
    (GOOD_DATA, "v 0 1\nv 1 2\ne 0 1_0\n", "query.graph:3: bad integer '1_0' for vertex id"),
    # a pair has at most one edge: which label to keep (or to ask for) would be a guess; the same label again is fine
    ("t 2 3\nv 0 1 1\nv 1 2 1\ne 0 1 0\ne 0 1 0\ne 1 0 5\n", GOOD_QUERY,
     "data.graph:6: edge (1, 0) again, with label 5 (line 4 gave it 0): a pair has at most one edge"),
    (GOOD_DATA, "v 0 1\nv 1 2\ne 0 1 3\ne 0 1\n", "query.graph:4: edge (0, 1) again, with label 0 (line 3 gave it 3)"),
]


@pytest.mark.parametrize("data,query,message", CASES)
def test_bad_text_input(tmp_path, data, query, message):
    err = run_match(tmp_path, data, query)
    assert message in err, err
    assert err.startswith("csmd match: error: ")


def test_missing_files(tmp_path):
    assert "nope.graph: No such file or directory" in run_match(tmp_path, tmp_path / "nope.graph", GOOD_QUERY)
    assert "noq: No such file or directory" in run_match(tmp_path, GOOD_DATA, tmp_path / "noq")


def test_bad_tables(tmp_path):
    p = tmp_path / "edges.parquet"
    pq.write_table(pa.table({"source": [0], "dst": [1]}), p)
    assert "edges.parquet: missing column 'src' (has source, dst)" in run_match(tmp_path, p, GOOD_QUERY)

    pq.write_table(pa.table({"src": [0, 1], "dst": [1, 9]}), p)
    pq.write_table(pa.table({"id": [0, 1], "label": [1, 2]}), tmp_path / "edges.vertices.parquet")
    assert "edges.parquet:row 1: edge names unknown vertex 9 in dst" in run_match(tmp_path, p, GOOD_QUERY)

    pq.write_table(pa.table({"src": [0, None], "dst": [1, 0]}), p)
    assert "edges.parquet:row 1: null in column 'src'" in run_match(tmp_path, p, GOOD_QUERY)

    pq.write_table(pa.table({"id": [0, 1, 0], "label": [1, 2, 1]}), tmp_path / "edges.vertices.parquet")
    pq.write_table(pa.table({"src": [0], "dst": [1]}), p)
    assert "edges.vertices.parquet:row 2: duplicate vertex id 0" in run_match(tmp_path, p, GOOD_QUERY)

    # vertex ids are int64 or strings, one kind a graph: anything else was read as ids (floats, bools,
    # lists), failed in numpy with a traceback (mixed kinds), or broke the outputs later (uint64 >= 2^63)
    (tmp_path / "edges.vertices.parquet").unlink()
    for table, message in [
        (pa.table({"src": [0, 1], "dst": ["1", "2"]}), "column 'src' holds integer ids, 'dst' string ones"),
        (pa.table({"src": [0.0, 1.5], "dst": [1.0, 2.0]}), "column 'src' is double; vertex ids are integers or strings"),
        (pa.table({"src": [True], "dst": [False]}), "column 'src' is bool"),
        (pa.table({"src": [[0]], "dst": [[1]]}), "column 'src' is list<"),
        (pa.table({"src": pa.array([5, 2**63], pa.uint64()), "dst": pa.array([2**64 - 1, 5], pa.uint64())}),
         "edges.parquet:row 1: vertex id 9223372036854775808 in src out of range (int64"),
    ]:
        pq.write_table(table, p)
        assert message in run_match(tmp_path, p, GOOD_QUERY)
    pq.write_table(pa.table({"src": [0], "dst": [1]}), p)
    pq.write_table(pa.table({"id": ["0", "1"], "label": [1, 2]}), tmp_path / "edges.vertices.parquet")
    assert "edges.vertices.parquet: column 'id' holds string ids, the edges of edges.parquet integer ones" in \
        run_match(tmp_path, p, GOOD_QUERY)
    (tmp_path / "edges.vertices.parquet").unlink()
    pq.write_table(pa.table({"src": pa.array([2**63 - 1], pa.uint64()), "dst": pa.array([3], pa.uint8())}), p)
    (tmp_path / "q.graph").write_text("v 0 0\nv 1 0\ne 0 1\n")
    ok = subprocess.run(CSMD + ["match", "--data", str(p), "--query", str(tmp_path / "q.graph"), "--json", "--output",
                                str(tmp_path / "m.arrow")], capture_output=True, text=True)
    assert ok.returncode == 0 and '"matches": 2' in ok.stdout  # any integer type, up to 2^63-1
    assert sorted(pa.ipc.open_file(tmp_path / "m.arrow").read_all().column("vertices").to_pylist()) == \
        [[3, 2**63 - 1], [2**63 - 1, 3]]

    pq.write_table(pa.table({"src": [0, 1, 1], "dst": [1, 2, 0], "label": [4, 0, 7]}), p)
    assert "edges.parquet:row 2: edge (1, 0) again, with label 7 (row 0 gave it 4)" in run_match(tmp_path, p, GOOD_QUERY)

    garbage = tmp_path / "junk.arrow"
    garbage.write_bytes(b"\x00\x01not arrow at all")
    assert "junk.arrow: not a readable Arrow/Parquet table" in run_match(tmp_path, garbage, GOOD_QUERY)


def test_bad_arguments_are_refused(tmp_path):
    (tmp_path / "d.graph").write_text(GOOD_DATA)
    proc = subprocess.run(CSMD + ["match", "--data", str(tmp_path / "d.graph"), "--query", str(tmp_path / "d.graph"),
                                  "--limit", "-1"], capture_output=True, text=True)
    assert proc.returncode == 2 and "--limit" in proc.stderr and "Traceback" not in proc.stderr


def test_gpu_backend_without_device_is_a_clear_error(tmp_path):
    pytest.importorskip("numpy")
    from csmd.backends import gpu_unavailable_reason

    if gpu_unavailable_reason() is None:
        pytest.skip("a GPU is present")
    (tmp_path / "d.graph").write_text(GOOD_DATA)
    proc = subprocess.run(CSMD + ["match", "--backend", "gpu", "--data", str(tmp_path / "d.graph"), "--query",
                                  str(tmp_path / "d.graph")], capture_output=True, text=True)
    assert proc.returncode == 2 and "--backend gpu:" in proc.stderr and "Traceback" not in proc.stderr
