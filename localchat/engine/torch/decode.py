"""The torch engine's decode loop: prefill, then one target pass per step, either for
one token (plain) or to verify a round of draft tokens (speculative).

Plain decoding is the γ = 0 case of the same loop, so there is one path to keep right.
The loop yields token ids (and, for tokens that came from the draft, (id, True)) lazily:
a consumer that stops asking stops the computation.
"""

from __future__ import annotations

import time
from typing import Iterator

import torch

from localchat.engine.base import SamplingParams
from localchat.engine.torch.sampler import penalized, probabilities, sample
from localchat.engine.torch.sequence import PagedSequence
from localchat.engine.torch.speculative import (AdaptiveGamma, DraftStats, accept_drafts,
                                                accept_greedy)


class Speculation:
    """A draft source with its adaptation and statistics, for one generation."""

    def __init__(self, draft, adaptive: AdaptiveGamma, rule: str) -> None:
        self.draft, self.adaptive = draft, adaptive
        self.stats = DraftStats(source=draft.source, rule=rule)
        self.decode_s = 0.0

    def snapshot(self) -> dict:
        s, a = self.stats, self.adaptive
        s.gamma, s.alpha, s.c = a.gamma, a.alpha, a.c
        s.predicted_speedup = a.predicted(max(a.gamma, 1)) if a.target_step_s else 1.0
        if a.target_step_s and self.decode_s > 0 and s.tokens:
            s.measured_speedup = s.tokens / self.decode_s * a.target_step_s
        return s.as_dict()


def _target_choice(logits: torch.Tensor, drafts: list[int], sp: SamplingParams,
                   recent: list[int], q: torch.Tensor | None,
                   generator: torch.Generator) -> tuple[int, int]:
    """Verify drafts against the target's logits at each of their positions."""
    if sp.temperature == 0:
        if sp.repeat_penalty == 1.0:
            argmax = logits.argmax(-1).tolist()
        else:
            argmax = [int(penalized(logits[i], sp, recent + drafts[:i]).argmax())
                      for i in range(len(drafts) + 1)]
        return accept_greedy(argmax, drafts)
    p = torch.stack([probabilities(logits[i], sp, recent + drafts[:i])
                     for i in range(len(drafts) + 1)])
    return accept_drafts(p, q, drafts, generator)


def decode(target: PagedSequence, prompt: list[int], sp: SamplingParams,
           generator: torch.Generator, n_ctx: int,
           speculation: Speculation | None = None) -> Iterator[int | tuple[int, bool]]:
    logits = target.forward(prompt[target.cached:], target.cached)
    target.keep(len(prompt))
    if speculation is not None:
        speculation.draft.begin(target.seq_id, prompt)
    completion: list[int] = []
    token = sample(logits, sp, completion, generator)
    completion.append(token)
    yield token
    try:
        while True:
            position = len(target)  # where the last sampled token goes
            t0 = time.perf_counter()
            drafts, q, draft_s = [], None, 0.0
            if speculation is not None:
                gamma = min(speculation.adaptive.choose(), n_ctx - position - 2)
                if gamma > 0:
                    drafts, q = speculation.draft.propose(target.tokens + [token], gamma, sp,
                                                          completion, generator)
                    draft_s = time.perf_counter() - t0
            if not drafts:
                logits = target.forward([token], position)
                target.keep(position + 1)
                token = sample(logits, sp, completion, generator)
                accepted: list[int] = []
            else:
                logits = target.forward([token] + drafts, position, all_logits=True)
                accepted_n, token = _target_choice(logits, drafts, sp, completion, q, generator)
                accepted = drafts[:accepted_n]
                target.keep(position + 1 + accepted_n)
                speculation.draft.settle(target.tokens + [token])
            if speculation is not None:
                _record(speculation, drafts, accepted, draft_s, t0)
            for d in accepted:
                completion.append(d)
                yield d, True
            completion.append(token)
            yield token
    finally:
        if speculation is not None:
            speculation.draft.end()


def _record(spec: Speculation, drafts: list[int], accepted: list[int], draft_s: float,
            t0: float) -> None:
    elapsed = time.perf_counter() - t0
    spec.decode_s += elapsed
    s = spec.stats
    s.target_passes += 1
    s.tokens += len(accepted) + 1
    if drafts:
        s.proposed += len(drafts)
        s.accepted += len(accepted)
        s.accepted_runs[len(accepted)] += 1
        spec.adaptive.observe_round(len(drafts), len(accepted), draft_s, elapsed - draft_s)
    else:
        spec.adaptive.observe_plain(elapsed)
