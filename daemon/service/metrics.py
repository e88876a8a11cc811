"""Counters, gauges and latency histograms, rendered in the Prometheus text format.

The histogram keeps fine log-spaced buckets (8 per power of two, so a quantile
read from it is within 9% of the true value) in constant memory, however long
the daemon runs; /metrics exports them folded into a few standard buckets.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque

import numpy as np

_SUB = 8  # buckets per power of two
_LO = 2.0 ** -20  # about 1 microsecond: the first bucket holds everything below
_NB = 40 * _SUB  # up to 2^20 s
EXPORT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class LatencyHistogram:
    """Latencies in seconds; thread-safe."""

    def __init__(self):
        self.counts = np.zeros(_NB + 1, np.int64)
        self.total = 0.0
        self._lock = threading.Lock()

    @staticmethod
    def _bucket(x: np.ndarray) -> np.ndarray:
        b = np.floor(np.log2(np.maximum(x, _LO) / _LO) * _SUB).astype(np.int64) + 1
        return np.where(x <= _LO, 0, np.minimum(b, _NB))

    @staticmethod
    def upper(b: int) -> float:
        return _LO * 2.0 ** (b / _SUB)

    def observe(self, values) -> None:
        x = np.asarray(values, np.float64)
        if not len(x):
            return
        idx = self._bucket(x)
        with self._lock:
            np.add.at(self.counts, idx, 1)
            self.total += float(x.sum())

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    def quantile(self, q: float) -> float:
        """The q-quantile (0..1), read as the upper edge of its bucket; nan when empty."""
        with self._lock:
            cum = np.cumsum(self.counts)
        if not cum[-1]:
            return math.nan
        b = int(np.searchsorted(cum, q * cum[-1], "left"))
        return self.upper(b)

    def prometheus(self, name: str, help_text: str) -> list[str]:
        with self._lock:
            counts, total = self.counts.copy(), self.total
        cum = np.cumsum(counts)
        edges = np.array([self.upper(b) for b in range(_NB + 1)])
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        for le in EXPORT_BUCKETS:  # a fine bucket counts below `le` when its upper edge is
            k = int(np.searchsorted(edges, le * (1 + 1e-9), "right"))
            lines.append(f'{name}_bucket{{le="{le}"}} {int(cum[k - 1]) if k else 0}')
        lines += [f'{name}_bucket{{le="+Inf"}} {int(cum[-1])}', f"{name}_sum {total:.6f}", f"{name}_count {int(cum[-1])}"]
        return lines


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


def _labels(labels: dict) -> str:
    if not labels:
        return ""
    body = ",".join(f'{k}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                    for k, v in sorted(labels.items()))
    return "{" + body + "}"


class Metrics:
    """The daemon's metrics: named counters and gauges with labels, histograms, rates."""

    def __init__(self):
        self._lock = threading.Lock()
        self._values: dict[str, dict[tuple, float]] = {}
        self._meta: dict[str, tuple[str, str]] = {}  # name -> (type, help)
        self.latency = LatencyHistogram()
        self.updates_rate = Rate()
        self.deltas_rate = Rate()

    def describe(self, name: str, kind: str, help_text: str) -> None:
        self._meta[name] = (kind, help_text)

    def inc(self, name: str, n: float = 1, **labels) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            series = self._values.setdefault(name, {})
            series[key] = series.get(key, 0) + n

    def set(self, name: str, value: float, **labels) -> None:
        with self._lock:
            self._values.setdefault(name, {})[tuple(sorted(labels.items()))] = value

    def get(self, name: str, **labels) -> float:
        with self._lock:
            return self._values.get(name, {}).get(tuple(sorted(labels.items())), 0)

    def snapshot(self) -> dict:
        """Every series as {name: {label-string: value}} (for `csmd admin stats`)."""
        with self._lock:
            return {name: {_labels(dict(k)) or "": v for k, v in series.items()} for name, series in self._values.items()}

    def prometheus(self) -> str:
        lines: list[str] = []
        with self._lock:
            items = [(name, dict(series)) for name, series in sorted(self._values.items())]
        for name, series in items:
            kind, help_text = self._meta.get(name, ("gauge", name))
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            lines += [f"{name}{_labels(dict(k))} {_number(v)}" for k, v in sorted(series.items())]
        lines += ["# HELP csmd_updates_per_second Updates applied per second over the last 10 s",
                  "# TYPE csmd_updates_per_second gauge", f"csmd_updates_per_second {self.updates_rate.per_second():.3f}",
                  "# HELP csmd_deltas_per_second Match deltas published per second over the last 10 s",
                  "# TYPE csmd_deltas_per_second gauge", f"csmd_deltas_per_second {self.deltas_rate.per_second():.3f}"]
        lines += self.latency.prometheus("csmd_update_latency_seconds",
                                         "Per update record: arrival at the daemon to its deltas acknowledged")
        return "\n".join(lines) + "\n"


def _number(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.6f}"
