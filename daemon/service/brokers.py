"""What the daemon's Kafka clients report: their errors, and whether the input consumer reaches a broker."""

from __future__ import annotations

import time

from csmd.service.context import DaemonContext


class BrokerWatch:
    """The error_cb of every Kafka client and the input consumer's on_brokers; /health, /stats and
    csmd_kafka_up read what it saw."""

    def __init__(self, ctx: DaemonContext):
        self.ctx = ctx
        self._error_logged: dict[int, float] = {}  # Kafka error code -> when it was last logged
        self.up: bool | None = None  # the input consumer's broker connection, as last seen
        self.since = time.time()  # when `up` last changed

    def error(self, err) -> None:
        """error_cb of every Kafka client: counted always, logged once a minute per kind (a broker
        that is down reports the same error many times a second), fatal ones stop the daemon."""
        self.ctx.metrics.inc("csmd_kafka_errors_total", code=err.name())
        if err.fatal():
            self.ctx.fail(f"Kafka client failed: {err.str()}")
            return
        now = time.monotonic()
        if now - self._error_logged.get(err.code(), -1e9) >= 60:
            self._error_logged[err.code()] = now
            self.ctx.log.warning("kafka client error (librdkafka retries)", code=err.name(), reason=err.str())

    def seen(self, up: bool) -> None:
        """The input consumer's statistics, each second (main thread): say when Kafka goes away and
        comes back; /health, /stats and csmd_kafka_up show it. The daemon stays up meanwhile (a
        restart would not bring the broker back) and takes up where it was."""
        if up == self.up:
            return
        was, self.up, self.since = self.up, up, time.time()
        self.ctx.metrics.set("csmd_kafka_up", int(up))
        if not up:
            self.ctx.log.warning("kafka unreachable: no broker connection is up",
                                 bootstrap=self.ctx.cfg.kafka.bootstrap)
        elif was is not None:
            self.ctx.log.info("kafka reachable again")

    def state(self) -> dict:
        """The broker connection, for /health and /stats: up, down or unknown (no statistics yet),
        and for how long."""
        state = {None: "unknown", True: "up", False: "down"}[self.up]
        return {"kafka": state, "kafka_for_s": round(time.time() - self.since, 1)}
