"""`make run` (csmd demo): embedded broker, daemon, the human stream; its totals are the expected counts."""

import subprocess
import sys

from kafka_harness import REPO


def test_demo_runs_end_to_end_and_stops_cleanly(tmp_path):
    out = subprocess.run([sys.executable, "-m", "csmd", "demo", "--config", str(REPO / "configs" / "demo.toml"),
                          "--rate", "20000"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "40/40 queries equal expected_insert_counts.txt" in out.stdout
    assert "daemon stopped (exit 0)" in out.stdout


def test_run_refuses_a_bad_config(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[pipeline]\nbatch_size = -1\n")
    out = subprocess.run([sys.executable, "-m", "csmd", "run", "--config", str(bad)], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip() == f"csmd run: error: {bad}: [pipeline] batch_size must be > 0, got -1"
