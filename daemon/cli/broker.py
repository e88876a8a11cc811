"""`csmd broker`: the embedded Kafka broker alone, so `csmd run` and `csmd admin` can be tried without the demo.

The first line on stdout is the bootstrap address (for scripts); how to use it goes
to stderr. The broker keeps everything in memory: stopping it loses every topic.
"""

from __future__ import annotations

import signal
import socket
import sys
import threading

from csmd.connectors.broker import EmbeddedBroker
from csmd.errors import CsmdError
from csmd.service.config import AdminConfig, KafkaConfig, split_listen


DEFAULT_BOOTSTRAP = KafkaConfig().bootstrap  # `csmd run` finds the broker without a setting


def _in_use(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def run_broker(args) -> int:
    port = int(DEFAULT_BOOTSTRAP.rsplit(":", 1)[1]) if args.port is None else args.port or None  # 0: any free one
    if port is not None and _in_use(port):
        raise CsmdError(f"port {port} is in use (another broker?); --port 0 picks a free one")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with EmbeddedBroker(port=port, log_path=args.log) as broker:
        print(broker.bootstrap, flush=True)
        env = "" if broker.bootstrap == DEFAULT_BOOTSTRAP else f"CSMD_KAFKA__BOOTSTRAP={broker.bootstrap} "
        admin = "http://{}:{}".format(*split_listen(AdminConfig().listen))
        print(f"embedded Kafka broker (Tansu) at {broker.bootstrap}, in memory: stopping it loses every topic\n"
              f"  {env}csmd run --config configs/default.toml     # the daemon against it\n"
              f"  csmd admin --url {admin} add --query Q.graph    # then talk to the daemon\n"
              f"Ctrl-C stops the broker", file=sys.stderr, flush=True)
        while not stop.wait(0.2):
            if broker.proc.poll() is not None:
                raise CsmdError(f"the broker exited with code {broker.proc.returncode}"
                                + (f"; see {args.log}" if args.log else ""))
    return 0
