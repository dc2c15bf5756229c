"""Logits of a torch-executor model at every position of a text, as chat runs it."""

from __future__ import annotations

import torch

from localchat.engine.executors.torch.model import Batch, KVStore, LlamaModel


def teacher_forced(model: LlamaModel, tokens: torch.Tensor, n_prompt: int,
                   warm: bool = False) -> torch.Tensor:
    """Logits of every position: the prompt in one pass, then one token a step (the
    decode path), [len(tokens), vocab]. warm: load as an executor does first."""
    c = model.config
    kv = KVStore(c, 256, dtype=torch.float16)
    if warm:
        model.warm_up(kv)
    slots = torch.arange(256)
    rows = [model.forward(tokens[:n_prompt], torch.arange(n_prompt), slots[:n_prompt],
                          slots[:n_prompt], kv, all_logits=True)]
    for p in range(n_prompt, tokens.shape[0]):
        batch = Batch(tokens[p:p + 1], torch.tensor([p]), torch.tensor([p]),
                      [(1, slots[:p + 1], p)], torch.tensor([0]))
        rows.append(model.forward_batch(batch, kv))
    return torch.cat(rows)
