"""Leaving the process once a command is done, without Python's module teardown: after torch
is imported that teardown alone takes 0.3-0.4 s (Zen 3), which every one-shot command would
otherwise wait for (docs/architecture.md, Decisions)."""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def exit_now(code: int | None) -> NoReturn:
    """Exit with `code` after what a normal exit does first: threads' exit hooks and
    non-daemon threads joined, atexit handlers run, stdout and stderr flushed (a closed pipe
    there is 141, as main's BrokenPipeError)."""
    threading._shutdown()  # what the interpreter calls first: ThreadPoolExecutor hooks, joins
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            code = code or 141
        except (OSError, ValueError):  # a closed or failing stream: as Python's own exit
            code = code or 120
    os._exit(code or 0)
