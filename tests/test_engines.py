"""Engine choice: --backend and [pipeline] backend do what they say, in one place."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

from csmd.backends import continuous_engine, gpu_unavailable_reason, static_matcher, warm_up
from csmd.errors import CsmdError
from csmd.model.graph import Graph

from helpers import ENGINES

G = Graph.from_edges(np.array([0, 0, 1], np.int32), [0, 1], [1, 2])


def test_cpu_runs_on_the_cpu_and_auto_on_the_gpu_where_there_is_one():
    assert continuous_engine("cpu", G).name == "cpu"
    assert continuous_engine("auto", G).name == ("cpu" if gpu_unavailable_reason() else "gpu")


def test_gpu_without_a_gpu_is_a_clear_error_naming_the_setting():
    if gpu_unavailable_reason() is None:
        pytest.skip("the GPU continuous engine runs here")
    with pytest.raises(CsmdError, match=r"^\[pipeline\] backend gpu: .*use \[pipeline\] backend cpu or auto"):
        continuous_engine("gpu", G, "[pipeline] backend")
    with pytest.raises(CsmdError, match="unknown backend 'tpu'"):
        continuous_engine("tpu", G)


def test_several_gpus_on_a_cpu_engine_is_a_clear_error_naming_the_setting(tmp_path):
    from csmd.backends import gpu_devices

    assert gpu_devices("cpu") == [] and gpu_devices("numpy", "all") == []
    with pytest.raises(CsmdError, match=r"^\[pipeline\] gpus 2: the cpu backend runs on the CPU( \(.*\))?; use the gpu backend"):
        gpu_devices("cpu", 2, "[pipeline] gpus")
    with pytest.raises(CsmdError, match=r"^--gpus 3: "):
        continuous_engine("numpy", G, gpus=3)
    (tmp_path / "g.graph").write_text("v 1 0\nv 2 0\ne 1 2\n")
    (tmp_path / "s.txt").write_text("e 1 3\n")
    (tmp_path / "q.graph").write_text("t 2 1\nv 0 0\nv 1 0\ne 0 1\n")
    args = [sys.executable, "-m", "csmd", "replay", "--data", tmp_path / "g.graph", "--stream", tmp_path / "s.txt",
            "--query", tmp_path / "q.graph", "--backend", "cpu", "--gpus"]
    out = subprocess.run([*args, "2"], capture_output=True, text=True)
    assert out.returncode == 2 and "--gpus 2: the cpu backend runs on the CPU" in out.stderr, out.stderr
    out = subprocess.run([*args, "0"], capture_output=True, text=True)
    assert out.returncode == 2 and "argument --gpus: must be a number of GPUs (1 or more) or all" in out.stderr
    match = [sys.executable, "-m", "csmd", "match", "--data", tmp_path / "g.graph", "--query", tmp_path / "q.graph",
             "--backend", "cpu", "--gpus"]
    out = subprocess.run([*match, "all"], capture_output=True, text=True)
    assert out.returncode == 0 and "q " in out.stdout, out.stderr  # all the GPUs of a CPU engine: none
    out = subprocess.run([*match, "2"], capture_output=True, text=True)
    assert out.returncode == 2 and "--gpus 2: the cpu backend runs on the CPU" in out.stderr, out.stderr
    with pytest.raises(CsmdError, match=r"^--gpus 4: "):
        static_matcher("numpy", 4)


def test_replay_backend_gpu_is_exit_2_with_reason(tmp_path):
    if gpu_unavailable_reason() is None:
        pytest.skip("the GPU continuous engine runs here")
    (tmp_path / "g.graph").write_text("v 1 0\nv 2 0\ne 1 2\n")
    (tmp_path / "s.txt").write_text("e 1 3\n")
    proc = subprocess.run([sys.executable, "-m", "csmd", "replay", "--backend", "gpu", "--data", str(tmp_path / "g.graph"),
                           "--stream", str(tmp_path / "s.txt"), "--query", str(tmp_path / "g.graph")],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "--backend gpu:" in proc.stderr and "Traceback" not in proc.stderr
    ok = subprocess.run([sys.executable, "-m", "csmd", "replay", "--backend", "auto", "--json", "--data",
                         str(tmp_path / "g.graph"), "--stream", str(tmp_path / "s.txt"), "--query",
                         str(tmp_path / "g.graph")], capture_output=True, text=True)
    assert ok.returncode == 0 and '"backend": "cpu"' in ok.stdout and '"positive": 2' in ok.stdout  # an edge query: both orientations


def test_cpu_falls_back_to_numpy_with_a_log_line_when_numba_cannot_be_imported(monkeypatch):
    import sys

    from structlog.testing import capture_logs

    import csmd.cpu
    import csmd.backends as engines

    for name in ("numba", "csmd.cpu.compiled", "csmd.cpu.dfs", "csmd.cpu.updater"):
        monkeypatch.setitem(sys.modules, name, None)  # an import of any of them raises ImportError
    monkeypatch.delattr(csmd.cpu, "compiled", raising=False)
    monkeypatch.setattr(engines, "_numba_missing", False)
    with capture_logs() as logs:
        assert continuous_engine("cpu", G).name == "numpy"
        assert engines.static_matcher("cpu").name == "numpy"
    assert [e["event"] for e in logs] == ["numba cannot be imported: the CPU backend runs the numpy engine"]


def test_cpu_is_the_compiled_engine_and_numpy_names_the_fallback():
    import csmd.backends as engines

    assert continuous_engine("cpu", G).name == "cpu" and engines.static_matcher("cpu").name == "cpu"
    assert continuous_engine("numpy", G).name == "numpy" and engines.static_matcher("numpy").name == "numpy"


@pytest.mark.parametrize("backend", ENGINES)
def test_warm_up_runs_every_kind_of_batch_through_a_throwaway_engine(backend):
    """The daemon's warm-up (compiled code loads before the first record) matches inserts and deletes
    of edges and vertices, counted and materialized: every delta of its tiny stream, by hand."""
    seconds, deltas = warm_up(backend)
    # on the path 0-1-2-3: e 0 2 closes 0-1-2 (+6 embeddings), e 1 3 closes 1-2-3 (+6); e 9 0 and
    # e 9 1 close nothing (9-1 has edge label 1); -e 0 2 opens 0-1-2 (-6); -v 9 takes no triangle;
    # e 0 3 closes 0-1-3 (+6); e 2 3 is a repeat (ignored)
    assert deltas == {"count": 24, "rows": 24} and seconds > 0


def test_after_the_warm_up_a_stream_and_its_compaction_compile_nothing():
    """In a fresh process with an empty numba cache: once warm_up("cpu") ran, applying, matching,
    releasing and compacting a real engine's graph finds every kernel compiled already."""
    code = """
import numpy as np
from numba.core.registry import CPUDispatcher
import csmd.cpu.arena, csmd.cpu.dfs, csmd.cpu.updater
from csmd.backends import continuous_engine, warm_up
from csmd.model.formats import parse_update
from csmd.model.graph import Graph
from csmd.pipeline.stages import Pipeline

def compiled():
    mods = (csmd.cpu.arena, csmd.cpu.dfs, csmd.cpu.updater)
    return {f"{m.__name__}.{k}": len(v.signatures) for m in mods for k, v in vars(m).items() if isinstance(v, CPUDispatcher)}

warm_up("cpu")
before = compiled()
g0 = Graph.from_edges([0] * 6, [0, 1, 2, 3], [1, 2, 3, 4], [0] * 4)
tri = Graph.from_edges([0] * 3, [0, 1, 0], [1, 2, 2], [0] * 3)
pipe = Pipeline(g0, engine=continuous_engine("cpu", g0, threads=2), batch_size=4, threaded=False)
pipe.add_query("count", tri, True)
lines = ["e 0 2 0", "e 1 3 0", "e 3 5 0", "-e 1 2 0", "e 2 4 0", "-e 0 2 0", "e 1 2 0", "e 0 5 0"]
pipe.run((parse_update(line, "t", i) for i, line in enumerate(lines)), lambda r: None)
pipe.engine.mvg.compact()
assert pipe.engine.mvg.compactions == 1
print(sorted(k for k, n in compiled().items() if n != before[k]))
"""
    with tempfile.TemporaryDirectory() as cache:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "NUMBA_CACHE_DIR": cache}).stdout
    assert out.strip() == "[]"
