"""The torch engine's step loop: every request in flight runs together, one forward
pass per step (continuous batching), on the process's compute thread.

Callers on any thread submit a request and read its tokens from a queue; each step
asks the scheduler what runs next, builds one batch of everyone's new tokens, runs the
model once, samples each sequence that is due with its own generator (so a request
samples exactly what it would alone), and hands the tokens out. A caller that stops
reading (a stop string, a cancel, a closed connection) cancels its sequence, and the
next step frees its blocks.
"""

from __future__ import annotations

import itertools
import queue
import threading
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from localchat.engine.base import SamplingParams
from localchat.engine.torch.blocks import BlockPool
from localchat.engine.compute_thread import COMPUTE
from localchat.engine.torch.model import Batch, KVStore, LlamaModel
from localchat.engine.torch.sampler import sample
from localchat.engine.torch.scheduler import FINISHED, ScheduledChunk, Scheduler, SequenceState
from localchat.errors import EngineError

_DONE = object()


@dataclass
class _Sampling:
    params: SamplingParams
    budget: int  # most tokens to generate
    generator: torch.Generator
    out: queue.SimpleQueue


class BatchRunner:
    def __init__(self, model: LlamaModel, kv: KVStore, pool: BlockPool,
                 is_end_of_generation: Callable[[int], bool], *,
                 max_tokens_per_step: int = 512, max_running: int = 64) -> None:
        self.model, self.kv, self.pool = model, kv, pool
        self.scheduler = Scheduler(pool, max_tokens_per_step, max_running)
        self._is_end = is_end_of_generation
        self._ids = itertools.count(1 << 20)  # apart from the speculative path's ids
        self._inbox: list[SequenceState] = []
        self._lock = threading.Lock()
        self._closed = False
        self.steps = 0
        self.batch_sizes: list[int] = []  # sequences per step, for benchmarks and tests
        COMPUTE.add(self)

    # ---- caller side ---------------------------------------------------------------

    def submit(self, prompt: list[int], params: SamplingParams, budget: int,
               generator: torch.Generator) -> SequenceState:
        seq = SequenceState(next(self._ids), list(prompt), len(prompt))
        seq.payload = _Sampling(params, budget, generator, queue.SimpleQueue())
        with self._lock:
            if self._closed:
                raise EngineError("the engine is closed")
            self._inbox.append(seq)
        COMPUTE.wake()
        return seq

    def tokens(self, seq: SequenceState) -> Iterator[int]:
        """The sequence's sampled tokens as they come; closing this cancels it."""
        try:
            while True:
                item = seq.payload.out.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            self.cancel(seq)

    def cancel(self, seq: SequenceState) -> None:
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
            self._fail_all(EngineError(f"the torch engine failed: {exc}"))
            return True

    def _step(self) -> bool:
        chunks = self.scheduler.schedule()
        if not chunks:
            return False
        logits = self.model.forward_batch(self._batch(chunks), self.kv)
        self.scheduler.after_step(chunks)
        self.steps += 1
        self.batch_sizes.append(len(chunks))
        rows = iter(range(logits.shape[0]))
        for chunk in chunks:
            if chunk.samples:
                self._sample(chunk.seq, logits[next(rows)])
        return True

    def _sample(self, seq: SequenceState, logits: torch.Tensor) -> None:
        s: _Sampling = seq.payload
        token = sample(logits, s.params, seq.completion, s.generator)
        seq.tokens.append(token)
        done = self._is_end(token) or len(seq.tokens) - seq.n_prompt >= s.budget
        if done:  # blocks back first, so the caller's final stats see them freed
            self.scheduler.finish(seq)
        s.out.put(token)
        if done:
            s.out.put(_DONE)

    def _batch(self, chunks: list[ScheduledChunk]) -> Batch:
        pool, bs = self.pool, self.pool.block_size
        tokens: list[int] = []
        positions: list[torch.Tensor] = []
        new_slots: list[int] = []
        seqs: list[tuple[int, torch.Tensor]] = []
        logit_rows: list[int] = []
        for chunk in chunks:
            seq = chunk.seq
            tokens += seq.tokens[chunk.start:chunk.end]
            positions.append(torch.arange(chunk.start, chunk.end))
            new_slots += pool.slot_mapping(seq.seq_id, chunk.start, chunk.end)
            table = torch.tensor(pool.block_table(seq.seq_id))
            context = (table[:, None] * bs + torch.arange(bs)).flatten()[:chunk.end]
            seqs.append((chunk.end - chunk.start, context))
            if chunk.samples:
                logit_rows.append(len(tokens) - 1)
        return Batch(torch.tensor(tokens), torch.cat(positions), torch.tensor(new_slots), seqs,
                     torch.tensor(logit_rows, dtype=torch.long))

    def _fail_all(self, error: EngineError) -> None:
        with self._lock:
            pending = [*self.scheduler.running, *self.scheduler.waiting, *self._inbox]
            self._inbox.clear()
        for seq in pending:
            try:
                self.scheduler.finish(seq)
            except Exception:  # noqa: BLE001 -- the bookkeeping may be what failed
                seq.status = FINISHED
            seq.payload.out.put(error)
