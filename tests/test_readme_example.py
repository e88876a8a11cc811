"""The README's fraud-alert example, run as a user would: its config, its code block, its output."""

from __future__ import annotations

import re
import subprocess
import sys

from csmd.testing.kafka import REPO, DaemonProcess, Topics, kill_leftovers, new_admin_port


def test_the_readme_example_prints_one_alert_naming_the_transaction_that_closed_the_ring(tmp_path, kafka_bootstrap):
    readme = (REPO / "README.md").read_text()
    code = re.search(r"<!-- example: fraud-alert .*?-->\n```python\n(.*?)```", readme, re.S).group(1)
    printed = re.search(r"\nprints `(.*?)`:", readme, re.S).group(1).replace("\n", " ")
    t = Topics(kafka_bootstrap)
    line = 'bootstrap, updates, deltas = "127.0.0.1:9092", "csmd.updates", "csmd.deltas"'
    assert line in code
    code = code.replace(line, f"bootstrap, updates, deltas = {t.bootstrap!r}, {t.input!r}, {t.output!r}")
    port = new_admin_port()
    env = {"CSMD_KAFKA__BOOTSTRAP": t.bootstrap, "CSMD_KAFKA__GROUP": f"g-{t.input}", "CSMD_TOPICS__INPUT": t.input,
           "CSMD_TOPICS__OUTPUT": t.output, "CSMD_TOPICS__CONTROL": t.control,
           "CSMD_TOPICS__DEAD_LETTER": t.dead_letter, "CSMD_ADMIN__LISTEN": f"127.0.0.1:{port}",
           "CSMD_LOG__FORMAT": "json"}
    d = DaemonProcess(REPO / "configs" / "fraud-alerts.toml", tmp_path / "daemon.log", port, env)
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == printed
        assert d.stop() == 0
    finally:
        kill_leftovers()
