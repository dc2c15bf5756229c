"""Sampling from logits, in llama.cpp's order: repeat penalty, top-k, top-p, min-p,
temperature, then a seeded draw (temperature 0: argmax).

probabilities() gives the whole distribution sample() draws from, so speculative
decoding can compare the target's and the draft's distributions under exactly the same
filters (a draft filtered differently from the target would bias the output).
"""

from __future__ import annotations

from typing import Sequence

import torch

from localchat.engine.base import SamplingParams

PENALTY_LAST_N = 64  # as llama-cpp-python: the penalty looks at the last 64 sampled tokens


def penalized(logits: torch.Tensor, params: SamplingParams, recent: Sequence[int]) -> torch.Tensor:
    logits = logits.float()
    if params.repeat_penalty != 1.0 and recent:
        logits = logits.clone()
        ids = torch.tensor(sorted(set(recent[-PENALTY_LAST_N:])))
        seen = logits[ids]
        logits[ids] = torch.where(seen > 0, seen / params.repeat_penalty,
                                  seen * params.repeat_penalty)
    return logits


def probabilities(logits: torch.Tensor, params: SamplingParams,
                  recent: Sequence[int]) -> torch.Tensor:
    """The distribution over the whole vocabulary that sample() draws from ([vocab],
    zero outside the tokens the filters keep; one-hot at temperature 0)."""
    logits = penalized(logits, params, recent)
    if params.temperature == 0:
        out = torch.zeros_like(logits)
        out[logits.argmax()] = 1.0
        return out
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
    out = torch.zeros_like(logits)
    out[ids] = (values / params.temperature).softmax(-1)
    return out


def sample(logits: torch.Tensor, params: SamplingParams, recent: Sequence[int],
           generator: torch.Generator) -> int:
    if params.temperature == 0:
        return int(penalized(logits, params, recent).argmax())
    return draw(probabilities(logits, params, recent), generator)


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=generator))
