"""Requests in flight: admission up to --max-queue, and a worker thread per request iterating
engine.generate(). A request holds its slot until its engine stream has ended (not its HTTP
response), so a departed client's KV cache is freed only once the engine has stopped."""

from __future__ import annotations

import asyncio
import threading
import time

from starlette.types import Receive

from localchat.engine.base import Engine, Event, Request, Result
from localchat.server.errors import ApiError

_END = object()  # the worker thread is done; nothing more will come


class Jobs:
    """Admission and bookkeeping for every request the server runs."""

    def __init__(self, engine: Engine, max_queue: int) -> None:
        self.engine = engine
        self.max_queue = max_queue
        self._lock = threading.Lock()
        self._jobs: set[Job] = set()
        self.totals = {"completed": 0, "cancelled": 0, "failed": 0}
        self.closing = False  # the server is stopping: running jobs are cancelled

    def admit(self) -> "Job":
        """A slot for one request, or 503 when --max-queue requests are in flight."""
        with self._lock:
            if self.closing:
                raise shutting_down()
            if len(self._jobs) >= self.max_queue:
                raise ApiError(503, f"the server is busy ({self.max_queue} requests in "
                                    "flight); retry shortly", code="queue_full",
                               headers={"Retry-After": "1"})
            job = Job(self)
            self._jobs.add(job)
            return job

    def counts(self) -> dict:
        """active: producing tokens; queued: admitted, waiting for their first token."""
        with self._lock:
            active = sum(1 for job in self._jobs if job.started)
            return {"active": active, "queued": len(self._jobs) - active,
                    "max_queue": self.max_queue, **self.totals}

    def in_flight(self) -> int:
        """Requests admitted and not yet ended. Takes no lock: a signal handler asks,
        perhaps while this thread holds it."""
        return len(self._jobs)

    def cancel_all(self) -> None:
        """Stop everything (at the next token): the server is shutting down."""
        with self._lock:
            self.closing = True
            jobs = list(self._jobs)
        for job in jobs:
            job.cancel.set()

    def join(self, timeout: float) -> None:
        """Wait (up to `timeout` seconds in all) for the worker threads to end."""
        deadline = time.monotonic() + timeout
        with self._lock:
            threads = [job.thread for job in self._jobs if job.thread is not None]
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _finish(self, job: "Job", outcome: str | None) -> None:
        with self._lock:
            if job in self._jobs:
                self._jobs.discard(job)
                if outcome is not None:
                    self.totals[outcome] += 1


class Job:
    """One request's engine stream, read from the event loop with next()."""

    def __init__(self, jobs: Jobs) -> None:
        self.jobs = jobs
        self.cancel = threading.Event()
        self.started = False  # the engine has produced its first event
        self.thread: threading.Thread | None = None
        self._queue: asyncio.Queue = asyncio.Queue()

    def start(self, request: Request) -> None:
        loop = asyncio.get_running_loop()
        self.thread = threading.Thread(target=self._run, args=(request, loop), daemon=True,
                                       name="localchat-generate")
        self.thread.start()

    def release(self) -> None:
        """Give the slot back for a request that never reached the engine."""
        if self.thread is None:
            self.jobs._finish(self, None)

    def _run(self, request: Request, loop: asyncio.AbstractEventLoop) -> None:
        outcome = "failed"
        try:
            for event in self.jobs.engine.generate(request, self.cancel):
                self.started = True
                if isinstance(event, Result):
                    outcome = "cancelled" if event.finish_reason == "cancelled" else "completed"
                self._put(loop, event)
        except BaseException as exc:  # handed to the request, which answers for it
            self._put(loop, exc)
        finally:
            self.jobs._finish(self, outcome)  # before _END: the KV is free once we get here
            self._put(loop, _END)

    def _put(self, loop: asyncio.AbstractEventLoop, item: object) -> None:
        try:
            loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:
            pass  # the event loop is gone (shutdown): nobody is waiting for this

    async def next(self) -> Event | None:
        """The next event; None once the stream has ended; raises what the engine raised."""
        item = await self._queue.get()
        if item is _END:
            self._queue.put_nowait(_END)  # stays ended for any later call
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    async def next_or_disconnect(self, receive: Receive) -> Event | None:
        """next(), cancelling the request if the client disconnects meanwhile."""
        watcher = asyncio.ensure_future(watch_disconnect(receive, self.cancel))
        try:
            return await self.next()
        finally:
            watcher.cancel()

    async def result(self, receive: Receive) -> Result:
        """Run to the end (cancelled if the client disconnects) and return the Result."""
        watcher = asyncio.ensure_future(watch_disconnect(receive, self.cancel))
        try:
            while True:
                event = await self.next()
                if event is None:
                    raise RuntimeError("the engine stream ended without a Result")
                if isinstance(event, Result):
                    return event
        finally:
            watcher.cancel()


def shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down", code="server_shutting_down")


async def watch_disconnect(receive: Receive, cancel: threading.Event) -> None:
    """Set `cancel` when the client goes away (the body has been read by now)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            cancel.set()
            return
