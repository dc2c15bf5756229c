"""The runtime's step loop on the compute thread (continuous batching): schedule -> draft
(and forced tokens) -> executor.forward -> choose tokens -> cut rejected drafts -> hand
them out. Callers on any thread submit a Sequence and read its queue; one that stops
reading cancels it. Speculation is the Speculator's, counters and timers the observer's."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from typing import Callable, Iterator

import numpy as np

from localchat.engine.base import SamplingParams
from localchat.engine.runtime.block_manager import BlockManager
from localchat.engine.runtime.choose import choose_tokens, constraint_masks
from localchat.engine.runtime.compute_thread import COMPUTE
from localchat.engine.runtime.decided import decided_rows, with_decided_rows
from localchat.engine.runtime.executor_api import Chunk, Executor
from localchat.engine.runtime.guide import Guide
from localchat.engine.runtime.kv_disk import DiskCache
from localchat.engine.runtime.scheduler import ScheduledChunk, Scheduler
from localchat.engine.runtime.sequence import FINISHED, Sequence
from localchat.engine.runtime.speculative.drafts import DraftSource
from localchat.engine.runtime.speculative.speculator import Speculator
from localchat.engine.runtime.step_observer import StepObserver
from localchat.engine.runtime.thread_governor import governor_for
from localchat.errors import EngineError

_DONE = object()
CANCEL_POLL_S = 0.05  # how often a reader waiting for a token looks at its cancel event


class Runner:
    def __init__(self, executor: Executor, is_end_of_generation: Callable[[int], bool], *,
                 n_ctx: int, draft: DraftSource | None = None,
                 num_draft_tokens: int | None = None, max_tokens_per_step: int = 512,
                 max_running: int = 64, adapt_threads: bool = False) -> None:
        """adapt_threads: let measured step times choose the executor's thread count (where
        it can change it), as when the user named none."""
        self.executor = executor
        self.blocks = BlockManager(executor.layout)
        if executor.layout.exclusive:
            max_running = min(max_running, executor.layout.pools)
        self.scheduler = Scheduler(self.blocks, max_tokens_per_step, max_running)
        self.speculator = Speculator(executor, self.blocks, self.scheduler, n_ctx=n_ctx,
                                     draft=draft, num_draft_tokens=num_draft_tokens)
        self.observer = StepObserver(governor_for(executor, draft) if adapt_threads else None)
        self.n_ctx = n_ctx
        self._is_end = is_end_of_generation
        self._ids = itertools.count()
        self._inbox: list[Sequence] = []
        self._lock = threading.Lock()
        self._closed = False
        self.disk: DiskCache | None = None  # KV snapshots on disk (use_disk())
        COMPUTE.add(self)

    @property
    def clock(self) -> Callable[[], float]:
        """What steps (and the draft's catch-up) are timed with; tests inject timings."""
        return self.observer.clock

    @clock.setter
    def clock(self, clock: Callable[[], float]) -> None:
        self.observer.clock = clock
        draft = self.speculator.draft
        for source in (draft, getattr(draft, "model", None)):
            if hasattr(source, "clock"):
                source.clock = clock

    def use_disk(self, disk: DiskCache) -> None:
        """Restore prompts' prefixes from these snapshots and save finished replies' KV."""
        self.disk = disk
        self.scheduler.before_admit = disk.restore

    # ---- caller side ---------------------------------------------------------------

    def submit(self, prompt: list[int], params: SamplingParams, budget: int,
               generator: np.random.Generator, guide: Guide | None = None) -> Sequence:
        seq = Sequence(next(self._ids), list(prompt), len(prompt), params, budget, generator)
        seq.guide = guide
        seq.speculation = self.speculator.speculation_for(seq)
        with self._lock:
            if self._closed:
                raise EngineError("the engine is closed")
            self._inbox.append(seq)
        COMPUTE.wake()
        return seq

    def tokens(self, seq: Sequence, cancel: threading.Event | None = None
               ) -> Iterator[int | tuple[int, bool]]:
        """The sequence's tokens as they come; they stop when `cancel` is set (even while
        the sequence waits for its turn), and closing this cancels it."""
        try:
            while True:
                if cancel is not None and cancel.is_set():
                    return
                try:
                    item = seq.out.get(timeout=CANCEL_POLL_S)
                except queue.Empty:
                    continue
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.cancel(seq)

    def cancel(self, seq: Sequence) -> None:
        if seq.status != FINISHED:
            seq.cancelled = True
            COMPUTE.wake()

    def close(self) -> None:
        """Stop stepping; requests still in flight end with an error."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        COMPUTE.call(self._shut_down)

    def _shut_down(self) -> None:
        COMPUTE.remove(self)
        self._fail_all(EngineError("the engine was closed"))

    # ---- the steps (on the compute thread) -------------------------------------------

    def has_work(self) -> bool:
        return bool(self._inbox) or self.scheduler.has_work()

    def step(self) -> bool:
        """One forward pass over what the scheduler picks; False if nothing could run
        yet (no blocks free: cannot last, finishing requests free them)."""
        with self._lock:
            for seq in self._inbox:
                self.scheduler.add(seq)
            self._inbox.clear()
        try:
            return self._step()
        except Exception as exc:  # noqa: BLE001 -- every waiting caller must hear of it
            self._fail_all(EngineError(f"the {self.executor.name} engine failed: {exc}"))
            return True

    def _step(self) -> bool:
        chunks = self.scheduler.schedule()
        if not chunks:
            return False
        self.speculator.prefill(chunks)
        self.observer.start(chunks)
        round_ = self.speculator.propose(chunks)
        self.observer.drafted(chunks)
        masks = self._masks(chunks)
        new_tokens, passed = self._forward_and_choose(chunks, masks)
        self.observer.forced_kept += self.speculator.cut_rejected(chunks, new_tokens)
        self.scheduler.after_step(chunks)
        self._observe(chunks, passed, round_, new_tokens)
        for chunk in (c for c in chunks if c.samples):
            self._hand_out(chunk, new_tokens[chunk.seq.seq_id])
        return True

    def _masks(self, chunks: list[ScheduledChunk]) -> dict[int, np.ndarray]:
        t0 = time.perf_counter()
        masks = constraint_masks(chunks)
        if masks:
            self.observer.masked(time.perf_counter() - t0, len(masks))
        return masks

    def _forward_and_choose(self, chunks: list[ScheduledChunk], masks: dict
                            ) -> tuple[dict[int, list], list[Chunk]]:
        """The executor's pass (rows a grammar decides are not asked for), then each
        sampling sequence's new tokens."""
        decided = decided_rows(chunks, masks)
        passed = [self._executor_chunk(c, d) for c, d in zip(chunks, decided)]
        logits = with_decided_rows(self.executor.forward(passed), decided, chunks)
        return choose_tokens(chunks, logits, masks), passed

    def _observe(self, chunks: list[ScheduledChunk], passed: list[Chunk], round_,
                 new_tokens: dict[int, list]) -> None:
        timing = self.observer.finish(chunks)
        self.observer.forced_proposed += round_.forced
        self.speculator.record(round_, new_tokens, decoding=self.observer.decoding,
                               draft_s=timing.draft_s, verify_s=timing.verify_s,
                               step_s=timing.step_s, settled=timing.settled,
                               tokens_passed=sum(len(c.tokens) for c in passed),
                               rows=sum(len(c.drafts) + 1 for c in chunks))

    def _executor_chunk(self, chunk: ScheduledChunk, decided: tuple[int, ...]) -> Chunk:
        seq = chunk.seq
        return Chunk(slot=seq.slot, tokens=seq.tokens[chunk.start:chunk.end] + chunk.drafts,
                     start=chunk.start,
                     n_logits=1 + len(chunk.drafts) if chunk.samples else 0,
                     block_table=self.blocks.block_table(seq),
                     write_from=self.blocks.num_committed(seq), n_prompt=seq.n_prompt,
                     copy_from=self.blocks.take_copy(seq), no_logits=decided)

    def _hand_out(self, chunk: ScheduledChunk, new: list[int | tuple[int, bool]]) -> None:
        """Append the new tokens and queue them; a sequence that ends (end-of-generation,
        budget, its grammar complete: then its end token follows) gives its blocks back
        before its last token is handed out."""
        seq, guide = chunk.seq, chunk.seq.guide
        complete = False
        for i, item in enumerate(new):
            token = item[0] if isinstance(item, tuple) else item
            seq.tokens.append(token)
            end = self._is_end(token)
            done = end or len(seq.tokens) - seq.n_prompt >= seq.budget
            if guide is not None and end and not guide.accepting:
                self.scheduler.finish(seq)  # never a "stop" for text the grammar has not accepted
                seq.out.put(EngineError("the reply ended before its constraint was met"))
                return
            if guide is not None and not end:
                if not guide.consume(token):
                    self.scheduler.finish(seq)
                    seq.out.put(EngineError(f"the constraint refused a token: {guide.error}"))
                    return
                complete = guide.complete
            if done or complete or i == len(new) - 1:
                break
        handed = list(new[:i + 1])
        if complete and not done:
            seq.tokens.append(guide.end_token)
            handed.append(guide.end_token)
            done = True
        self.speculator.settle(seq)
        if done:
            self.scheduler.finish(seq)
            if self.disk is not None:  # before its last token: the reply's stats say it
                self.disk.note(seq)
        for item in handed:
            seq.out.put(item)
        if done:
            seq.out.put(_DONE)
            if self.disk is not None:
                self.disk.save(seq)

    def _fail_all(self, error: EngineError) -> None:
        with self._lock:
            pending = [*self.scheduler.running, *self.scheduler.waiting, *self._inbox]
            self._inbox.clear()
        for seq in pending:
            try:
                self.scheduler.finish(seq)
            except Exception:  # noqa: BLE001 -- the bookkeeping may be what failed
                seq.status = FINISHED
            seq.out.put(error)

