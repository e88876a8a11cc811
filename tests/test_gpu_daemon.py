"""The daemon on the GPU engine: `[pipeline] backend = "auto"` takes it where there is a GPU
(the Kafka tests of test_kafka_daemon / test_kafka_hardening then run on it too), and a device
failure stops the daemon without a wrong delta or a commit past what was delivered.

Truth: `csmd replay` on the CPU engine (the reference fixture of test_kafka_daemon).
"""

from __future__ import annotations

import pytest

import numpy as np

from csmd.cpu.numpy_engine import CpuMatcher
from csmd.backends import gpu_unavailable_reason
from csmd.model.formats import read_graph, read_query
from csmd.model.graph import Graph
from csmd.service.admin import call
from csmd.testing.kafka import CSMD, HUMAN, DaemonProcess, daemon_config, dedup, human_lines, rows_of

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(gpu_unavailable_reason() is not None, reason=str(gpu_unavailable_reason()))]


def _final_graph(lines) -> Graph:
    """The human graph after its insertion stream, built on the host."""
    g0 = read_graph(HUMAN / "data.graph")
    index = {int(x): i for i, x in enumerate(g0.ext_ids)}
    src, dst, lab = g0.edge_list()
    new = np.array([[index[int(w)] for w in line.split()[1:3]] for line in lines], np.int64)
    return Graph.from_edges(g0.labels, np.concatenate([src, new[:, 0]]), np.concatenate([dst, new[:, 1]]),
                            np.concatenate([lab, np.zeros(len(new), np.int32)]))


def skip_unless(gpus: int) -> None:
    from csmd.gpu.replicas import device_ids

    if gpus > len(device_ids("all")):
        pytest.skip(f"{gpus} GPUs: this host has {len(device_ids('all'))}")


@pytest.mark.parametrize("gpus", [1, 2])
def test_auto_runs_the_daemon_on_the_gpu_and_its_deltas_equal_the_cpu_replay(tmp_path, kafka_bootstrap, reference,
                                                                             gpus):
    """With `gpus = 2` one daemon drives two devices (gpu/replicas.py), its admin match too."""
    skip_unless(gpus)
    t, cfg, port = daemon_config(tmp_path, kafka_bootstrap, pipeline={"backend": "auto", "gpus": gpus})
    d = DaemonProcess(cfg, tmp_path / "d.log", port)
    lines = human_lines()
    t.produce(t.input, lines)
    stats = d.wait_offset(len(lines))
    memory = [float(line.rsplit(" ", 1)[1]) for line in d.get("/metrics").splitlines()
              if line.startswith("csmd_device_memory_bytes")]
    assert memory and memory[0] > 0, "the GPU engine reports the device memory it holds"
    assert stats["gc_live_versions"] > 0
    # the admin static query runs on the GPU against the live graph
    q = HUMAN / "queries" / "Q_2.graph"
    got = call(d.url, "POST", "/match", {"query": q.read_text()})
    assert got["backend"] == "gpu" and got["seq"] == len(lines)
    assert got["matches"] == CpuMatcher().match(_final_graph(lines), read_query(q)).count
    deduped, _ = dedup(t.deltas())
    assert rows_of(deduped) == reference
    assert d.stop() == 0


@pytest.mark.parametrize("gpus", [1, 2])
def test_device_out_of_memory_stops_the_daemon_without_a_commit_and_a_restart_delivers_everything(
        tmp_path, kafka_bootstrap, reference, gpus):
    """CuPy's pool limited to less than the executor's search needs: a device fails, at the
    start's warm-up (which runs a search before the stream) or in the first batch; with
    `gpus = 2`, whichever of the two fails first. The daemon must exit 1 with a log line naming
    the failure, commit nothing (nothing was delivered), and a restart with the memory it needs
    delivers every delta."""
    import os
    import subprocess

    skip_unless(gpus)
    t, cfg, port = daemon_config(tmp_path, kafka_bootstrap, pipeline={"backend": "gpu", "gpus": gpus})
    lines = human_lines()
    t.produce(t.input, lines)
    with open(tmp_path / "d1.log", "ab") as log:  # not DaemonProcess: it may never be healthy
        first = subprocess.run([*CSMD, "run", "--config", str(cfg)], stdout=subprocess.DEVNULL, stderr=log,
                               env={**os.environ, "CUPY_GPU_MEMORY_LIMIT": str(24 << 20)}, timeout=120)
    assert first.returncode == 1
    log = (tmp_path / "d1.log").read_text()
    assert "OutOfMemoryError" in log and "Traceback (most recent call last)" not in log.splitlines()[-1], log[-3000:]
    assert t.committed(f"g-{t.input}") < 0, "nothing was delivered, so nothing is committed"
    d = DaemonProcess(cfg, tmp_path / "d2.log", port)
    d.wait_offset(len(lines))
    deduped, _ = dedup(t.deltas())
    assert rows_of(deduped) == reference
    assert d.stop() == 0
