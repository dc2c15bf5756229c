"""What the runtime asks of an executor: forward passes over a batch of sequences, and
the shape of its KV memory. No scheduling and no sampling happen inside an executor."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import torch

from localchat.engine.base import ModelInfo
from localchat.engine.runtime.block_manager import KVLayout
from localchat.engine.runtime.vocab import Vocabulary


@dataclass
class Chunk:
    """New tokens of one sequence: they become positions start.. of the sequence in
    `slot`, replacing whatever that slot held at those positions and after them."""

    slot: int
    tokens: list[int]
    start: int
    n_logits: int  # logits wanted for this many of the last tokens (0: none)
    block_table: list[int]  # the sequence's blocks in position order (a shared pool's addresses)
    write_from: int  # positions before this already hold their KV (shared blocks): not written
    n_prompt: int = 0  # positions from here on are generated tokens (an executor may treat
    # them alike however they are batched, so they compute the same bits alone or together)
    copy_from: int | None = None  # first make this slot's KV a copy of that slot's
    # (KVLayout.slot_copy; every copy in a pass happens before any chunk runs)


class Executor(ABC):
    name: str  # what the UI calls the engine: "llama.cpp", "torch"
    info: ModelInfo
    vocab: Vocabulary
    layout: KVLayout
    supports_rollback: bool = True  # False: cached KV cannot be cut back (recurrent state)

    @abstractmethod
    def forward(self, chunks: Sequence[Chunk]) -> torch.Tensor:
        """Run every chunk in one pass; the wanted logits, chunk by chunk, as [R, vocab]
        float32 on the CPU. Called on the compute thread only."""

    def memory(self) -> dict:
        """The executor's own accounting of its KV cache (for tests and --verbose)."""
        return {}

    def close(self) -> None:
        """Release the model and its memory. Safe to call twice."""
