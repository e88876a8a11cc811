"""`csmd broker`: the embedded broker alone, for trying `csmd run` and `csmd admin` without the demo."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess

from csmd.testing.kafka import (CSMD, HUMAN, DaemonProcess, Topics, config_text, human_lines, kill_leftovers,
                                new_admin_port)


def test_csmd_broker_prints_its_address_serves_run_and_admin_and_stops_on_sigterm(tmp_path):
    broker = subprocess.Popen(CSMD + ["broker", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
    try:
        bootstrap = broker.stdout.readline().strip()
        assert re.fullmatch(r"127\.0\.0\.1:\d+", bootstrap), bootstrap
        t = Topics(bootstrap)
        port = new_admin_port()
        cfg = tmp_path / "d.toml"
        cfg.write_text(config_text(t, ["Q_1"], admin_port=port))
        d = DaemonProcess(cfg, tmp_path / "d.log", port)
        added = subprocess.run(CSMD + ["admin", "--url", d.url, "--json", "add", "--query",
                                       str(HUMAN / "queries" / "Q_2.graph")], capture_output=True, text=True)
        assert added.returncode == 0, added.stderr
        assert json.loads(added.stdout)["name"] == "Q_2" and json.loads(added.stdout)["error"] is None
        t.produce(t.input, human_lines()[:200])
        assert set(d.wait_offset(200)["queries"]) == {"Q_1", "Q_2"}
        assert d.stop() == 0
        broker.send_signal(signal.SIGTERM)
        assert broker.wait(10) == 0
        assert f"CSMD_KAFKA__BOOTSTRAP={bootstrap} csmd run" in broker.stderr.read()
    finally:
        kill_leftovers()
        if broker.poll() is None:
            broker.kill()
            broker.wait()


def test_csmd_broker_on_a_port_in_use_says_so():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        out = subprocess.run(CSMD + ["broker", "--port", str(port)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert out.stderr.strip() == \
        f"csmd broker: error: port {port} is in use (another broker?); --port 0 picks a free one"
