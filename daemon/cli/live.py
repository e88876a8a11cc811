"""The demo's live view: what the daemon has acknowledged, rates over a short window, deltas per query.

Numbers mean what they say: `acknowledged` counts records whose deltas the broker has
(not records merely handed to the pipeline), rates come from the last few seconds of
samples (a 10 s average lags behind the work), and a value that does not exist yet
is "-", never nan.
"""

from __future__ import annotations

import math
from collections import deque

WINDOW_S = 3.0


class Window:
    """Rates of growing counts over the last `seconds` of samples."""

    def __init__(self, seconds: float = WINDOW_S):
        self.seconds = seconds
        self._samples: deque[tuple[float, dict[str, float]]] = deque()

    def add(self, now: float, **counts: float) -> None:
        self._samples.append((now, counts))
        # keep one sample at or before the window's start, so the rate spans the whole window
        while len(self._samples) > 2 and self._samples[1][0] <= now - self.seconds:
            self._samples.popleft()

    def rate(self, name: str) -> float | None:
        """Per second over the window; None until two samples lie apart in time."""
        if len(self._samples) < 2:
            return None
        (t0, first), (t1, last) = self._samples[0], self._samples[-1]
        return (last[name] - first[name]) / (t1 - t0) if t1 > t0 else None


def shown(value: float | None, fmt: str = "{:.0f}") -> str:
    """`value` formatted, or "-" while there is none (None or nan)."""
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else fmt.format(value)


def status_line(*, produced: int, total: int, acknowledged: int, updates_per_s: float | None,
                deltas_per_s: float | None, count_only: bool, latency_p50_s: float | None,
                latency_p99_s: float | None, dead_letters: float) -> str:
    """One line of progress. In count-only mode a delta's count is the update's number of
    matches, so the delta rate is matches per second."""
    ms = "{:.1f} ms"
    return (f"produced {produced}/{total}  acknowledged {acknowledged}  {shown(updates_per_s)} upd/s  "
            f"{shown(deltas_per_s)} {'matches/s' if count_only else 'deltas/s'}  "
            f"latency p50 {shown(None if latency_p50_s is None else latency_p50_s * 1000, ms)} "
            f"p99 {shown(None if latency_p99_s is None else latency_p99_s * 1000, ms)}  "
            f"dead letters {dead_letters:.0f}")


def query_table(by_query: dict[str, list[int]], expected: dict[str, int], top: int | None) -> list[str]:
    """Per query: new and vanished matches against the expected count; the `top` busiest, or all by name."""
    rows = sorted(by_query.items(), key=lambda kv: -kv[1][0])
    rows = rows[:top] if top else sorted(rows, key=lambda kv: [int(t) if t.isdigit() else t
                                                                for t in kv[0].replace("_", " _ ").split()])
    out = [f"  {'query':<10} {'new matches':>12} {'vanished':>9}  {'expected':>9}"]
    for q, (pos, neg) in rows:
        want = expected.get(q)
        mark = "  ok" if want is not None and pos == want else ""
        out.append(f"  {q:<10} {pos:>12} {neg:>9}  {'' if want is None else want:>9}{mark}")
    return out
