"""The one thread that runs every executor's compute: one-off calls and steppers (the
runners). One, because PyTorch and llama.cpp share a libgomp that slows every kernel once
two threads have started parallel work (docs/architecture.md, "One compute thread")."""

from __future__ import annotations

import atexit
import threading
from concurrent.futures import Future
from typing import Callable, Protocol, TypeVar

T = TypeVar("T")
IDLE_POLL_S = 0.01  # a stepper that has work but could not run it (no free blocks yet)


class Stepper(Protocol):
    def has_work(self) -> bool: ...

    def step(self) -> bool:
        """One step; False when nothing could run (the loop then waits a little)."""


class ComputeThread:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._tasks: list[tuple[Callable, tuple, Future]] = []
        self._steppers: list[Stepper] = []
        self._thread: threading.Thread | None = None
        self._exiting = False

    def on_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def call(self, fn: Callable[..., T], *args) -> T:
        """fn(*args) on the compute thread; its result, or its exception raised here."""
        return self.submit(fn, *args).result()

    def submit(self, fn: Callable[..., T], *args) -> "Future[T]":
        """fn(*args) started on the compute thread; its future (run here, done, where this
        is the compute thread or the interpreter is shutting down)."""
        future: Future = Future()
        with self._cond:
            inline = self.on_thread() or self._exiting  # exiting: the loop is gone
            if not inline:
                self._tasks.append((fn, args, future))
                self._start()
                self._cond.notify()
        if inline:
            _run(fn, args, future)
        return future

    def add(self, stepper: Stepper) -> None:
        with self._cond:
            self._steppers.append(stepper)
            self._start()

    def remove(self, stepper: Stepper) -> None:
        with self._cond:
            if stepper in self._steppers:
                self._steppers.remove(stepper)

    def wake(self) -> None:
        """A stepper has new work (a request, a cancel)."""
        with self._cond:
            self._cond.notify()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="localchat-compute", daemon=True)
            self._thread.start()
            atexit.register(self._stop)  # not mid-kernel while the interpreter shuts down

    def _stop(self) -> None:
        with self._cond:
            self._exiting = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        idle = False
        while True:
            with self._cond:
                while not (self._exiting or self._tasks
                           or any(s.has_work() for s in self._steppers)):
                    self._cond.wait()
                if self._exiting:
                    return
                if idle and not self._tasks:
                    self._cond.wait(timeout=IDLE_POLL_S)
                tasks, self._tasks = self._tasks, []
                steppers = list(self._steppers)
            for fn, args, future in tasks:
                _run(fn, args, future)
            ran = [s.step() for s in steppers if s.has_work()]
            idle = bool(ran) and not any(ran)


def _run(fn: Callable, args: tuple, future: Future) -> None:
    if future.set_running_or_notify_cancel():
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 -- the caller re-raises it
            future.set_exception(exc)


COMPUTE = ComputeThread()  # one per process: see the module docstring
