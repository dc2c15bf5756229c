"""`localchat ARGS` for tests: in this process (main(argv) with its own stdin, stdout, stderr
and environment; fast, and a bug fails with its traceback), or as a real process where the
test is about the process (signals, the terminal, what a fresh interpreter imports); and the
one-line-error assertion."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from contextlib import contextmanager


def localchat(*args: str, stdin: str | None = None, env_extra: dict | None = None,
              timeout: float = 180, process: bool = False) -> subprocess.CompletedProcess:
    """Run `localchat ARGS` (stdin: its input, text; env_extra: added to the environment for
    the call); process=True: `python -m localchat` in a subprocess, bounded by timeout."""
    if process:
        return subprocess.run([sys.executable, "-m", "localchat", *args],
                              input=stdin if stdin is not None else "", capture_output=True,
                              text=True, timeout=timeout, env={**os.environ, **(env_extra or {})})
    return in_process(list(args), stdin or "", env_extra or {})


def in_process(argv: list[str], stdin: str, env_extra: dict) -> subprocess.CompletedProcess:
    """main(argv) with stdin from text (a pipe, not a terminal) and stdout/stderr captured;
    the exit status as the process would give it."""
    from localchat.cli import main

    streams = [_text_stream(stdin.encode()), _text_stream(b""), _text_stream(b"")]
    with _environment(env_extra), _swapped(*streams):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's errors and --help
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
    out, err = (_read(s) for s in streams[1:])
    return subprocess.CompletedProcess(["localchat", *argv], code or 0, out, err)


def _text_stream(data: bytes) -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace",
                            write_through=True)


def _read(stream: io.TextIOWrapper) -> str:
    stream.flush()
    return stream.buffer.getvalue().decode("utf-8", errors="replace")


@contextmanager
def _swapped(stdin, stdout, stderr):
    saved = sys.stdin, sys.stdout, sys.stderr
    sys.stdin, sys.stdout, sys.stderr = stdin, stdout, stderr
    try:
        yield
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved


@contextmanager
def _environment(extra: dict):
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update({k: str(v) for k, v in extra.items()})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


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
