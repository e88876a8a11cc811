"""`make run` (csmd demo): embedded broker, daemon, the human stream; its totals are the expected counts.
Its live view says what is acknowledged, with rates over a short window and "-" before data."""

import io
import json
import os
import signal
import subprocess
import sys
import threading

import structlog

from csmd.cli.live import Window, query_table, status_line
from csmd.logs import get_logger, setup_logging
from csmd.testing.kafka import REPO

CSMD = [sys.executable, "-m", "csmd"]


def test_demo_runs_end_to_end_keeps_the_daemon_for_admin_and_stops_cleanly():
    demo = subprocess.Popen(CSMD + ["demo", "--config", str(REPO / "configs" / "demo.toml"), "--rate", "20000",
                                    "--keep"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in demo.stdout:  # piped: the view is printed as a log
            lines.append(line)
            if line.startswith("kept running"):
                break
        url = line.split("daemon admin ")[1].split()[0]
        stats = subprocess.run(CSMD + ["admin", "--url", url, "--json", "stats"], capture_output=True, text=True)
        assert stats.returncode == 0, stats.stderr
        assert json.loads(stats.stdout)["acknowledged"] == {"0": 4314}
        demo.send_signal(signal.SIGTERM)  # like Ctrl-C: the daemon drains, the broker stops
        rest, err = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    out = "".join(lines) + rest
    assert demo.returncode == 0, out[-2000:] + err[-2000:]
    assert "40/40 queries equal expected_insert_counts.txt" in out
    assert "daemon stopped (exit 0)" in out
    views = out.split("final delta totals")[0]
    assert views.count("new matches") >= 2, "piped output shows the per-query table with the progress too"
    assert "acknowledged 4314" in views and "matches/s" in views and "processed" not in views
    assert "nan" not in out and "\x1b" not in out
    assert b"\x1b" not in (REPO / "out" / "daemon.log").read_bytes()


def test_ctrl_c_mid_stream_stops_everything_cleanly():
    """Ctrl-C reaches the whole foreground process group (make, the demo): the demo stops the daemon,
    which drains and exits 0, then the broker; no error, exit 0."""
    demo = subprocess.Popen(CSMD + ["demo", "--config", str(REPO / "configs" / "demo.toml"), "--rate", "500"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        lines = []
        for line in demo.stdout:
            lines.append(line)
            if line.startswith("produced ") and not line.startswith("produced 0/"):
                break
        os.killpg(demo.pid, signal.SIGINT)
        rest, err = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
    out = "".join(lines) + rest
    assert demo.returncode == 0, out[-2000:] + err[-2000:]
    assert "interrupted: stopping" in out and "daemon stopped (exit 0)" in out, out[-2000:]
    assert "error" not in err, err[-2000:]


def test_run_refuses_a_bad_config(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[pipeline]\nbatch_size = -1\n")
    out = subprocess.run(CSMD + ["run", "--config", str(bad)], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip() == f"csmd run: error: {bad}: [pipeline] batch_size must be > 0, got -1"


def test_rates_cover_a_short_window_and_are_absent_before_two_samples():
    w = Window(seconds=3.0)
    assert w.rate("acked") is None
    w.add(0.0, acked=0)
    assert w.rate("acked") is None
    for t in range(1, 11):  # 100/s for 10 s, then 1000/s
        w.add(float(t), acked=100 * t)
    assert w.rate("acked") == 100
    w.add(11.0, acked=2000)
    w.add(12.0, acked=3000)
    assert w.rate("acked") == (3000 - 900) / 3, "only the last 3 s (since t = 9) count, not the slow start"


def test_the_status_line_shows_dashes_before_data_and_names_matches_in_count_only_mode():
    empty = status_line(produced=0, total=10, acknowledged=0, updates_per_s=None, deltas_per_s=None,
                        count_only=True, latency_p50_s=float("nan"), latency_p99_s=float("nan"), dead_letters=0)
    assert "nan" not in empty
    assert empty == "produced 0/10  acknowledged 0  - upd/s  - matches/s  latency p50 - p99 -  dead letters 0"
    busy = status_line(produced=10, total=10, acknowledged=7, updates_per_s=12.4, deltas_per_s=30,
                       count_only=False, latency_p50_s=0.0012, latency_p99_s=0.25, dead_letters=1)
    assert busy == "produced 10/10  acknowledged 7  12 upd/s  30 deltas/s  latency p50 1.2 ms p99 250.0 ms  " \
                   "dead letters 1"


def test_the_query_table_marks_the_expected_counts():
    rows = query_table({"Q_10": [5, 1], "Q_2": [7, 0]}, {"Q_2": 7, "Q_10": 9}, None)
    assert [r.split()[0] for r in rows[1:]] == ["Q_2", "Q_10"]  # by name, numbers in order
    assert rows[1].endswith("ok") and not rows[2].endswith("ok")
    assert [r.split()[0] for r in query_table({"Q_10": [5, 1], "Q_2": [7, 0]}, {}, 1)[1:]] == ["Q_2"]


def test_a_console_log_to_a_file_has_no_colour_codes():
    stream = io.StringIO()
    hooks = sys.excepthook, threading.excepthook
    setup_logging("console", "info", stream=stream)
    try:
        get_logger().warning("dead letter", record="t/0/1")
    finally:  # the test process keeps its own logging
        structlog.reset_defaults()
        sys.excepthook, threading.excepthook = hooks
    assert "dead letter" in stream.getvalue() and "\x1b" not in stream.getvalue()
