"""The one Sequence: a request inside the runtime, from admission to its last token."""

from __future__ import annotations

import queue
from dataclasses import dataclass, field

import numpy as np

from localchat.engine.base import SamplingParams

WAITING, RUNNING, FINISHED = "waiting", "running", "finished"


@dataclass(eq=False)
class Sequence:
    """tokens = prompt + completion; the KV of the first `computed` of them is in the
    executor's cache (in the sequence's blocks of pool `slot`, while RUNNING)."""

    seq_id: int
    tokens: list[int]
    n_prompt: int
    params: SamplingParams = field(default_factory=SamplingParams)
    budget: int = 1 << 30  # most tokens to generate
    generator: np.random.Generator | None = None
    arrival: int = 0
    status: str = WAITING
    slot: int = 0  # the block manager's pool (llama.cpp: the KV stream) it lives in
    computed: int = 0
    in_pool: int = 0  # tokens the block pool holds for it (the newest sampled one joins later)
    cached_tokens: int | None = None  # prompt tokens found in the prefix cache, first admission
    preemptions: int = 0
    recomputed_tokens: int = 0  # tokens computed again after preemptions
    lost: int = 0  # KV tokens thrown away by the last preemption
    cancelled: bool = False
    restored_tokens: int = 0  # prompt tokens whose KV came from a snapshot on disk
    restore_s: float = 0.0  # and the seconds that took
    disk_checked: bool = False  # the snapshots were looked up for it (once, at admission)
    kv_note: str = ""  # whether its KV was saved to disk when it finished, and why not
    speculation: object = None  # speculative.Speculation while a draft serves it
    guide: object = None  # guide.Guide: the constraint's matcher, if the request has one
    out: queue.SimpleQueue = field(default_factory=queue.SimpleQueue, repr=False)

    @property
    def completion(self) -> list[int]:
        return self.tokens[self.n_prompt:]

    @property
    def decoding(self) -> bool:
        """Past its prompt: the next step computes one sampled token (and maybe drafts)."""
        return self.computed >= self.n_prompt and self.computed == len(self.tokens) - 1
