"""Continuous batching: which sequences run in the next forward pass, with how many tokens
(running ones first, then waiting ones whose whole prompt fits), preempting by recompute when
blocks run out. Bookkeeping only, after vLLM's and nano-vllm's schedulers."""

from __future__ import annotations

import itertools
from collections import deque
from typing import Callable
from dataclasses import dataclass, field

from localchat.engine.runtime.block_manager import BlockManager
from localchat.engine.runtime.sequence import FINISHED, RUNNING, WAITING, Sequence


@dataclass
class ScheduledChunk:
    seq: Sequence
    start: int  # first position computed this step
    end: int  # one past the last; the sequence samples next when end == len(tokens)
    drafts: list[int] = field(default_factory=list)  # appended by speculation, verified here
    q: object = None  # the drafts' distributions ([γ, vocab] tensor), None if deterministic
    forced: bool = False  # the drafts are tokens the sequence's grammar forces

    @property
    def samples(self) -> bool:
        return self.end == len(self.seq.tokens)

    @property
    def decodes(self) -> bool:
        """One generated token in, the next out: a decode step (drafts may join it)."""
        return self.samples and self.end - self.start == 1 and self.start >= self.seq.n_prompt


class Scheduler:
    def __init__(self, blocks: BlockManager, max_tokens_per_step: int = 512,
                 max_running: int = 64) -> None:
        self.blocks = blocks
        self.max_tokens_per_step = max_tokens_per_step
        self.max_running = max_running
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions = 0
        self.recomputed_tokens = 0
        # called once per sequence just before its first admission, with a slot free for it
        # (the runner restores its prompt's KV from disk there)
        self.before_admit: Callable[[Sequence], None] | None = None
        self._arrivals = itertools.count()

    def add(self, seq: Sequence) -> None:
        seq.arrival = next(self._arrivals)
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """A finished or cancelled sequence leaves now and gives its blocks back."""
        if seq.status == RUNNING:
            self.blocks.free(seq)
            self.running.remove(seq)
        elif seq.status == WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        seq.status = FINISHED

    def schedule(self) -> list[ScheduledChunk]:
        for seq in [s for s in [*self.running, *self.waiting] if s.cancelled]:
            self.finish(seq)
        budget = self.max_tokens_per_step
        chunks: dict[int, ScheduledChunk] = {}
        preempted = False
        for seq in list(self.running):  # oldest first
            if seq.status != RUNNING:
                continue  # preempted for an older sequence earlier in this loop
            if budget == 0:
                break
            if seq.in_pool < len(seq.tokens):  # decoding: the sampled token needs a slot
                kept, evicted_any = self._make_room(seq, chunks)
                preempted |= evicted_any
                if not kept:
                    continue
                self.blocks.append_token(seq, seq.tokens[-1])
                seq.in_pool += 1
            n = self._chunk(seq, seq.computed, budget)
            chunks[seq.seq_id] = ScheduledChunk(seq, seq.computed, seq.computed + n)
            budget -= n
        if not preempted:
            budget = self._admit(budget, chunks)
        return list(chunks.values())

    def _make_room(self, seq: Sequence,
                   chunks: dict[int, ScheduledChunk]) -> tuple[bool, bool]:
        """Preempt until seq can take one more token: (seq still runs, anyone preempted)."""
        preempted = False
        while not self.blocks.can_append(seq):
            others = [s for s in self.running if s is not seq]
            if not others:
                self._preempt(seq)
                return False, True
            victim = min(others, key=lambda s: (s.computed, -s.arrival))
            chunks.pop(victim.seq_id, None)
            self._preempt(victim)
            preempted = True
        return True, preempted

    def _preempt(self, seq: Sequence) -> None:
        self.blocks.free(seq)
        self.running.remove(seq)
        seq.lost = seq.computed
        seq.computed = seq.in_pool = 0
        seq.status = WAITING
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)  # keeps its place: first in line once blocks free up

    def _admit(self, budget: int, chunks: dict[int, ScheduledChunk]) -> int:
        while self.waiting and budget > 0 and len(self.running) < self.max_running:
            seq = self.waiting[0]
            if self.before_admit is not None and not seq.disk_checked:
                seq.disk_checked = True
                self.before_admit(seq)
            if not self.blocks.can_admit(seq.tokens, len(self.running)):
                break  # in order: a large request is not overtaken forever by small ones
            cached = self.blocks.allocate(seq)
            self.waiting.popleft()
            if seq.cached_tokens is None:
                seq.cached_tokens = min(cached, seq.n_prompt)
            recomputed = max(0, seq.lost - cached)
            seq.recomputed_tokens += recomputed
            self.recomputed_tokens += recomputed
            seq.lost = 0
            seq.computed, seq.in_pool, seq.status = cached, len(seq.tokens), RUNNING
            self.running.append(seq)
            n = self._chunk(seq, cached, budget)
            chunks[seq.seq_id] = ScheduledChunk(seq, cached, cached + n)
            budget -= n
        return budget

    def _chunk(self, seq: Sequence, start: int, budget: int) -> int:
        """Tokens of seq to compute from `start`: all that are left if the budget allows,
        else a part that ends on a block boundary, so a prompt is computed in the same
        blocks however steps cut it (an executor may then give it the same bits)."""
        n = min(budget, len(seq.tokens) - start)
        if start + n < len(seq.tokens):
            aligned = n - (start + n) % self.blocks.block_size
            n = aligned if aligned > 0 else n
        return n

    def after_step(self, chunks: list[ScheduledChunk]) -> None:
        """The chunks' KV is written: commit it (full blocks join the prefix cache)."""
        for chunk in chunks:
            seq = chunk.seq
            if seq.status != RUNNING:
                continue
            end = chunk.end + len(chunk.drafts)  # the runner has cut rejected drafts off
            self.blocks.commit(seq, end)
            seq.computed = end
