"""Checkpoints while the daemon runs: one writer at a time, however slow the disk, and none written
again while nothing changed (issue 37.3). The daemon runs in this process, on the test broker, with
its checkpoint writer slowed down."""

from __future__ import annotations

import threading
import time

import pytest

from csmd.logs import get_logger
from csmd.service.checkpoint_files import read_checkpoint
import csmd.service.checkpointer as checkpointing
from csmd.service.config import load_config
from csmd.service.daemon import Daemon
from csmd.testing.kafka import Topics


@pytest.fixture
def slow_writer(monkeypatch):
    """write_checkpoint taking 0.3 s: how many run at once (at most), and each one's state."""
    seen = {"now": 0, "most": 0, "states": []}
    lock = threading.Lock()
    write = checkpointing.write_checkpoint

    def slow(directory, graph, state, *rest):
        with lock:
            seen["now"] += 1
            seen["most"] = max(seen["most"], seen["now"])
        try:
            time.sleep(0.3)
            return write(directory, graph, state, *rest)
        finally:
            with lock:
                seen["now"] -= 1
                seen["states"].append(state)

    monkeypatch.setattr(checkpointing, "write_checkpoint", slow)
    return seen


def test_a_slow_writer_runs_alone_and_an_idle_daemon_writes_nothing_new(tmp_path, kafka_bootstrap, slow_writer):
    t = Topics(kafka_bootstrap)
    cfg = load_config(None, env={
        "CSMD_KAFKA__BOOTSTRAP": kafka_bootstrap, "CSMD_KAFKA__GROUP": f"g-{t.input}",
        "CSMD_TOPICS__INPUT": t.input, "CSMD_TOPICS__OUTPUT": t.output, "CSMD_TOPICS__CONTROL": t.control,
        "CSMD_TOPICS__DEAD_LETTER": t.dead_letter, "CSMD_CHECKPOINT__DIR": str(tmp_path / "ckpt"),
        "CSMD_CHECKPOINT__INTERVAL_S": "0.02",  # far shorter than a write
        "CSMD_ADMIN__LISTEN": ""})
    d = Daemon(cfg, get_logger())
    runner = threading.Thread(target=lambda: slow_writer.update(code=d.run()))
    runner.start()
    try:
        for i in range(40):  # a stream over 2 s: some 100 intervals, each with new records
            t.produce(t.input, [f"e {i} {i + 1}"])
            time.sleep(0.05)
        deadline = time.monotonic() + 30
        while d.status != "running" or d.next_offsets.get(0) != 40 or d.tracker.pending():
            assert time.monotonic() < deadline, "the daemon did not take the stream in"
            time.sleep(0.05)
        time.sleep(1.0)  # the last checkpoint of the stream, then idle intervals
        written = len(slow_writer["states"])
        time.sleep(1.0)
        assert len(slow_writer["states"]) == written, "an idle daemon wrote its last checkpoint again"
    finally:
        d.stopping.set()
        runner.join(60)
    assert slow_writer["code"] == 0
    assert slow_writer["most"] == 1
    assert 2 <= written <= 12  # each write took 0.3 s of the 2 s: no pile-up behind the slow ones
    seqs = [s["seq"] for s in slow_writer["states"]]
    assert seqs == sorted(set(seqs)), "a sequence number was written twice"
    newest = read_checkpoint(tmp_path / "ckpt")
    assert newest.state["offsets"] == {"0": 40} and newest.graph.num_edges == 40
    assert not list((tmp_path / "ckpt").glob(".tmp-*"))
