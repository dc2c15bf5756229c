"""A one-line progress bar on stderr for the long steps, drawn only when stderr is a terminal
(at most ~10 redraws a second; no tqdm dependency)."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, total: int, stream=None) -> None:
        self.label, self.total, self.done = label, max(total, 1), 0
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self._last = 0.0
        self._start = time.perf_counter()

    def advance(self, n: int = 1, note: str = "") -> None:
        self.done += n
        now = time.perf_counter()
        if self.enabled and (now - self._last > 0.1 or self.done >= self.total):
            self._last = now
            filled = int(24 * self.done / self.total)
            self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (24 - filled)}] "
                              f"{self.done}/{self.total} {now - self._start:5.1f}s {note[:40]:40s}")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
