"""A fine latency histogram in constant memory: the pipeline's per-record latency, which the
daemon's metrics (service/metrics.py) export. Below both, so that the pipeline imports nothing of
the service, and `csmd replay`, which imports the pipeline, does not import prometheus-client."""

from __future__ import annotations

import math
import threading

import numpy as np

_SUB = 8  # buckets per power of two
_LO = 2.0 ** -20  # about 1 microsecond: the first bucket holds everything below
_NB = 40 * _SUB  # up to 2^20 s

class LatencyHistogram:
    """Latencies in seconds; thread-safe. Observations are binned in bulk, FOLD of them at a
    time or when read: binning costs about ten array calls whatever the number of values, and
    the pipeline observes one small batch at a time."""

    FOLD = 4096

    def __init__(self):
        self.counts = np.zeros(_NB + 1, np.int64)
        self.total = 0.0
        self._pending: list[np.ndarray] = []
        self._held = 0
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
        with self._lock:
            self._pending.append(x)
            self._held += len(x)
            if self._held >= self.FOLD:
                self._fold()

    def _fold(self) -> None:
        """Bin the pending observations (under the lock)."""
        if self._pending:
            x = np.concatenate(self._pending)
            self._pending, self._held = [], 0
            self.counts += np.bincount(self._bucket(x), minlength=len(self.counts))
            self.total += float(x.sum())

    def snapshot(self) -> tuple[np.ndarray, float]:
        """The fine bucket counts and the sum, consistent with each other."""
        with self._lock:
            self._fold()
            return self.counts.copy(), self.total

    @property
    def count(self) -> int:
        return int(self.snapshot()[0].sum())

    def quantile(self, q: float) -> float:
        """The q-quantile (0..1), read as the upper edge of its bucket; nan when empty."""
        cum = np.cumsum(self.snapshot()[0])
        if not cum[-1]:
            return math.nan
        b = int(np.searchsorted(cum, q * cum[-1], "left"))
        return self.upper(b)
