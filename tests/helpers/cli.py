"""The real `localchat` command in a subprocess, and the one-line-error assertion."""

from __future__ import annotations

import os
import subprocess
import sys

from helpers import warm_cli


def localchat(*args: str, stdin: str | None = None, env_extra: dict | None = None,
              timeout: float = 180) -> subprocess.CompletedProcess:
    """Run `python -m localchat ARGS` with this environment (plus env_extra); text output.
    A fork of a process that has imported torch and llama_cpp already (warm_cli.py)."""
    env = {**os.environ, **(env_extra or {})}
    if warm_cli.ENABLED:
        return warm_cli.run(list(args), input=stdin if stdin is not None else "", env=env,
                            timeout=timeout)
    return subprocess.run([sys.executable, "-m", "localchat", *args],
                          input=stdin if stdin is not None else "",
                          capture_output=True, text=True, timeout=timeout, env=env)


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """A user mistake: non-zero exit, no stdout, one `localchat…: error:` line naming each needle."""
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(("localchat: error: ", "localchat run: error: ")), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert proc.stdout == ""
