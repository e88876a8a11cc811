"""What the daemon's parts share: its settings, log, metrics and stop (DaemonContext)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from csmd.connectors.records import Carry
from csmd.model.labels import LabelNames
from csmd.service.config import label_names
from csmd.service.metrics import Metrics

@dataclass(eq=False)
class DaemonContext:
    """Every part gets one: the config and what follows from it, the log, the metrics, and the
    daemon's stop (the event the consume loop watches, and the fatal error that set it)."""

    cfg: dict
    log: object
    metrics: Metrics = field(default_factory=Metrics)
    stopping: threading.Event = field(default_factory=threading.Event)
    fatal: str | None = None  # the first fatal error: nothing more is committed after it
    labels: LabelNames = field(init=False)  # [graph] labels and edge_labels: the names queries and records use
    carry: Carry = field(init=False)  # what of an input record its deltas carry

    def __post_init__(self):
        cfg = self.cfg
        self.labels = label_names(cfg)
        self.carry = Carry(tuple(cfg["output"]["carry_headers"]), tuple(cfg["output"]["carry_fields"]),
                           cfg["topics"]["max_message_bytes"] // 2)

    def fail(self, reason: str) -> None:
        """Stop the daemon after a fatal error (any thread); the first reason is the one reported."""
        if self.fatal is None:
            self.fatal = reason
            self.log.error("stopping: fatal error", reason=reason)
        self.stopping.set()
