"""At-least-once bookkeeping: which input records are done, and which offsets may be committed.

A record is done when every update it holds has been executed and every Kafka
record it caused (deltas, or its dead letter) has been acknowledged. The
committable offset of a partition is one past the longest done prefix of its
records: committing more could lose deltas in a crash, committing less only
brings duplicates, which delta ids let consumers drop.
"""

from __future__ import annotations

import threading
import time
from collections import deque


def unwatched(_origins) -> None:
    """on_ack of Kafka records no input offset waits for (control announcements, dead letters of control records)."""


class _Entry:
    __slots__ = ("origin", "records", "acks", "arrived")

    def __init__(self, origin, records, arrived):
        self.origin, self.records, self.acks, self.arrived = origin, records, 0, arrived

    @property
    def done(self) -> bool:
        return self.records == 0 and self.acks == 0


class DeliveryTracker:
    """Thread-safe: records are submitted by the consumer loop, executed by the pipeline's
    output stage and acknowledged from the producer's delivery reports."""

    def __init__(self, on_done=None):
        self._lock = threading.Lock()
        self._entries: dict[tuple, _Entry] = {}
        self._by_partition: dict[tuple[str, int], deque[_Entry]] = {}
        self._unexecuted: deque[_Entry] = deque()  # entries with updates still in the pipeline, in order
        self._committable: dict[tuple[str, int], int] = {}
        self._on_done = on_done  # called with the finished entries' arrival times (latency metric)

    def submitted(self, origin: tuple, updates: int, sends: int = 0, arrived: float | None = None) -> None:
        """An input record entered the daemon holding `updates` updates, and `sends` Kafka records
        of its own are about to be produced (1 for its dead letter). Counting them here, not in a
        later `sending`, keeps a record with nothing left to wait for from being done (and
        forgotten) before its dead letter is produced."""
        e = _Entry(origin, updates, time.monotonic() if arrived is None else arrived)
        e.acks = sends
        with self._lock:
            self._entries[origin] = e
            self._by_partition.setdefault(origin[:2], deque()).append(e)
            if updates:
                self._unexecuted.append(e)
            else:
                self._advance([origin[:2]])

    def submitted_run(self, input: str, partition: int, offsets: list[int]) -> None:
        """Input records of one partition entered the daemon, in order, holding one update each
        (submitted for each, under one lock)."""
        key, now = (input, partition), time.monotonic()
        entries = [_Entry((input, partition, o), 1, now) for o in offsets]
        with self._lock:
            self._entries.update((e.origin, e) for e in entries)
            self._by_partition.setdefault(key, deque()).extend(entries)
            self._unexecuted.extend(entries)

    def sending(self, origins) -> None:
        """A Kafka record covering these input records was produced."""
        with self._lock:
            for o in origins:
                self._entries[o].acks += 1

    def acked(self, origins) -> None:
        """The broker has a Kafka record covering these input records. A failed delivery is
        never reported here: its records stay pending, so their offsets are never committed."""
        with self._lock:
            touched = set()
            for o in origins:
                e = self._entries[o]
                e.acks -= 1
                if e.done:
                    touched.add(o[:2])
            self._advance(touched)

    def executed(self, records: int) -> None:
        """The pipeline finished the next `records` updates (in submission order)."""
        with self._lock:
            touched = set()
            while records:
                e = self._unexecuted[0]
                take = min(records, e.records)
                e.records -= take
                records -= take
                if e.records == 0:
                    self._unexecuted.popleft()
                    touched.add(e.origin[:2])
            self._advance(touched)

    def _advance(self, keys) -> None:
        """Move the done prefix of each (input, partition) in `keys`; on_done gets the arrival
        times of all the records it passed at once (one metric update, not one per record)."""
        arrived = []
        for key in keys:
            q = self._by_partition[key]
            while q and q[0].done:
                e = q.popleft()
                del self._entries[e.origin]
                self._committable[key] = e.origin[2] + 1
                arrived.append(e.arrived)
        if arrived and self._on_done is not None:
            self._on_done(arrived)

    def committable(self) -> dict[tuple[str, int], int]:
        """(input, partition) -> next offset, for every partition with a done prefix so far."""
        with self._lock:
            return dict(self._committable)

    def pending(self) -> int:
        """Input records not done yet."""
        with self._lock:
            return len(self._entries)
