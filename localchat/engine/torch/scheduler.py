"""Continuous batching: which sequences run in the next forward pass, and with how many
tokens. Pure bookkeeping over the block pool (no tensors), after vLLM's scheduler and
nano-vllm's scheduler.py.

Each step spends a token budget: running sequences first (one token each when
decoding, the next chunk when a long prompt is still being prefilled), then waiting
requests, admitted in arrival order only when the blocks for their whole prompt fit.
Finished and cancelled sequences give their blocks back at the start of the step, so a
new request can join at once.

When a decoding sequence needs a new block and none is left, the sequence with the
least computed work is preempted by recompute: its blocks are freed (full committed
ones stay in the prefix cache, so it often gets them back as a hit), and it goes to the
head of the waiting queue with every token it had, to be prefilled again later. A step
that preempted admits nothing new, so a freed block is not handed straight to a
newcomer while a preempted request waits.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field

from localchat.engine.torch.blocks import BlockPool

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


@dataclass(eq=False)
class SequenceState:
    """One request inside the batcher. tokens = prompt + completion; the KV of the first
    `computed` of them is in the cache (of the sequence's blocks, while RUNNING)."""

    seq_id: int
    tokens: list[int]
    n_prompt: int
    arrival: int = 0
    status: str = WAITING
    computed: int = 0
    in_pool: int = 0  # tokens the block pool holds for it (the newest sampled one joins later)
    cached_tokens: int | None = None  # prompt tokens found in the prefix cache, first admission
    preemptions: int = 0
    recomputed_tokens: int = 0  # tokens computed again after preemptions
    _lost: int = 0  # KV tokens thrown away by the last preemption
    cancelled: bool = False
    payload: object = field(default=None, repr=False)  # the runner's per-request state

    @property
    def completion(self) -> list[int]:
        return self.tokens[self.n_prompt:]


@dataclass(frozen=True)
class ScheduledChunk:
    seq: SequenceState
    start: int  # first position computed this step
    end: int  # one past the last; the sequence samples next when end == len(tokens)

    @property
    def samples(self) -> bool:
        return self.end == len(self.seq.tokens)


class Scheduler:
    def __init__(self, pool: BlockPool, max_tokens_per_step: int = 512,
                 max_running: int = 64) -> None:
        self.pool = pool
        self.max_tokens_per_step = max_tokens_per_step
        self.max_running = max_running
        self.waiting: deque[SequenceState] = deque()
        self.running: list[SequenceState] = []
        self.preemptions = 0
        self.recomputed_tokens = 0
        self._arrivals = itertools.count()

    def add(self, seq: SequenceState) -> None:
        seq.arrival = next(self._arrivals)
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: SequenceState) -> None:
        """A finished or cancelled sequence leaves now and gives its blocks back."""
        if seq.status == RUNNING:
            self.pool.free(seq.seq_id)
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
                self.pool.append_token(seq.seq_id, seq.tokens[-1])
                seq.in_pool += 1
            n = min(budget, len(seq.tokens) - seq.computed)
            chunks[seq.seq_id] = ScheduledChunk(seq, seq.computed, seq.computed + n)
            budget -= n
        if not preempted:
            budget = self._admit(budget, chunks)
        return list(chunks.values())

    def _make_room(self, seq: SequenceState,
                   chunks: dict[int, ScheduledChunk]) -> tuple[bool, bool]:
        """Preempt until seq can take one more token: (seq still runs, anyone preempted)."""
        preempted = False
        while not self.pool.can_append(seq.seq_id):
            others = [s for s in self.running if s is not seq]
            if not others:
                self._preempt(seq)
                return False, True
            victim = min(others, key=lambda s: (s.computed, -s.arrival))
            chunks.pop(victim.seq_id, None)
            self._preempt(victim)
            preempted = True
        return True, preempted

    def _preempt(self, seq: SequenceState) -> None:
        self.pool.free(seq.seq_id)
        self.running.remove(seq)
        seq._lost = seq.computed
        seq.computed = seq.in_pool = 0
        seq.status = WAITING
        seq.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(seq)  # keeps its place: first in line once blocks free up

    def _admit(self, budget: int, chunks: dict[int, ScheduledChunk]) -> int:
        while self.waiting and budget > 0 and len(self.running) < self.max_running:
            seq = self.waiting[0]
            if not self._fits(seq):
                break  # in order: a large request is not overtaken forever by small ones
            cached = self.pool.allocate(seq.seq_id, seq.tokens)
            self.waiting.popleft()
            if seq.cached_tokens is None:
                seq.cached_tokens = min(cached, seq.n_prompt)
            recomputed = max(0, seq._lost - cached)
            seq.recomputed_tokens += recomputed
            self.recomputed_tokens += recomputed
            seq._lost = 0
            seq.computed, seq.in_pool, seq.status = cached, len(seq.tokens), RUNNING
            self.running.append(seq)
            n = min(budget, len(seq.tokens) - cached)
            chunks[seq.seq_id] = ScheduledChunk(seq, cached, cached + n)
            budget -= n
        return budget

    def _fits(self, seq: SequenceState) -> bool:
        """Whether the pool can hold the whole prompt now (prefix-cache hits need no new
        block), keeping one block of headroom per running sequence so an admission does
        not force a preemption on the very next step."""
        new, available = self.pool.blocks_needed(seq.tokens)
        return new + len(self.running) <= available or (not self.running and new <= available)

    def after_step(self, chunks: list[ScheduledChunk]) -> None:
        """The chunks' KV is written: commit it (full blocks join the prefix cache)."""
        for chunk in chunks:
            seq = chunk.seq
            if seq.status != RUNNING:
                continue
            self.pool.commit(seq.seq_id, chunk.end)
            seq.computed = chunk.end
