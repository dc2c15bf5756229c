"""`localchat bench --busy N`: N background processes that each keep one core busy (a spin
loop) while the benchmark runs, as another program on the machine would; they stop when it
ends, on an error or Ctrl-C too, and by themselves if this process dies."""

from __future__ import annotations

import os
import subprocess
import sys

from localchat.errors import UsageError

MAX_BUSY = 64
# spins until stopped, or until its parent (pid in argv) is gone: getppid() changes then
SPIN = ("import os, sys\nwhile os.getppid() == int(sys.argv[1]):\n"
        "    for _ in range(1_000_000):\n        pass\n")


def check_busy(n: int) -> int:
    if not 0 <= n <= MAX_BUSY:
        raise UsageError(f"--busy takes 0..{MAX_BUSY} background processes, got {n}")
    return n


class BusyCores:
    """A context manager: `with BusyCores(n):` runs n spinning processes inside it."""

    def __init__(self, n: int) -> None:
        self.n = check_busy(n)
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> "BusyCores":
        try:
            for _ in range(self.n):
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-c", SPIN, str(os.getpid())], stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait()
        self.procs.clear()
