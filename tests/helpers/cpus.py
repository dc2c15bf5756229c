"""Each pytest-xdist worker computes on its own share of the CPUs, as a process in a cpuset
would: two workers whose engines each ran 2 threads on 2 cores took 10:14 for `make test`
against 8:06 pinned (docs/testing.md). Tests about threads take every CPU back (all_cpus)."""

from __future__ import annotations

import os
import sys

ALL = frozenset(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else frozenset()


def worker_share() -> frozenset[int]:
    """This worker's CPUs (every CPU outside xdist, or where there are fewer CPUs than workers)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    if workers < 2 or len(ALL) < workers or not worker[2:].isdigit():
        return ALL
    return frozenset(sorted(ALL)[int(worker[2:]) % workers::workers])


def run_on(cpus: frozenset[int]) -> None:
    """Every thread of this process (the compute thread and OpenMP's pools included) on cpus,
    and torch's default thread count to match; threads started later inherit it, and so do
    child processes."""
    if not cpus:
        return
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # the thread has ended
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(len(cpus))
