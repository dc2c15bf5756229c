"""Sampling from logits, in llama.cpp's order: repeat penalty, top-k, top-p, min-p,
temperature, then a seeded draw (temperature 0: argmax)."""

from __future__ import annotations

from typing import Sequence

import torch

from localchat.engine.base import SamplingParams

PENALTY_LAST_N = 64  # as llama-cpp-python: the penalty looks at the last 64 sampled tokens


def sample(logits: torch.Tensor, params: SamplingParams, recent: Sequence[int],
           generator: torch.Generator) -> int:
    logits = logits.float().clone()
    if params.repeat_penalty != 1.0 and recent:
        ids = torch.tensor(sorted(set(recent[-PENALTY_LAST_N:])))
        seen = logits[ids]
        logits[ids] = torch.where(seen > 0, seen / params.repeat_penalty,
                                  seen * params.repeat_penalty)
    if params.temperature == 0:
        return int(logits.argmax())
    if 0 < params.top_k < logits.numel():
        values, ids = logits.topk(params.top_k)
    else:
        values, ids = logits.sort(descending=True)
    probs = values.softmax(-1)
    if params.top_p < 1.0:
        keep = (probs.cumsum(-1) - probs) < params.top_p  # keep through the token crossing p
        values, ids, probs = values[keep], ids[keep], probs[keep]
    if params.min_p > 0:
        keep = probs >= params.min_p * probs[0]
        values, ids = values[keep], ids[keep]
    probs = (values / params.temperature).softmax(-1)
    return int(ids[torch.multinomial(probs, 1, generator=generator)])
