"""The executor contract, in one place: what the runtime asks of an executor (forward passes
over a batch of Chunks), the shape of its KV memory (KVLayout) and its Vocabulary. No
scheduling and no sampling happen inside an executor."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from localchat.engine.base import Message, ModelInfo, Tool

BLOCK_SIZE = 16  # tokens per KV block


@dataclass(frozen=True)
class KVLayout:
    """What an executor's KV memory looks like to the block manager."""

    pools: int  # 1 for a shared pool; the number of slots for an exclusive layout
    blocks_per_pool: int
    exclusive: bool  # at most one live sequence per pool
    cache_key: bytes  # model + KV dtype: different caches never share blocks
    prefix_cache: bool = True  # False where the KV cannot be cut back (recurrent state)
    block_size: int = BLOCK_SIZE
    slot_copy: bool = False  # exclusive: the executor can copy one slot's KV into another


class Vocabulary(Protocol):
    def tokenize_messages(self, template: str | None, messages: Sequence[Message],
                          tools: Sequence[Tool] = ()) -> list[int]:
        """Render with the template (and the tools offered) and tokenize, special tokens
        only where trusted."""

    def tokenize_text(self, text: str) -> list[int]:
        """Plain text to tokens, special-token look-alikes left as text."""

    def detokenize(self, token: int) -> bytes:
        """One token's bytes (possibly part of a UTF-8 character); b"" for control tokens."""

    def is_end_of_generation(self, token: int) -> bool: ...

    def constraint_tokenizer(self) -> object:
        """llguidance's LLTokenizer for this vocabulary (constrained decoding)."""

    def close(self) -> None: ...


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
    no_logits: tuple[int, ...] = ()  # of the n_logits rows, these (0 = the first) are not
    # wanted after all (a constraint decides their token): left out of forward's result


class Executor(ABC):
    name: str  # what the UI calls the engine: "llama.cpp", "torch"
    info: ModelInfo
    vocab: Vocabulary
    layout: KVLayout
    supports_rollback: bool = True  # False: cached KV cannot be cut back (recurrent state)

    @abstractmethod
    def forward(self, chunks: Sequence[Chunk]) -> np.ndarray:
        """Run every chunk in one pass; the wanted logits, chunk by chunk, as [R, vocab]
        float32 on the CPU. Called on the compute thread only."""

    def kv_identity(self) -> str | None:
        """What saved KV is valid for beyond the model file's path (its size and mtime, the
        executor, KV types, device); None: this executor cannot save and restore KV exactly."""
        return None

    def save_kv(self, slot: int, block_table: list[int], n_tokens: int) -> memoryview:
        """The KV of positions 0..n_tokens-1 of the sequence in `slot` (its blocks: block_table)
        as bytes (a fresh buffer, no copy) restore_kv() reads back. Compute thread only."""
        raise NotImplementedError

    def restore_kv(self, slot: int, block_table: list[int], start: int, n_tokens: int,
                   data: memoryview, data_tokens: int) -> bool:
        """Make positions start..n_tokens-1 of `slot` (its blocks: block_table) hold the KV
        save_kv() gave as `data` (of data_tokens >= n_tokens positions); False if it refuses
        the data (the slot then holds nothing). Called on the compute thread only."""
        raise NotImplementedError

    def set_threads(self, n: int) -> bool:
        """Run the next forward passes on n CPU threads (the same results, bit for bit);
        False: this executor keeps the count it was loaded with. Compute thread only."""
        return False

    def memory(self) -> dict:
        """The executor's own accounting of its KV cache (for tests and verbose output)."""
        return {}

    def close(self) -> None:
        """Release the model and its memory. Safe to call twice."""
