"""Server-sent events for the remote engine: parsing, and reading a stream on a
background thread so that a cancelled reply returns at once, even while the server
is still computing its next chunk (a long prefill sends nothing for seconds).
"""

from __future__ import annotations

import queue
import threading
from typing import Callable, Iterable, Iterator

POLL_S = 0.05  # how often a waiting reader looks at the cancel event


def sse_data(lines: Iterable[str]) -> Iterator[str]:
    """The data of each event (multi-line data joined by newlines). Comments, other
    fields (event, id, retry) and empty events are skipped, as the SSE spec says."""
    data: list[str] = []
    for line in lines:
        if not line:  # a blank line ends the event
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value[1:] if value.startswith(" ") else value)
    if data:
        yield "\n".join(data)


class Cancelled(Exception):
    """The consumer's cancel event was set while waiting for the next item."""


_END = object()


class BackgroundStream:
    """Runs produce(stopped) on a daemon thread and hands its items (never None) over one at a time.
    `stopped` is a threading.Event set once nobody wants more items: produce should check it
    between items and then return (closing its HTTP response). An exception it raises is raised
    again from next_item()."""

    def __init__(self, produce: Callable[[threading.Event], Iterable[object]]) -> None:
        self._items: queue.Queue = queue.Queue()
        self.stopped = threading.Event()

        def run() -> None:
            try:
                for item in produce(self.stopped):
                    if self.stopped.is_set():
                        return
                    self._items.put((item, None))
            except BaseException as exc:  # noqa: BLE001 -- handed to the consumer
                self._items.put((None, exc))
                return
            self._items.put((_END, None))

        self._thread = threading.Thread(target=run, name="remote-stream", daemon=True)
        self._thread.start()

    def next_item(self, cancel: threading.Event) -> object | None:
        """The next item; None at the end; Cancelled once cancel is set."""
        while True:
            if cancel.is_set():
                raise Cancelled
            try:
                item, exc = self._items.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if exc is not None:
                raise exc
            if item is _END:
                return None
            return item

    def close(self) -> None:
        """Stop reading: the thread returns (and closes its response) at its next item."""
        self.stopped.set()
