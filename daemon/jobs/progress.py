"""A one-line progress bar on stderr, drawn only when stderr is a terminal."""

import sys
import time


class Progress:
    def __init__(self, total: int, what: str, enabled: bool | None = None):
        self.total, self.what, self.done = total, what, 0
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._last = 0.0

    def step(self, k: int = 1, note: str = "") -> None:
        self.done += k
        now = time.monotonic()
        if not self.enabled or (now - self._last < 0.1 and self.done < self.total):
            return
        self._last = now
        width = 30
        filled = width * self.done // max(self.total, 1)
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} {self.what} {note[:40]:<40}")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\r" + " " * 100 + "\r")
            sys.stderr.flush()
