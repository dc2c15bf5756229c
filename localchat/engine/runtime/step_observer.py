"""Counters and timers beside the step loop, not in it: each step's timestamps (start,
drafted, verified) for the speculation controllers, the thread governor's view of step
times, and the totals `bench` reads (steps, steps by batch size, constraint masks, forced
tokens)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from localchat.engine.runtime.scheduler import ScheduledChunk
from localchat.engine.runtime.thread_governor import ThreadGovernor


@dataclass(frozen=True)
class StepTiming:
    draft_s: float  # from the step's start to its drafts being ready
    verify_s: float  # the forward pass, choosing tokens and cutting rejected drafts
    step_s: float
    settled: bool = True  # at the thread count the governor chose (not a probe's candidate)


class StepObserver:
    def __init__(self, governor: ThreadGovernor | None = None) -> None:
        self.clock: Callable[[], float] = time.perf_counter
        self.threads = governor  # None: the user named a count, or it cannot change
        self.steps = 0
        # steps run with each number of sequences (bounded: one key per batch size seen)
        self.steps_by_batch_size: Counter[int] = Counter()
        self.mask_s = 0.0  # time spent computing constraint masks, and the rows masked
        self.masked_rows = 0
        self.forced_proposed = self.forced_kept = 0  # tokens grammars forced, drafted and kept
        self._decoding = False
        self._shape: tuple[int, int] | None = None  # (sequences, tokens) of a decoding step
        self._t0 = self._t_drafted = 0.0

    def start(self, chunks: list[ScheduledChunk]) -> None:
        """Before drafting: a draft model drafts at the chosen thread count."""
        self._decoding = all(c.decodes for c in chunks)  # before the step's tokens are handed out
        if self.threads is not None:
            self.threads.before_step(None)
        self._t0 = self.clock()

    def drafted(self, chunks: list[ScheduledChunk]) -> None:
        """The drafts are in the chunks: the step's shape sets the target's thread count."""
        self._t_drafted = self.clock()
        self._shape = (len(chunks), sum(c.end - c.start + len(c.drafts) for c in chunks)) \
            if self._decoding else None
        if self.threads is not None:
            self.threads.before_step(self._shape)

    def masked(self, seconds: float, rows: int) -> None:
        self.mask_s += seconds
        self.masked_rows += rows

    def finish(self, chunks: list[ScheduledChunk]) -> StepTiming:
        t_verified = self.clock()
        step_s = t_verified - self._t0
        settled = self.threads is None or self.threads.settled
        if self.threads is not None:
            self.threads.observe(self._shape, step_s)
        self.steps += 1
        self.steps_by_batch_size[len(chunks)] += 1
        return StepTiming(self._t_drafted - self._t0, t_verified - self._t_drafted, step_s,
                          settled)

    @property
    def decoding(self) -> bool:
        """The last step only decoded (no prompt chunk in it)."""
        return self._decoding
