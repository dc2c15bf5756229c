"""One sequence of one model in the paged KV cache: the bridge between the block pool's
bookkeeping and the model's forward pass. Shared by the target and a draft model."""

from __future__ import annotations

from typing import Sequence

import torch

from localchat.engine.torch.blocks import BlockPool
from localchat.engine.torch.model import KVStore, LlamaModel


class PagedSequence:
    def __init__(self, model: LlamaModel, kv: KVStore, pool: BlockPool, seq_id: int,
                 prompt: Sequence[int]) -> None:
        self.model, self.kv, self.pool, self.seq_id = model, kv, pool, seq_id
        self.cached = pool.allocate(seq_id, prompt)  # prompt tokens whose KV is already there
        self.computed = self.cached  # tokens whose KV this sequence holds

    @property
    def tokens(self) -> list[int]:
        return self.pool.tokens(self.seq_id)

    def __len__(self) -> int:
        return self.pool.num_tokens(self.seq_id)

    def forward(self, tokens: list[int], start: int, all_logits: bool = False) -> torch.Tensor:
        """Run `tokens` at positions start.., appending those the pool does not hold yet;
        their KV is written into the sequence's blocks. Logits of the last token, or of
        every token ([T, vocab])."""
        seq, end = self.seq_id, start + len(tokens)
        for token in tokens[len(self) - start:]:
            self.pool.append_token(seq, token)
        logits = self.model.forward(
            torch.tensor(tokens), torch.arange(start, end),
            torch.tensor(self.pool.slot_mapping(seq, start, end)),
            torch.tensor([self.pool.slot(seq, p) for p in range(end)]), self.kv,
            all_logits=all_logits)
        self.computed = end
        return logits

    def keep(self, n: int) -> None:
        """The first n tokens are final: commit them, roll back the rest (no copies)."""
        self.pool.rollback(self.seq_id, len(self) - n)
        self.pool.commit(self.seq_id, n)
        self.computed = min(self.computed, n)

    def free(self) -> None:
        self.pool.free(self.seq_id)  # full committed blocks stay cached for later prompts
