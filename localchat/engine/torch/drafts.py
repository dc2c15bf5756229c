"""Where draft tokens come from: a second model with its own paged cache, or the
context itself (prompt lookup, no model).

Both follow the target's sequence: propose(context, γ) drafts γ tokens after `context`
(the target's final tokens, the last one not yet in the target's cache), and settle(n)
says how many tokens of the sequence are now final, so a model draft keeps the KV of
those and rolls back the rest without copies (rolled-back tokens never reach its prefix
cache, which only hashes committed blocks).
"""

from __future__ import annotations

import hashlib
import math
from typing import Sequence

import torch

from localchat.engine.base import SamplingParams
from localchat.engine.torch.blocks import BlockPool
from localchat.engine.torch.model import KVStore, LlamaModel
from localchat.engine.torch.sampler import draw, penalized, probabilities
from localchat.engine.torch.sequence import PagedSequence
from localchat.engine.torch.weights import ModelWeights

BLOCK_SIZE = 16


class ModelDraft:
    """A small or more quantized model of the same vocabulary, one sequence at a time."""

    def __init__(self, weights: ModelWeights, name: str, n_ctx: int, kv_dtype: torch.dtype) -> None:
        self.name = name
        self.model = LlamaModel(weights, max_positions=n_ctx + 64)
        n_blocks = 2 * math.ceil((n_ctx + 64) / BLOCK_SIZE)  # room to keep one chat's prefix
        self.kv = KVStore(weights.config, n_blocks * BLOCK_SIZE, dtype=kv_dtype,
                          device=self.model.device)
        key = hashlib.blake2b(f"draft:{name}:{kv_dtype}".encode()).digest()
        self.pool = BlockPool(n_blocks, BLOCK_SIZE, cache_key=key)
        self.weights_bytes = weights.nbytes()
        self._sequence: PagedSequence | None = None

    @property
    def source(self) -> str:
        return f"model:{self.name}"

    def begin(self, seq: int, prompt: Sequence[int]) -> None:
        self._sequence = PagedSequence(self.model, self.kv, self.pool, seq, prompt)
        self._n_prompt = len(prompt)

    def end(self) -> None:
        if self._sequence is not None:
            self._sequence.free()
            self._sequence = None

    def propose(self, context: list[int], gamma: int, params: SamplingParams,
                recent: list[int], generator: torch.Generator
                ) -> tuple[list[int], torch.Tensor | None]:
        """γ draft tokens after `context`, and their distributions ([γ, vocab]; None at
        temperature 0, where only the tokens matter)."""
        seq = self._sequence
        if seq.computed < self._n_prompt:  # the prompt in one chunk, as the target runs it
            seq.forward(context[seq.computed:self._n_prompt], seq.computed)
        logits = seq.forward(context[seq.computed:], seq.computed)
        drafts: list[int] = []
        dists: list[torch.Tensor] = []
        for i in range(gamma):
            if i:
                logits = seq.forward([drafts[-1]], len(context) + i - 1)
            if params.temperature == 0:
                drafts.append(int(penalized(logits, params, recent + drafts).argmax()))
            else:
                q = probabilities(logits, params, recent + drafts)
                dists.append(q)
                drafts.append(draw(q, generator))
        return drafts, (torch.stack(dists) if dists else None)

    def settle(self, final: list[int]) -> None:
        """`final`: the sequence's tokens that are now certain; keep the KV of the
        longest prefix this draft computed that matches them."""
        seq = self._sequence
        ours = seq.tokens
        keep = min(len(final), seq.computed)
        while keep > 0 and ours[keep - 1] != final[keep - 1]:
            keep -= 1  # the first rejected draft (the target chose another token there)
        seq.keep(keep)


class NgramDraft:
    """Prompt lookup: find the latest earlier occurrence of the context's last few
    tokens and propose what followed it there. Free to run; pays off on replies that
    quote the prompt (code edits, summaries, retrieval)."""

    source = "ngram"

    def __init__(self, max_ngram: int = 3) -> None:
        self.max_ngram = max_ngram

    def begin(self, seq: int, prompt: Sequence[int]) -> None:
        pass

    def end(self) -> None:
        pass

    def propose(self, context: list[int], gamma: int, params: SamplingParams,
                recent: list[int], generator: torch.Generator) -> tuple[list[int], None]:
        n = len(context)
        for size in range(min(self.max_ngram, n - 1), 0, -1):
            tail = context[n - size:]
            for start in range(n - size - 1, -1, -1):
                if context[start:start + size] == tail:
                    follow = context[start + size:start + size + gamma]
                    if follow:
                        return follow, None
        return [], None

    def settle(self, final: list[int]) -> None:
        pass
