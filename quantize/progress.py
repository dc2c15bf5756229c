"""A one-line progress bar on stderr for the long steps, with the time left at this run's own
pace: redrawn in place on a terminal (at most ~10 times a second), a line every 10 % to a log
once a step has run 30 s (no tqdm dependency)."""

from __future__ import annotations

import sys
import time

QUIET_S = 30.0  # not a terminal: nothing is logged for steps shorter than this


def clock(seconds: float) -> str:
    """12s, 4m05s, 1h02m."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
    def __init__(self, label: str, total: int, stream=None) -> None:
        self.label, self.total, self.done = label, max(total, 1), 0
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self._last = 0.0
        self._logged = 0  # tenths of the total already logged (not a terminal)
        self._start = time.perf_counter()
        self._counted_from: tuple[int, float] | None = None  # (done, time) the pace counts from

    def eta(self, now: float | None = None) -> float | None:
        """Seconds left at the pace since the first advance of this run (None before two)."""
        now = time.perf_counter() if now is None else now
        if self._counted_from is None or self.done <= self._counted_from[0]:
            return None
        start_done, start_t = self._counted_from
        pace = (now - start_t) / (self.done - start_done)
        return pace * (self.total - self.done)

    def advance(self, n: int = 1, note: str = "") -> None:
        now = time.perf_counter()
        if self._counted_from is None:  # a resumed run's first advance is its earlier work
            self._counted_from = (self.done + n, now)
        self.done += n
        left = self.eta(now)
        eta = f" {clock(left)} left" if left is not None and self.done < self.total else ""
        if self.tty and (now - self._last > 0.1 or self.done >= self.total):
            self._last = now
            filled = int(24 * self.done / self.total)
            self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (24 - filled)}] "
                              f"{self.done}/{self.total} {clock(now - self._start):>6}{eta:14s} "
                              f"{note[:40]:40s}")
            self.stream.flush()
        elif not self.tty and self.done * 10 // self.total > self._logged and \
                now - self._start > QUIET_S:
            self._logged = self.done * 10 // self.total
            self.stream.write(f"{self.label}: {self.done}/{self.total} after "
                              f"{clock(now - self._start)}{eta} {note[:40]}\n".rstrip() + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
