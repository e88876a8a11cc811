"""What the daemon's parts share: its settings, log, metrics and stop (DaemonContext), and the
queue into the pipeline (Intake), the one hand-off from the main thread to the output thread."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field

from csmd.connectors.records import Carry
from csmd.model.labels import LabelNames
from csmd.service.config import Config, label_names
from csmd.service.metrics import Metrics

STOP = object()  # put in the intake: the pipeline ends after what is before it


@dataclass(eq=False)
class DaemonContext:
    """Every part gets one: the config and what follows from it, the log, the metrics, and the
    daemon's stop (the event the consume loop watches, and the fatal error that set it)."""

    cfg: Config
    log: object
    metrics: Metrics = field(default_factory=Metrics)
    stopping: threading.Event = field(default_factory=threading.Event)
    fatal: str | None = None  # the first fatal error: nothing more is committed after it
    labels: LabelNames = field(init=False)  # [graph] labels and edge_labels: the names queries and records use
    carry: Carry = field(init=False)  # what of an input record its deltas carry

    def __post_init__(self):
        cfg = self.cfg
        self.labels = label_names(cfg)
        self.carry = Carry(tuple(cfg.output.carry_headers), tuple(cfg.output.carry_fields),
                           cfg.topics.max_message_bytes // 2)

    def fail(self, reason: str) -> None:
        """Stop the daemon after a fatal error (any thread); the first reason is the one reported."""
        if self.fatal is None:
            self.fatal = reason
            self.log.error("stopping: fatal error", reason=reason)
        self.stopping.set()


class Intake(queue.Queue):
    """The pipeline's input, in stream order: updates and record blocks from the consume loop, markers
    (query and shard changes, checkpoints) from the parts that start them; the output thread takes
    them. Markers are counted from their hand-off until they pass the output (a drain waits for them)."""

    def __init__(self):
        super().__init__()
        self._markers = 0
        self._lock = threading.Lock()

    def put_marker(self, marker) -> None:
        with self._lock:
            self._markers += 1
        self.put(marker)

    def marker_passed(self) -> None:
        with self._lock:
            self._markers -= 1

    def markers(self) -> int:
        """Markers handed on that have not passed the output yet."""
        with self._lock:
            return self._markers
