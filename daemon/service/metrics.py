"""The daemon's metrics, through prometheus-client: counters, gauges, the process metrics,
and a fine latency histogram.

Every series docs/daemon.md lists exists from the start (at 0), so a dashboard or an
alert never sees a metric appear only after its first event. Each daemon has its
own registry (tests run several in one process). The histogram keeps fine
log-spaced buckets (8 per power of two, so a quantile read from it is within 9%
of the true value) in constant memory, however long the daemon runs; /metrics
exports them folded into a few standard buckets by a custom collector.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque

import numpy as np
from prometheus_client import (CollectorRegistry, Counter, Gauge, GCCollector, PlatformCollector, ProcessCollector,
                               disable_created_metrics, generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from csmd.latency import _NB, LatencyHistogram
from csmd.pipeline.sequencer import IGNORED_REASONS

disable_created_metrics()  # a `_created` twin of every counter is noise for these users

EXPORT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Rate:
    """Events per second over the last `window` seconds (for the updates/s and deltas/s gauges)."""

    def __init__(self, window: float = 10.0):
        self.window = window
        self._events: deque[tuple[float, int]] = deque()
        self._lock = threading.Lock()

    def add(self, n: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            self._events.append((now, n))
            self._trim(now)

    def _trim(self, now: float) -> None:
        while self._events and self._events[0][0] < now - self.window:
            self._events.popleft()

    def per_second(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        with self._lock:
            self._trim(now)
            return sum(n for _, n in self._events) / self.window


class _LatencyCollector:
    """Exports a LatencyHistogram as a Prometheus histogram with the standard EXPORT_BUCKETS."""

    def __init__(self, hist: LatencyHistogram, name: str, help_text: str):
        self.hist, self.name, self.help = hist, name, help_text

    def collect(self):
        h = self.hist
        counts, total = h.snapshot()
        cum = np.cumsum(counts)
        edges = np.array([h.upper(b) for b in range(_NB + 1)])
        buckets = []
        for le in EXPORT_BUCKETS:  # a fine bucket counts below `le` when its upper edge is
            k = int(np.searchsorted(edges, le * (1 + 1e-9), "right"))
            buckets.append((str(le), int(cum[k - 1]) if k else 0))
        buckets.append(("+Inf", int(cum[-1])))
        yield HistogramMetricFamily(self.name, self.help, buckets=buckets, sum_value=total)


class _KeptElsewhere:
    """A counter (or gauge) another part keeps (the sequencer's ignored updates, the GC's
    releases, the event-time clock), read when scraped: `read()` gives {label values: value};
    `zeros` until `bind`."""

    def __init__(self, name: str, help_text: str, labels: tuple, zeros: dict, family=None):
        self.name, self.help, self.labels = name, help_text, labels
        self.family = family or CounterMetricFamily
        self.read = lambda: zeros

    def collect(self):
        fam = self.family(self.name, self.help, labels=self.labels)
        for key, value in self.read().items():
            fam.add_metric(list(key), value)
        yield fam


# name, kind, help, label names
_SERIES = [
    ("csmd_records_total", Counter, "Input records consumed", ()),
    ("csmd_updates_total", Counter, "Updates applied to the graph", ()),
    ("csmd_deltas_total", Counter, "Match deltas published, by query and sign", ("query", "sign")),
    ("csmd_output_records_total", Counter, "Kafka records of deltas produced", ()),
    ("csmd_dead_letters_total", Counter, "Input or control records sent to the dead-letter topic", ()),
    ("csmd_queue_depth", Gauge, "Items waiting in front of each pipeline stage", ("stage",)),
    ("csmd_pending_records", Gauge, "Input records not yet done (executed and acknowledged)", ()),
    ("csmd_consumer_paused", Gauge, "1 while backpressure pauses the input consumer", ()),
    ("csmd_consumer_pauses_total", Counter, "Times backpressure paused the input consumer", ()),
    ("csmd_consumer_lag", Gauge, "Input records behind the end of each partition (negative: past the end)",
     ("partition",)),
    ("csmd_committed_offset", Gauge, "Input offset committed, by partition", ("partition",)),
    ("csmd_gc_live_versions", Gauge, "Neighbor-array versions alive in the multi-version graph", ()),
    ("csmd_device_memory_bytes", Gauge, "GPU memory in use by the engine (0 on the CPU engine)", ()),
    ("csmd_checkpoints_total", Counter, "Checkpoints written", ()),
    ("csmd_checkpoint_seq", Gauge, "Sequence number of the last checkpoint", ()),
    ("csmd_seq", Gauge, "Next update sequence number", ()),
    ("csmd_queries", Gauge, "Registered queries", ()),
    ("csmd_kafka_errors_total", Counter, "Errors reported by the Kafka clients, by code", ("code",)),
    ("csmd_kafka_up", Gauge, "1 while the input consumer has a broker connection up, 0 while it has none", ()),
    ("csmd_cluster_shards_owned", Gauge, "Shards of the matching work this instance owns ([cluster])", ()),
    ("csmd_cluster_shard_lag", Gauge, "Input records past each shard's committed progress", ("shard",)),
    ("csmd_cluster_rebalances_total", Counter, "Shard assignments and revocations this instance went through", ()),
    ("csmd_cluster_retained_updates", Gauge, "Updates kept for re-matches since the slowest shard's progress", ()),
    ("csmd_cluster_gc_holder", Gauge, "The shard with the lowest progress, which holds the kept window and the GC "
                                      "back (-1: not in a cluster)", ()),
    ("csmd_cluster_rematched_updates_total", Counter, "Updates re-matched for shards this instance gained", ()),
    ("csmd_cluster_gaps_total", Counter, "Gained shards whose progress was older than anything this instance kept", ()),
]


class Metrics:
    """The daemon's metrics by name; `inc`/`set` take the label values as keywords."""

    def __init__(self):
        self.registry = CollectorRegistry()
        for collector in (ProcessCollector, PlatformCollector, GCCollector):
            collector(registry=self.registry)
        self._series = {name: kind(name, text, labels, registry=self.registry) for name, kind, text, labels in _SERIES}
        self._children: dict[tuple, object] = {}  # (name, label items) -> its series
        self._read = {c.name: c for c in (
            _KeptElsewhere("csmd_ignored_updates_total", "Updates that changed nothing, by reason", ("reason",),
                           {(r,): 0 for r in IGNORED_REASONS}),
            _KeptElsewhere("csmd_gc_released_total", "Versions released by the garbage collector", (), {(): 0}),
            _KeptElsewhere("csmd_expired_updates_total", "Edges deleted because they left the event-time window",
                           (), {(): 0}),
            _KeptElsewhere("csmd_watermark", "Event time: the largest ts applied less [graph] lateness (NaN "
                                             "before the first timed update, and without event time)", (),
                           {(): math.nan}, GaugeMetricFamily))}
        for collector in self._read.values():
            self.registry.register(collector)
        self.set("csmd_cluster_gc_holder", -1)
        self.latency = LatencyHistogram()
        self.registry.register(_LatencyCollector(self.latency, "csmd_update_latency_seconds",
                                                 "Per update record: arrival at the daemon to its deltas acknowledged"))
        self.delta_latency = LatencyHistogram()
        self.registry.register(_LatencyCollector(self.delta_latency, "csmd_delta_latency_seconds",
                                                 "Per update record with deltas: arrival at the daemon to its deltas "
                                                 "acknowledged"))
        # the same records' way in parts: taken into a batch to its deltas handed to the producer (the
        # rest of the above is the wait for the pipeline before, and for the broker's acknowledgement after)
        self.produced = LatencyHistogram()
        self.registry.register(_LatencyCollector(self.produced, "csmd_publish_latency_seconds",
                                                 "Per update: taken into a batch to its deltas handed to the producer"))
        self.updates_rate = Rate()
        self.deltas_rate = Rate()
        Gauge("csmd_updates_per_second", "Updates applied per second over the last 10 s",
              registry=self.registry).set_function(self.updates_rate.per_second)
        Gauge("csmd_deltas_per_second", "Match deltas published per second over the last 10 s",
              registry=self.registry).set_function(self.deltas_rate.per_second)

    def _child(self, name: str, labels: dict):
        if not labels:
            return self._series[name]
        key = (name, *labels.items())
        child = self._children.get(key)
        if child is None:  # prometheus-client's labels() costs some 8 us: once per series, not per batch
            child = self._children[key] = self._series[name].labels(**labels)
        return child

    def records_done(self, arrived: np.ndarray, with_deltas: np.ndarray) -> None:
        """Input records done (DeliveryTracker's on_done): their arrival times and which had deltas."""
        waited = time.monotonic() - arrived
        self.latency.observe(waited)
        self.delta_latency.observe(waited[with_deltas])

    def inc(self, name: str, n: float = 1, **labels) -> None:
        self._child(name, labels).inc(n)

    def set(self, name: str, value: float, **labels) -> None:
        self._child(name, labels).set(value)

    def bind(self, name: str, read) -> None:
        """Where a counter kept elsewhere is read from: `read()` -> {label values: count}."""
        self._read[name].read = read

    def query(self, name: str) -> None:
        """A registered query's delta series exist from its registration, at 0."""
        for sign in "+-":
            self.inc("csmd_deltas_total", 0, query=name, sign=sign)

    def _samples(self, name: str):
        collector = self._series[name] if name in self._series else self._read[name]
        return [s for fam in collector.collect() for s in fam.samples]

    def series(self, name: str) -> dict[str, float]:
        """{label values joined by ",": value} of one metric (for `csmd admin stats`)."""
        return {",".join(s.labels.values()): s.value for s in self._samples(name)}

    def get(self, name: str, **labels) -> float:
        want = {k: str(v) for k, v in labels.items()}
        return next((s.value for s in self._samples(name) if s.labels == want), 0)

    def prometheus(self) -> str:
        return generate_latest(self.registry).decode()
