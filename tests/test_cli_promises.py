"""What the command line promises: bad input is `where: reason` and exit code 2, never a traceback
(issue 12 items 10, 11 and 14)."""

import subprocess

import pytest

from csmd.connectors.broker import free_port
from csmd.testing.kafka import CSMD, HUMAN
DATA, Q1, STREAM = HUMAN / "data.graph", HUMAN / "queries" / "Q_1.graph", HUMAN / "insertion.graph"


def csmd(*args, env=None):
    import os

    return subprocess.run(CSMD + [str(a) for a in args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def refused(out, message: str) -> None:
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert message in out.stderr.strip().splitlines()[-1], out.stderr


@pytest.mark.parametrize("command", ["match", "replay"])
def test_output_that_cannot_be_written_is_refused_before_the_work(tmp_path, command):
    extra = ["--stream", STREAM] if command == "replay" else []
    base = [command, "--data", DATA, "--query", Q1, *extra, "--output"]
    refused(csmd(*base, tmp_path / "nope" / "out.arrow"), f"{tmp_path / 'nope'}: No such file or directory")
    refused(csmd(*base, tmp_path), f"{tmp_path}: is a directory")


def test_one_wording_for_a_missing_file(tmp_path):
    gone = tmp_path / "gone"
    for out in (csmd("match", "--data", gone, "--query", Q1), csmd("match", "--data", DATA, "--query", gone),
                csmd("replay", "--data", DATA, "--query", Q1, "--stream", gone), csmd("run", "--config", gone)):
        refused(out, f"{gone}: No such file or directory")


def test_argument_errors_name_the_argument_not_a_function():
    out = csmd("match", "--data", DATA, "--query", Q1, "--time-limit", "abc")
    refused(out, "argument --time-limit: not a number: 'abc'")
    assert "_positive" not in out.stderr


@pytest.mark.parametrize("toml, message", [
    ('[admin]\nlisten = "127.0.0.1:70000"\n', "[admin] listen must be host:port with a port in 0 .. 65535"),
    ('[kafka]\nclient = { "no.such.key" = 1 }\n', '[kafka] client: No such configuration property: "no.such.key"'),
    ('[kafka]\nconsumer = { "fetch.wait.max.ms" = "soon" }\n', "[kafka] consumer: Invalid value"),
    ('[kafka]\nproducer = { "acks" = 1 }\n', "[kafka] producer: 'acks' is set by csmd"),
    ('[kafka]\noffset_reset = "middle"\n', "[kafka] offset_reset must be one of earliest, latest"),
])
def test_config_errors_are_found_when_the_config_loads(tmp_path, toml, message):
    cfg = tmp_path / "c.toml"
    cfg.write_text(toml)
    refused(csmd("run", "--config", cfg), f"{cfg}: {message}")


def test_a_broker_that_does_not_answer_is_one_line_with_a_hint(tmp_path):
    out = csmd("run", env={"CSMD_KAFKA__BOOTSTRAP": f"127.0.0.1:{free_port()}", "CSMD_LOG__FORMAT": "json",
                           "CSMD_ADMIN__LISTEN": ""})
    refused(out, "does not answer")
    assert "csmd broker" in out.stderr and len(out.stderr.strip().splitlines()) <= 2, out.stderr


def test_version_and_the_replay_table():
    out = csmd("--version")
    assert out.returncode == 0 and out.stdout.startswith("csmd 0.")
    out = csmd("replay", "--data", DATA, "--query", Q1, "--stream", STREAM)
    header, row = out.stdout.splitlines()[:2]
    assert header.split() == ["query", "positive", "negative", "updates", "records", "ignored", "seconds"]
    assert row.split()[3:6] == ["4314", "4314", "0"]
    assert "warning" not in out.stderr


def test_version_from_a_source_tree_that_was_never_installed(monkeypatch, capsys):
    """Run from a source tree on PYTHONPATH, importlib.metadata knows no csmd: --version says the
    package's own version, marked +source, instead of a traceback (issue 39.6)."""
    import importlib.metadata

    import csmd.cli as cli
    from csmd import __version__

    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"csmd {__version__}+source\n"


def test_a_static_graph_given_as_the_stream_is_warned_about():
    out = csmd("replay", "--data", DATA, "--query", Q1, "--stream", DATA)
    assert out.returncode == 0 and "every update of" in out.stderr and "data graph rather than an update stream" \
        in out.stderr


def test_admin_list_and_a_slow_match_against_a_stub_endpoint(monkeypatch, capsys):
    """`admin list` puts the name last (a wide name cannot shift a column), and a match the daemon
    takes long to answer (its first static search compiles the kernels) gets a line saying why."""
    import json
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import csmd.cli as cli

    class Stub(BaseHTTPRequestHandler):
        def _json(self, body):
            raw = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):
            self._json({"queries": [{"name": "詐欺パターン", "count_only": True}, {"name": "Q_1", "count_only": False}]})

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(0.6)
            self._json({"matches": 7})

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}"
    try:
        assert cli.main(["admin", "--url", url, "list"]) == 0
        assert capsys.readouterr().out.splitlines() == ["count-only  詐欺パターン", "matches     Q_1"]
        monkeypatch.setattr(cli, "NOTE_AFTER_SECONDS", 0.2)
        assert cli.main(["admin", "--url", url, "match", "--query", str(Q1)]) == 0
        out = capsys.readouterr()
        assert "matches" in out.out and "7" in out.out
        assert "compiles the search kernels" in out.err
        monkeypatch.setattr(cli, "NOTE_AFTER_SECONDS", 5.0)  # answered before: no note
        server.RequestHandlerClass.do_POST = lambda self: (self.rfile.read(int(self.headers["Content-Length"])),
                                                            self._json({"matches": 7}))
        assert cli.main(["admin", "--url", url, "match", "--query", str(Q1)]) == 0
        assert capsys.readouterr().err == ""
    finally:
        server.shutdown()


@pytest.mark.parametrize("setting, message", [
    ("graph", "gone.graph: No such file or directory"),
    ("queries", "bad.graph:2: "),
])
def test_local_files_are_checked_before_the_broker(tmp_path, setting, message):
    """A missing initial graph or a bad query file is named as such, without waiting for a broker
    that does not answer (that check takes 16 s and blamed Kafka)."""
    (tmp_path / "bad.graph").write_text("t 2 1\nv 0 x 1\n")
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[graph]\ninitial = "{tmp_path / "gone.graph"}"\n' if setting == "graph" else
                   f'[queries]\npaths = ["{tmp_path / "bad.graph"}"]\n')
    out = csmd("run", "--config", cfg, env={"CSMD_KAFKA__BOOTSTRAP": f"127.0.0.1:{free_port()}",
                                            "CSMD_LOG__FORMAT": "json", "CSMD_ADMIN__LISTEN": ""})
    refused(out, message)
    assert "does not answer" not in out.stderr


@pytest.mark.parametrize("command", ["match", "replay"])
def test_output_to_standard_output_a_pipe_or_a_device_is_the_stream_format(tmp_path, command):
    """--output -: the Arrow IPC stream on standard output (the table on standard error); /dev/null
    and a FIFO cannot hold the file format's footer (it ended in a traceback): they get the stream."""
    import os
    import threading

    import pyarrow as pa
    import pyarrow.ipc as ipc

    extra = ["--stream", STREAM] if command == "replay" else []
    base = [command, "--data", DATA, "--query", Q1, *extra, "--output"]
    assert csmd(*base, tmp_path / "out.arrow").returncode == 0
    want = ipc.open_file(tmp_path / "out.arrow").read_all()
    assert want.num_rows > 0
    out = subprocess.run(CSMD + [str(a) for a in base] + ["-", "--json"], capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert ipc.open_stream(pa.BufferReader(out.stdout)).read_all().equals(want)
    assert b'"query": "Q_1"' in out.stderr
    done = csmd(*base, "/dev/null")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = {}
    reader = threading.Thread(target=lambda: got.update(t=ipc.open_stream(open(fifo, "rb")).read_all()))
    reader.start()
    assert csmd(*base, fifo).returncode == 0
    reader.join(60)
    assert got["t"].equals(want)
