"""Ctrl+C while a command generates: the first press cancels cleanly, a second one
interrupts at once (as in llama.cpp). Shared by `localchat run` and `run --batch`."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def ctrl_c_cancels(cancel: threading.Event) -> Iterator[None]:
    """First Ctrl+C stops the reply cleanly (finish_reason 'cancelled', exit 130, the
    text so far kept); a second one interrupts at once, as in llama.cpp."""

    def on_sigint(signum, frame) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
