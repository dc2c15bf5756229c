"""`localchat bench --task start`: a one-shot prompt's whole process, as a script runs it
(`localchat run "Hi" -n 1`), timed from exec to exit, repeated; min and median per engine.
Each run has a fresh data dir (history written as usual, no snapshot to restore)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

from localchat.errors import EngineError

COMMAND = ("run", "Hi", "-n", "1")


def time_start(model: str, engine: str, threads: int | None) -> float:
    """Seconds for one whole `localchat run "Hi" -n 1` process on this engine."""
    argv = [sys.executable, "-m", "localchat", *COMMAND, "-m", model, "--engine", engine]
    if threads:
        argv += ["-t", str(threads)]
    with tempfile.TemporaryDirectory(prefix="localchat-start-") as home:
        env = {**os.environ, "LOCALCHAT_HOME": home}
        t0 = time.perf_counter()
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, env=env)
        seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise EngineError(f"`localchat {' '.join(COMMAND)}` on {engine} failed: "
                          f"{(done.stderr.strip().splitlines() or ['no message'])[-1]}")
    return seconds


def bench_start(model: str, engines: list[str], repeats: int, threads: int | None) -> dict:
    """Per engine: every run's seconds, min and median; the engines take turns run by run
    (a first run of each, not timed, warms the OS's file cache as a user's second run)."""
    for engine in engines:
        time_start(model, engine, threads)
    runs: dict[str, list[float]] = {e: [] for e in engines}
    for _ in range(repeats):
        for engine in engines:
            runs[engine].append(time_start(model, engine, threads))
    return {e: {"min_s": min(r), "median_s": statistics.median(r), "runs_s": r}
            for e, r in runs.items()}


def format_start(report: dict) -> str:
    lines = [f"one-shot start: `localchat {' '.join(COMMAND)}`, whole process, "
             f"{report['repeats']} runs each ({report['model']})"]
    for engine, r in report["engines"].items():
        lines.append(f"  {engine:10s} min {r['min_s']:.2f} s, median {r['median_s']:.2f} s")
    return "\n".join(lines)
