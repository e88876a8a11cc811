"""The daemon's promises under bad records, restarts and backpressure; its metrics (issue 12).

Truth: `csmd replay` of the same stream (the reference fixture of test_kafka_daemon)
and the dead-letter topic read back.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter

import pyarrow as pa

from csmd.connectors.broker import EmbeddedBroker, free_port
from csmd.testing.kafka import (REPO, DaemonProcess, Proxy, Topics, daemon_config, dedup, human_lines, metric, rows_of,
                                samples)

from helpers import arrow_message


def test_an_idle_bad_record_and_ids_beyond_int64_are_dead_lettered_and_never_sent_twice(tmp_path, kafka_bootstrap):
    t, cfg, port = daemon_config(tmp_path, kafka_bootstrap, checkpoint=True)
    d = DaemonProcess(cfg, tmp_path / "d1.log", port)
    t.produce(t.input, ["x 1 2 0"])  # the first record after the start, read while nothing else is pending
    d.wait_offset(1)
    big = 2**64 - 1
    bad = {
        b"x 1 2 0": "unknown op 'x'",
        f"e 1 {big}".encode(): "out of range",
        json.dumps({"op": "e", "u": 1, "v": big}).encode(): "out of range",
        arrow_message({"op": pa.array(["e"]), "u": pa.array([1], pa.uint64()), "v": pa.array([big], pa.uint64())}):
            "out of range",
    }
    lines = human_lines()[:1000] + ["e -5 -6", "e -6 -7 1"]  # negative ids are int64 ids like any other
    t.produce(t.input, list(bad)[1:2] + lines[:100] + list(bad)[2:] + lines[100:])
    d.wait_offset(len(bad) + len(lines))
    assert d.proc.poll() is None and d.get("/health")["status"] == "running"
    dl = t.read(t.dead_letter, until=lambda m: len(m) >= len(bad))
    assert sorted(m.value() for m in dl) == sorted(bad)
    for m in dl:
        assert bad[m.value()] in dict(m.headers())["csmd-error"].decode()
    assert d.stop() == 0, "the shutdown checkpoint holds only int64 ids"
    deltas_before = len(t.deltas())
    assert deltas_before > 0
    # a start without the checkpoint re-reads every record, all below the committed offset
    shutil.rmtree(tmp_path / "ckpt")
    d = DaemonProcess(cfg, tmp_path / "d2.log", port)
    d.wait_offset(len(bad) + len(lines))
    metrics = d.get("/metrics")
    assert metric(metrics, "csmd_updates_total") == len(lines)
    assert sum(v for (name, _), v in samples(metrics).items() if name == "csmd_deltas_total") == 0, \
        "re-read deltas were not published"
    assert d.stop() == 0
    assert len(t.read(t.dead_letter)) == len(bad), "dead letters of re-read records are not sent again"
    assert len(t.deltas()) == deltas_before


def test_committed_offsets_never_go_back_after_a_restart_from_an_older_checkpoint(tmp_path, kafka_bootstrap,
                                                                                  reference):  # noqa: F811
    t, cfg, port = daemon_config(tmp_path, kafka_bootstrap, checkpoint=True)
    cfg.write_text(cfg.read_text().replace("interval_s = 0.5", "interval_s = 3600"))  # at shutdown only
    group = f"g-{t.input}"
    lines = human_lines()
    d = DaemonProcess(cfg, tmp_path / "d1.log", port)
    t.produce(t.input, lines[:1000])
    d.wait_offset(1000)
    assert d.stop() == 0  # a checkpoint at 1000
    d = DaemonProcess(cfg, tmp_path / "d2.log", port)
    t.produce(t.input, lines[1000:2500])
    d.wait_offset(2500)
    deadline = time.monotonic() + 30
    while t.committed(group) < 2500:
        assert time.monotonic() < deadline, "offsets were not committed"
        time.sleep(0.05)
    d.stop(signal.SIGKILL)
    seen = []
    d = DaemonProcess(cfg, tmp_path / "d3.log", port)  # restores the checkpoint at 1000
    t.produce(t.input, lines[2500:])
    while d.get("/stats")["offsets"].get("0", 0) < len(lines) or d.get("/stats")["pending_records"]:
        seen.append(t.committed(group))
    time.sleep(0.5)
    seen.append(t.committed(group))
    assert min(seen) >= 2500, f"the committed offset went back: {sorted(set(seen))[:5]}"
    assert seen[-1] == len(lines)
    table = t.deltas()
    _, dups = dedup(table)
    assert dups == 0, "records below the committed offset were published again"
    assert rows_of(table) == reference
    assert d.stop() == 0


def test_a_failed_delivery_stops_the_daemon_in_bounded_time_and_a_restart_delivers_everything(
        tmp_path, reference):  # noqa: F811
    """The broker becomes unreachable mid-stream: deltas cannot be delivered. The daemon must
    stop (non-zero, within the delivery timeout and a bound) without committing past an
    undelivered delta; once the broker is back, a restart delivers every delta."""
    port = free_port()
    with EmbeddedBroker(log_path=tmp_path / "broker.log", advertise=port) as broker:
        proxy = Proxy(port, broker.port).start()
        t, cfg, admin = daemon_config(tmp_path, f"127.0.0.1:{port}", delivery={"timeout_s": 2.0})
        lines = human_lines()
        t.produce(t.input, lines)
        d = DaemonProcess(cfg, tmp_path / "d1.log", admin)
        while d.get("/stats")["offsets"].get("0", 0) < 300:
            pass
        proxy.cut()
        t0 = time.monotonic()
        code = d.proc.wait(30)
        assert code == 1 and time.monotonic() - t0 < 20
        log = (tmp_path / "d1.log").read_text()
        assert "delivery to" in log and "stopped after a fatal error" in log
        proxy.start()
        committed = max(t.committed(f"g-{t.input}"), 0)  # -1001: nothing committed
        assert committed < len(lines), "the records after the failed delivery are not committed"
        delivered = t.deltas()
        delivered = rows_of(dedup(delivered)[0]) if delivered is not None else Counter()
        before = Counter({k: n for k, n in reference.items() if k[1] < committed})  # one update a record: seq = offset
        assert delivered & before == before, "a committed record has deltas that were never delivered"
        d = DaemonProcess(cfg, tmp_path / "d2.log", admin)
        d.wait_offset(len(lines))
        deduped, _ = dedup(t.deltas())
        assert rows_of(deduped) == reference
        assert d.stop() == 0
        proxy.cut()


def test_health_says_when_the_broker_is_unreachable_and_when_it_is_back(tmp_path, reference):  # noqa: F811
    """The broker goes away while the daemon is idle: /health stays 200 (a restart would not bring
    the broker back) and says kafka "down", /metrics has csmd_kafka_up 0 and the log a warning; once
    the broker is back, "up" again and the stream goes on, nothing lost."""
    port = free_port()
    with EmbeddedBroker(log_path=tmp_path / "broker.log", advertise=port) as broker:
        proxy = Proxy(port, broker.port).start()
        t, cfg, admin = daemon_config(tmp_path, f"127.0.0.1:{port}")
        lines = human_lines()
        d = DaemonProcess(cfg, tmp_path / "d.log", admin)

        def until(state):
            t0 = time.monotonic()
            while time.monotonic() - t0 < 40:
                h = d.get("/health")
                if h["kafka"] == state:
                    return h
                time.sleep(0.2)
            raise AssertionError(f"/health never said kafka {state!r}: {h}")

        assert until("up")["status"] == "running" and metric(d.get("/metrics"), "csmd_kafka_up") == 1
        t.produce(t.input, lines[:500])
        d.wait_offset(500)
        proxy.cut()
        h = until("down")
        assert h["status"] == "running" and d.proc.poll() is None
        assert metric(d.get("/metrics"), "csmd_kafka_up") == 0 and d.get("/stats")["kafka"] == "down"
        assert "kafka unreachable" in (tmp_path / "d.log").read_text()
        proxy.start()
        until("up")
        t.produce(t.input, lines[500:])
        d.wait_offset(len(lines))
        assert rows_of(dedup(t.deltas())[0]) == reference
        assert "kafka reachable again" in (tmp_path / "d.log").read_text()
        assert d.stop() == 0
        proxy.cut()


def test_a_checkpoint_beyond_the_end_of_the_topic_is_refused_with_the_setting_that_resolves_it(
        tmp_path, kafka_bootstrap):
    t, cfg, port = daemon_config(tmp_path, kafka_bootstrap, queries=["Q_1"], checkpoint=True)
    lines = human_lines()
    d = DaemonProcess(cfg, tmp_path / "d1.log", port)
    t.produce(t.input, lines[:200])
    d.wait_offset(200)
    assert d.stop() == 0  # a checkpoint at offset 200
    fresh = Topics(kafka_bootstrap)  # "the topic was recreated": same checkpoint, an empty input topic
    cfg.write_text(cfg.read_text().replace(t.input, fresh.input))
    out = subprocess.run([sys.executable, "-m", "csmd", "run", "--config", str(cfg)], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2, out.stderr[-2000:]
    err = out.stderr.strip().splitlines()[-1]
    assert f"topic {fresh.input!r} partition 0: the checkpoint resumes at offset 200, the topic ends at 0" in err
    assert 'on_mismatch = "rebuild"' in err and "Traceback" not in out.stderr
    d = DaemonProcess(cfg, tmp_path / "d2.log", port, env={"CSMD_CHECKPOINT__ON_MISMATCH": "rebuild"})
    fresh.produce(fresh.input, lines[:20])
    s = d.wait_offset(20)
    assert s["updates"] == 20, "every new record is processed"
    assert d.stop() == 0


def test_an_uncaught_exception_is_a_log_record_in_the_log_format():
    code = ("from csmd.logs import setup_logging\nsetup_logging('json')\n"
            "import threading\nt = threading.Thread(target=lambda: 1 / 0)\nt.start()\nt.join()\nraise RuntimeError('boom')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    records = [json.loads(line) for line in out.stderr.splitlines()]
    assert [r["event"] for r in records] == ["thread crashed", "crashed"]
    assert "ZeroDivisionError" in records[0]["exception"] and "RuntimeError: boom" in records[1]["exception"]


def test_every_metric_the_readme_lists_is_on_metrics_from_the_start(tmp_path, kafka_bootstrap):
    """Item 12: prometheus-client metrics; each listed series exists before the first record,
    counters at 0, with the process metrics beside them."""
    t, cfg, port = daemon_config(tmp_path, kafka_bootstrap, queries=["Q_1", "Q_2"])
    d = DaemonProcess(cfg, tmp_path / "d.log", port)
    text = d.get("/metrics")
    readme = (REPO / "docs" / "daemon.md").read_text()
    listed = re.findall(r"`(csmd_[a-z_]+)(?:\{([a-z,]+)\})?`", readme.split("The metrics are:")[1].split("\n## ")[0])
    assert len(listed) >= 14
    got = samples(text)
    for name, labels in listed:
        found = [dict(lab) for (n, lab) in got if n in (name, name + "_bucket")]
        assert found, f"{name} is missing from /metrics at start"
        assert all(set(lab) - {"le"} == set(labels.split(",")) - {""} for lab in found), (name, found)
        if name.endswith("_total"):
            assert all(v == 0 for (n, _), v in got.items() if n == name), name
    assert {(q, s) for q in ("Q_1", "Q_2") for s in "+-"} == \
        {(dict(lab)["query"], dict(lab)["sign"]) for (n, lab) in got if n == "csmd_deltas_total"}
    for standard in ("process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"):
        assert any(n == standard for n, _ in got), standard
    assert d.stop() == 0
