"""At-least-once bookkeeping: which input records are done, and which offsets may be committed.

A record is done when every update it holds has been executed and every Kafka
record it caused (deltas, or its dead letter) has been acknowledged. The
committable offset of a partition is one past the longest done prefix of its
records: committing more could lose deltas in a crash, committing less only
brings duplicates, which delta ids let consumers drop.

The records of a partition are kept in arrays (a log), not one object each: every
instance of a cluster books every input record, and objects per record cost more
than sequencing and applying its update.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import numpy as np


def unwatched(_origins) -> None:
    """on_ack of Kafka records no input offset waits for (control announcements, dead letters of control records)."""


class _Log:
    """The records of one (input, partition) not passed by the done prefix yet, in offset order.

    A record has an absolute position (its number in the log since the start); arrays hold
    positions `base` .. `tail` - 1, of which `head` .. `tail` - 1 are pending. `wait` is what a
    record still waits for: its unexecuted updates plus its unacknowledged Kafka records;
    `sent`: whether a delta record covering it was produced. The consumer reads each partition
    forward, so offsets increase along the log."""

    __slots__ = ("key", "base", "head", "tail", "offset", "wait", "arrived", "sent")

    def __init__(self, key: tuple[str, int]):
        self.key = key
        self.base = self.head = self.tail = 0
        self.offset = np.zeros(1024, np.int64)
        self.wait = np.zeros(1024, np.int64)
        self.arrived = np.zeros(1024, np.float64)
        self.sent = np.zeros(1024, bool)

    def append(self, offsets: np.ndarray, wait: int, arrived: float) -> int:
        """Add records (all waiting for `wait`); the position of the first."""
        k = len(offsets)
        at = self.tail - self.base
        if at + k > len(self.offset):
            self._make_room(k)
            at = self.tail - self.base
        self.offset[at:at + k] = offsets
        self.wait[at:at + k] = wait
        self.arrived[at:at + k] = arrived
        self.sent[at:at + k] = False
        self.tail += k
        return self.tail - k

    def _make_room(self, k: int) -> None:
        """Drop the passed records from the arrays' front, and grow them if that is not enough."""
        lo, n = self.head - self.base, self.tail - self.head
        size = len(self.offset)
        while n + k > size // 2:
            size *= 2
        for name in ("offset", "wait", "arrived", "sent"):
            old = getattr(self, name)
            new = np.zeros(size, old.dtype) if size != len(old) else old
            new[:n] = old[lo:lo + n]
            setattr(self, name, new)
        self.base = self.head

    def find(self, offset: int) -> int:
        """The array index of the pending record with this offset (KeyError if there is none)."""
        h, t = self.head - self.base, self.tail - self.base
        if h < t:
            i = h + offset - int(self.offset[h])  # consecutive offsets: no search
            if not h <= i < t or self.offset[i] != offset:
                i = h + int(np.searchsorted(self.offset[h:t], offset))
            if i < t and self.offset[i] == offset:
                return i
        raise KeyError(offset)

    def advance(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Pass the done records at the head; their arrival times and `sent` (None if none was passed)."""
        h, t = self.head - self.base, self.tail - self.base
        if h == t or self.wait[h]:
            return None
        end, step = h, 64
        while end < t:  # the first record still waiting, in growing windows: the prefix is often short
            hit = np.flatnonzero(self.wait[end:min(t, end + step)])
            if len(hit):
                end += int(hit[0])
                break
            end, step = min(t, end + step), step * 4
        self.head = self.base + end
        return self.arrived[h:end], self.sent[h:end]

    @property
    def committable(self) -> int:
        """One past the offset of the last record passed."""
        return int(self.offset[self.head - self.base - 1]) + 1


class DeliveryTracker:
    """Thread-safe: records are submitted by the consumer loop, executed by the pipeline's
    output stage and acknowledged from the producer's delivery reports."""

    def __init__(self, on_done=None):
        self._lock = threading.Lock()
        self._logs: dict[tuple[str, int], _Log] = {}
        # records with updates still in the pipeline, in submission order: [log, first position,
        # end position, updates left of the first]; a run of several records holds one update each
        self._unexecuted: deque[list] = deque()
        self._committable: dict[tuple[str, int], int] = {}
        # called with the finished records' arrival times and whether each had deltas (latency metrics)
        self._on_done = on_done

    def _log(self, key: tuple[str, int]) -> _Log:
        log = self._logs.get(key)
        if log is None:
            log = self._logs[key] = _Log(key)
        return log

    def submitted(self, origin: tuple, updates: int, sends: int = 0, arrived: float | None = None) -> None:
        """An input record entered the daemon holding `updates` updates, and `sends` Kafka records
        of its own are about to be produced (1 for its dead letter). Counting them here, not in a
        later `sending`, keeps a record with nothing left to wait for from being done (and
        forgotten) before its dead letter is produced."""
        arrived = time.monotonic() if arrived is None else arrived
        with self._lock:
            log = self._log(origin[:2])
            at = log.append(np.array([origin[2]], np.int64), updates + sends, arrived)
            if updates:
                self._unexecuted.append([log, at, at + 1, updates])
            else:
                self._advance({log})

    def submitted_run(self, input: str, partition: int, offsets, updates=None) -> None:
        """Input records of one partition entered the daemon, in order, holding one update each
        (updates None) or updates[i] each (at least one)."""
        if not len(offsets):
            return
        now = time.monotonic()
        with self._lock:
            log = self._log((input, partition))
            at = log.append(np.asarray(offsets, np.int64), 1 if updates is None else updates, now)
            if updates is None:
                self._unexecuted.append([log, at, at + len(offsets), 1])
            else:  # one step per record, not per update
                self._unexecuted.extend([log, at + i, at + i + 1, k] for i, k in enumerate(updates.tolist()))

    def sending(self, origins) -> None:
        """A Kafka record covering these input records was produced."""
        with self._lock:
            for o in origins:
                log = self._logs[o[:2]]
                i = log.find(o[2])
                log.wait[i] += 1
                log.sent[i] = True

    def acked(self, origins) -> None:
        """The broker has a Kafka record covering these input records. A failed delivery is
        never reported here: its records stay pending, so their offsets are never committed."""
        with self._lock:
            touched = set()
            for o in origins:
                log = self._logs[o[:2]]
                i = log.find(o[2])
                log.wait[i] -= 1
                if i == log.head - log.base and not log.wait[i]:  # only a done head moves the prefix
                    touched.add(log)
            self._advance(touched)

    def executed(self, records: int) -> None:
        """The pipeline finished the next `records` updates (in submission order)."""
        with self._lock:
            touched = set()
            while records:
                run = self._unexecuted[0]
                log, lo, hi, left = run
                if hi - lo > 1:  # records of one update each: the next ones are done executing
                    take = min(records, hi - lo)
                    log.wait[lo - log.base: lo - log.base + take] -= 1
                    run[1] = lo + take
                    finished = run[1] == hi
                else:
                    take = min(records, left)
                    log.wait[lo - log.base] -= take
                    run[3] = left - take
                    finished = run[3] == 0
                records -= take
                if finished:
                    self._unexecuted.popleft()
                if lo == log.head:
                    touched.add(log)
            self._advance(touched)

    def _advance(self, touched: set[_Log]) -> None:
        """Move the done prefix of the touched logs; on_done gets the arrival times of all the
        records it passed at once, and which had deltas (one metric update, not one per record)."""
        passed = []
        for log in touched:
            done = log.advance()
            if done is not None:
                passed.append(done)
                self._committable[log.key] = log.committable
        if passed and self._on_done is not None:
            self._on_done(*(np.concatenate(x) for x in zip(*passed)))

    def committable(self) -> dict[tuple[str, int], int]:
        """(input, partition) -> next offset, for every partition with a done prefix so far."""
        with self._lock:
            return dict(self._committable)

    def pending(self) -> int:
        """Input records not done yet."""
        with self._lock:
            return sum(log.tail - log.head for log in self._logs.values())
